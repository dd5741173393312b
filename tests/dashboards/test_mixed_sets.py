"""The mixed-set case on a real sweep: one (model, loops) run again on fewer tasks and items is a second
evaluation set, shown by default and named, and never merged with the first sweep's point."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import create_engine, text

from dashboards import figures
from analysis.points import accuracy_points
from dashboards.report import build_report
from db import queries
from db.session import open_existing
from harness.cli import main
import measures

pytestmark = pytest.mark.slow  # needs the real sweep of conftest.py


def _sql(url: str, statement: str) -> list[tuple]:
    with create_engine(url).connect() as conn:
        return conn.execute(text(statement)).all()


def test_a_run_on_other_tasks_is_a_second_set_never_a_merged_point(
    two_sets_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ((first, again),) = _sql(
        two_sets_url, "SELECT MIN(id), MAX(id) FROM runs WHERE model_spec = 'zoo:ouro-tiny' AND loops = 2"
    )
    engine = open_existing(two_sets_url)
    sets = queries.eval_sets(engine)
    assert len(sets) == 2 and sets["runs"].iloc[0] == 1 and sets["last_run_id"].iloc[0] == again
    latest, older = sets["set_id"]
    assert "chain2 · first 1 per task" in sets["set_label"].iloc[0]
    assert "addition, chain2, lookup · first 2 per task" in sets["set_label"].iloc[1]

    default = accuracy_points(engine, None)
    assert default[["model", "loops", "run_id"]].values.tolist() == [["zoo:ouro-tiny", 2, again]]
    previous = accuracy_points(engine, older)
    ouro = previous[(previous["model"] == "zoo:ouro-tiny") & (previous["loops"] == 2)]
    assert ouro["run_id"].tolist() == [first], "the first sweep keeps its own point"
    per_task = [
        v for (v,) in _sql(two_sets_url, f"SELECT value FROM task_metrics WHERE run_id = {first} AND task != 'all'")
    ]
    assert ouro["accuracy"].iloc[0] == pytest.approx(sum(per_task) / len(per_task))
    (stored_pairs,) = _sql(two_sets_url, f"SELECT COUNT(*) FROM runs WHERE kind = 'eval' AND id != {again}")
    assert len(previous) == stored_pairs[0], "one point per (model, loops) of the first sweep"

    fig = figures.accuracy_vs_memory(default, "kv_bytes_allocated")
    assert f"set {latest}:" in fig.layout.title.text
    html = build_report(engine)
    options = re.search(r'<select id="set">(.*?)</select>', html).group(1)
    assert re.findall(r'<option value="(\w+)"', options) == [latest, older]  # the latest is first, so the default
    blobs = json.loads(re.search(r'<script id="figures" type="application/json">(.*?)</script>', html).group(1))
    assert {key.split("|")[1] for key in blobs if key.startswith("acc|")} == {latest, older}
    engine.dispose()

    assert main(["results", "--db", two_sets_url]) == 0
    out = capsys.readouterr().out
    assert f"set {latest}:" in out.splitlines()[0] and f"set {older}:" in out.split("other evaluation sets")[1]
    assert sum(line.startswith("│") for line in out.splitlines()) == 2, (
        "one row in each table: the ranking, what a token cost"
    )


def test_the_app_offers_the_selected_sets_models_loops_and_measures_only(two_sets_url: str) -> None:
    """The latest set holds one (model, loops); the older one the whole sweep. The filters follow the set, and the
    memory measures offered are those its runs have: on this CPU machine no NVML or torch measure."""
    from dashboards.app import set_choices

    engine = open_existing(two_sets_url)
    latest, older = queries.eval_sets(engine)["set_id"]
    models, checked, loops, _, options, measure = set_choices(engine, latest, "nvml_process")
    assert models == checked == ["zoo:ouro-tiny"] and loops == [2]
    offered = [option["value"] for option in options]
    assert offered and not {"nvml_process", "torch_allocated"} & set(offered) and measure == offered[0]
    everything = accuracy_points(engine, older)
    assert offered == [m for m in measures.MEMORY_MEASURES if m in everything and everything[m].notna().any()]
    models, _, loops, _, _, kept = set_choices(engine, older, "rss")
    assert models == sorted(everything["model"].unique()) and len(models) > 1 and kept == "rss"
    assert loops == sorted(int(r) for r in everything["loops"].unique())
    engine.dispose()
