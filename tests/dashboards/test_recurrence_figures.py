"""Depth extrapolation and loop probe figures on a real SQLite store: task-group means, the trained T marked,
probe values (NULL kept undefined) and both in the static report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dashboards import trace_figures
from dashboards.data import depth_points, probe_title
from dashboards.report import build_report
from db import queries
from db.headline import headline
from db.session import open_existing
from db.store import Store

PASS = "pass@k:k=1&n=1"
# r -> pass@1 of each synthetic task: arithmetic improves to T = 2 then falls; recall (lookup) falls at once
SCORES = {
    1: {"addition": 0.2, "chain2": 0.4, "lookup": 0.8},
    2: {"addition": 0.6, "chain2": 0.8, "lookup": 0.6},
    3: {"addition": 0.4, "chain2": 0.6, "lookup": 0.2},
}


@pytest.fixture()
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    store = Store.open(url)
    for r, scores in SCORES.items():
        run = store.create_run(
            sweep_id="s",
            model_spec="zoo:<b>m</b>",
            adapter="zoo",
            suite="synthetic",
            loops=r,
            model_config={"trained_loops": 2},
        )
        store.set_metrics(run, {task: {PASS: (value, None)} for task, value in scores.items()})
        store.finish_run(run, "finished")
    probe = store.create_run(
        sweep_id="p",
        kind="probe",
        model_spec="zoo:<b>m</b>",
        adapter="zoo",
        suite="synthetic",
        loops=3,
        model_config={"trained_loops": 2},
    )
    store.add_probe_values(
        probe,
        [{"loop": l, "metric": "relative_update", "lag": None, "value": 1 / l} for l in (1, 2, 3)]
        + [
            {"loop": 3, "metric": "interaction", "lag": 1, "value": 0.5},
            {"loop": 3, "metric": "interaction", "lag": 2, "value": math.nan},
        ],
    )
    store.finish_run(probe, "finished")
    store.close()
    return url


def test_headline_splits_task_groups() -> None:
    result = headline({task: {PASS: value} for task, value in SCORES[3].items()}, "synthetic")
    assert result.groups == {"arithmetic": pytest.approx(0.5), "recall": pytest.approx(0.2)}
    assert result.mean == pytest.approx((0.4 + 0.6 + 0.2) / 3)
    paper = headline(
        {"aime24": {PASS: 1.0}, "mmlu_redux:anatomy": {PASS: 0.0}, "mmlu_redux:virology": {PASS: 0.5}}, "paper"
    )
    assert paper.groups == {"maths/reasoning": 1.0, "knowledge": 0.25}  # MMLU-Redux counts once, as its subjects' mean
    depth = headline(
        {"chain3": {PASS: 0.9}, "c30k4": {PASS: 1.0}, "c30k8": {PASS: 0.5}, "r110k4": {PASS: 0.0}}, "synthetic"
    )
    assert depth.groups == {"arithmetic": 0.9, "automata": 0.5}  # the chains apart from the depth tasks
    assert headline({"c30k4x": {PASS: 1.0}}, "synthetic").groups == {"c30k4x": 1.0}  # no automaton: a group of its own
    assert headline({"x": {PASS: 1.0}}).groups == {}


def test_depth_points_give_each_group_against_r_with_the_trained_t(db: str) -> None:
    engine = open_existing(db)
    points = depth_points(engine, queries.latest_set(engine))
    by = {(row.group, row.loops): row.accuracy for row in points.itertuples()}
    assert by[("arithmetic", 2)] == pytest.approx(0.7) and by[("recall", 3)] == pytest.approx(0.2)
    assert by[("all", 1)] == pytest.approx((0.2 + 0.4 + 0.8) / 3)
    assert set(points["trained_loops"]) == {2.0}
    fig = trace_figures.accuracy_vs_depth(points)
    assert [a.text for a in fig.layout.annotations] == [
        "all",
        "arithmetic",
        "recall",
    ]  # one panel per group, "all" first
    assert {shape.x0 for shape in fig.layout.shapes} == {2.0} and len(fig.layout.shapes) == 3  # T on every panel
    assert all("<b>" not in trace.name for trace in fig.data)  # stored model names are escaped
    engine.dispose()


def test_probe_values_keep_undefined_as_nan_and_draw_a_panel_per_metric(db: str) -> None:
    engine = open_existing(db)
    values = queries.probe_values(engine)
    interaction = values[values["metric"] == "interaction"].set_index("lag")["value"]
    assert interaction[1] == 0.5 and math.isnan(interaction[2])
    fig = trace_figures.loop_probes(values, probe_title(values))
    assert [a.text for a in fig.layout.annotations] == ["relative update norm", "interaction (by lag k)"]
    assert {shape.x0 for shape in fig.layout.shapes} == {2.0}
    assert "&lt;b&gt;" in fig.layout.title.text and "r = 1..3" in fig.layout.title.text
    report = build_report(engine)
    assert "Loop probes" in report and f'"depth|{queries.latest_set(engine)}"' in report
    assert (
        "probe run 4: zoo:&lt;b&gt;m&lt;/b&gt; on synthetic, r = 1..3</option>" in report
    )  # the selector names all loops
    engine.dispose()


def test_the_depth_figure_opens_on_the_widest_sweep_of_r_while_the_others_open_on_the_newest_set(db: str) -> None:
    store = Store.open(db)
    headline_run = store.create_run(
        sweep_id="h",
        model_spec="zoo:m",
        adapter="zoo",
        suite="synthetic",
        loops=2,
        limit=5,
        model_config={"trained_loops": 2},
    )  # newer, one r: another set
    store.set_metrics(headline_run, {"chain2": {PASS: (1.0, None)}})
    store.finish_run(headline_run, "finished")
    store.close()
    engine = open_existing(db)
    newest, sweep = queries.eval_sets(engine)["set_id"]
    assert queries.latest_set(engine) == newest and queries.depth_set(engine) == sweep
    report = build_report(engine)
    depth_options = report.split('<select id="depth-set">')[1].split("</select>")[0]
    assert f'<option value="{sweep}" selected>' in depth_options and f'<option value="{newest}">' in depth_options
    assert (
        f'<option value="{newest}">' in report.split('<select id="set">')[1].split("</select>")[0]
    )  # first: the default
    engine.dispose()
