"""Accuracy per kJ beside accuracy per GB, in `loopeval results` and the report's compute view: on real SQLite files
whose runs store NVML energy as the recorder stores it (`Store.update_run`), and on one from a CPU, where there is no
counter and pass@1 per kJ reads "not measured (no NVML)", never 0."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.points import accuracy_points
from dashboards import cost_figures, views
from db.store import Store
from harness.cli import main
from tests.support.rich_tables import body_rows
from tests.support.stored_runs import MODEL, store_run

MELT = "zoo:melt-tiny"


def _store(path: Path, joules: dict[str, float | None]) -> str:
    """ouro-tiny r=4 (0.75, 3 MB) and melt-tiny r=4 (0.25, 2.1 MB), each run's energy `joules[model]`."""
    store = Store.open(str(path))
    for model, scores, kv in ((MODEL, [1.0, 1.0, 1.0, 0.0], 1_000_000), (MELT, [1.0, 0.0, 0.0, 0.0], 100_000)):
        run_id = store_run(store, scores, model=model, kv=kv)
        store.update_run(run_id, wall_seconds=3.0, generate_seconds=2.0, energy_joules=joules[model])
    store.close()
    return str(path)


def _results(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["results", *args]) == 0
    return capsys.readouterr().out


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_pass_at_1_per_kj_stands_beside_pass_at_1_per_gb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _store(tmp_path / "gpu.sqlite", {MODEL: 1500.0, MELT: 250.0})
    out = _results(capsys, "--db", db)
    ranking, compute = body_rows(out)
    # model; memory, pass@1/GB, pass@1/kJ (0.75 / 1.5 kJ, 0.25 / 0.25 kJ); energy a run
    assert [[row[1], *row[4:7]] for row in ranking] == [[MODEL, "3 MB", "250", "0.5"], [MELT, "2.1 MB", "119", "1"]]
    assert [[row[1], row[-1]] for row in compute] == [[MODEL, "1.5 kJ"], [MELT, "250 J"]]
    assert "pass@1/kJ: pass@1 per kJ of the GPU energy one of the row's runs drew" in _flat(out)
    assert _flat(out).endswith(
        "250 pass@1 per GB, 0.5 per kJ; the frontier: zoo:melt-tiny r=4 (0.250 at 2.1 MB) → "
        "zoo:ouro-tiny r=4 (0.750 at 3 MB); by KV cache peak alone, zoo:melt-tiny r=4 would "
        "rank first."
    )
    ranked = body_rows(_results(capsys, "--db", db, "--rank", "per-kj"))[0]
    assert [row[1] for row in ranked] == [MELT, MODEL], "ranked by pass@1 per kJ, best first"
    runs = json.loads(_results(capsys, "--db", db, "--json"))
    assert [(r["energy_joules"], r["pass_at_1_per_kj"]) for r in runs] == [(1500.0, 0.5), (250.0, 1.0)]


def test_without_a_counter_per_kj_says_not_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cpu = _results(capsys, "--db", _store(tmp_path / "cpu.sqlite", {MODEL: None, MELT: None}))
    assert "pass@1/kJ" not in cpu and "energy/run" not in cpu, "no column of unknowns"
    assert "pass@1 per kJ of GPU energy: not measured (no NVML)." in _flat(cpu)
    assert "per kJ;" not in _flat(cpu) and " 0 per kJ" not in _flat(cpu)
    runs = json.loads(_results(capsys, "--db", str(tmp_path / "cpu.sqlite"), "--json"))
    assert [(r["energy_joules"], r["pass_at_1_per_kj"]) for r in runs] == [(None, None), (None, None)], "null, never 0"
    mixed = body_rows(_results(capsys, "--db", _store(tmp_path / "mixed.sqlite", {MODEL: 1500.0, MELT: None})))[0]
    assert [row[6] for row in mixed] == ["0.5", "not measured"]


def test_the_report_draws_accuracy_against_energy_or_says_it_was_not_measured(tmp_path: Path) -> None:
    store = Store.open(_store(tmp_path / "gpu.sqlite", {MODEL: 1500.0, MELT: 250.0}))
    points = accuracy_points(store.engine, None)
    fig = cost_figures.accuracy_vs_energy(points)
    drawn = {trace.name: (list(trace.x), list(trace.y), list(trace.customdata[:, 2])) for trace in fig.data}
    assert drawn == {MODEL: ([1.5], [0.75], ["0.5"]), MELT: ([0.25], [0.25], ["1"])}, "kJ a run, pass@1, pass@1 per kJ"
    assert any(plot.id == "accuracy-energy" for plot in views.COMPUTE.plots), "both pages draw it"
    store.close()
    store = Store.open(_store(tmp_path / "cpu.sqlite", {MODEL: None, MELT: None}))
    empty = cost_figures.accuracy_vs_energy(accuracy_points(store.engine, None))
    store.close()
    assert not empty.data and "not measured (no NVML)" in empty.layout.annotations[0].text


def test_a_run_of_0_joules_is_not_measured_not_infinitely_efficient(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A counter that did not advance over a run (0 J) measured nothing: pass@1 per kJ is not infinite, the run does
    not rank first by it, and the report draws the others."""
    db = _store(tmp_path / "zero.sqlite", {MODEL: 0.0, MELT: 250.0})
    ranked = body_rows(_results(capsys, "--db", db, "--rank", "per-kj"))[0]
    assert [[row[1], row[6]] for row in ranked] == [[MELT, "1"], [MODEL, "not measured"]]
    runs = json.loads(_results(capsys, "--db", db, "--json"))
    assert [(r["energy_joules"], r["pass_at_1_per_kj"]) for r in runs] == [(0.0, None), (250.0, 1.0)], "as stored"
    report = tmp_path / "report.html"
    assert main(["dashboard", "--db", db, "--out", str(report)]) == 0
    assert "inf" not in _flat(capsys.readouterr().out) and report.stat().st_size > 0
    store = Store.open(db)
    drawn = cost_figures.accuracy_vs_energy(accuracy_points(store.engine, None))
    store.close()
    assert [trace.name for trace in drawn.data] == [MELT], "0 J drawn nowhere, never at x = 0"
