"""The live view of a job: the whole job, the sweep and run running now, its ETA; a finished run leaves one line.

A real job of two sweeps (two seeds, a looped zoo model at two loop counts, one doc per task) runs
through the real runner and bridge onto `JobProgress`, drawn on an 80 x 25 terminal. At every line the
runner prints and every bar the bridge adds, the view is checked: a few lines tall, naming the current
run, counting the job's runs; each finished run leaves exactly one line. `loopeval probe` shows its
loops as they run.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from db.store import Store
from harness.cli import main
from harness.progress import JobProgress, eta_text
from db.record import PlannedRun
from harness.execution.bars import RunBars
from harness.execution.recorder import new_sweep_id
from harness.execution.runner import run_sweep
from harness.planning.plan import prepare_sweep
from harness.planning.spec import RunSpec


def _frame(view: JobProgress) -> list[str]:
    """The live view as an 80-column terminal shows it now, line by line."""
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(view.get_renderable())
    return console.file.getvalue().rstrip("\n").split("\n")


def test_the_eta_follows_the_runs_finished() -> None:
    assert eta_text(0, 0, 10) == "ETA after 1 run"
    assert eta_text(60, 2, 4) == "ETA 0:02:00"  # 30 s a run, 4 left
    assert eta_text(3700, 1, 1) == "ETA 1:01:40"
    assert eta_text(99, 5, 0) == "done"


class Watched(JobProgress):
    """JobProgress that checks the view each time a bar is added (the bridge's bars included)."""

    def __init__(self, console: Console) -> None:
        super().__init__(console=console)
        self.views: list[list[str]] = []

    def add_task(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        task_id = super().add_task(*args, **kwargs)
        self.views.append([task.description for task in self.tasks])
        return task_id


def test_a_job_shows_the_present_and_each_finished_run_leaves_one_line(tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=80, height=25, force_terminal=True, color_system=None)
    view = Watched(console)
    lines: list[str] = []
    etas: list[str] = []

    frames: list[list[str]] = []

    def log(line: str) -> None:
        lines.append(line)
        view.views.append([task.description for task in view.tasks])
        etas.append(view.tasks[0].fields["remaining"])  # as the run ends: the ETA from the runs before it
        frames.append(_frame(view))

    specs = [
        RunSpec.build(
            models=["zoo:ouro-tiny"],
            loops=[1, 2],
            tasks=["chain2", "c30k2"],
            limit=1,
            samples=1,
            seed=seed,
            db_url=str(tmp_path / "r.sqlite"),
        )
        for seed in (0, 1)
    ]
    plans = [prepare_sweep(spec) for spec in specs]
    store = Store.open(str(tmp_path / "r.sqlite"))
    sweep_id = new_sweep_id()
    with view:
        view.start_job(4, 2)
        for spec, plan in zip(specs, plans):
            assert [o.status for o in run_sweep(spec, plan, store, progress=view, log=log, sweep_id=sweep_id)] == [
                "finished"
            ] * 2
    store.close()

    finished = [line for line in lines if re.match(r"run \d+ zoo:ouro-tiny r=[12]: finished in [\d.]+ s \(", line)]
    assert len(finished) == len(lines) == 4, lines  # one line per run, nothing else
    assert all(len(line) <= 80 for line in lines), "a finished run's line fits an 80-column terminal"
    generating = [view for view in view.views if any(d.endswith("generating") for d in view)]
    assert generating, "the bridge drew the current run's bar in the view"
    for shown in view.views:
        assert len(shown) <= 3, (
            shown
        )  # the job, the sweep with its current run, that run's bar: never a pile of old bars
        assert shown[0] == "job: 2 sweeps"
    assert any(d == "sweep 2/2: run 4 zoo:ouro-tiny r=2" for shown in view.views for d in shown)
    job = view.tasks[0]
    assert (job.completed, job.total, job.fields["remaining"]) == (4, 4, "done")
    assert [task.description.split(":")[0] for task in view.tasks] == ["job", "sweep 2/2"]
    assert etas[0] == "ETA after 1 run" and all(re.fullmatch(r"ETA \d:\d\d:\d\d", eta) for eta in etas[1:])
    for frame in frames:  # as drawn on 80 columns: one line per bar, nothing wrapped
        assert len(frame) <= 3 and frame[0].startswith("job: 2 sweeps")
    assert (
        frames[-1][1].startswith("sweep 2/2: run 4 zoo:ouro-tiny r=2") and "zoo:ouro-tiny: generating" in frames[-1][2]
    )
    assert re.search(r"4/4 +0:00:\d\d done$", _frame(view)[0])


def test_probe_shows_each_loop_as_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """zoo:ouro-tiny at r = 3 on 2 texts: per text one pass of 3 loops, then one pass per skipped loop (loops 1 and 2)
    that runs the other 2: 2 x (3 + 2 x 2) = 14 loops, each counted as it runs."""
    monkeypatch.setenv("COLUMNS", "120")
    assert (
        main(
            [
                "probe",
                "zoo:ouro-tiny",
                "--loops",
                "3",
                "--tasks",
                "chain2",
                "--limit",
                "2",
                "--positions",
                "8",
                "--no-store",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert re.search(r"probe zoo:ouro-tiny r=3, 2 texts: loops run\s.*\s14/14\s", out), out


def test_runs_side_by_side_count_on_the_job_line_with_a_bar_each_while_they_run() -> None:
    """Worker processes and Ray tasks run several runs at once; the view draws them from the store (`RunBars`)."""
    view = JobProgress(console=Console(file=io.StringIO(), width=80, color_system=None))
    bars = RunBars(
        view, [PlannedRun("zoo:ouro-tiny", 2, "synthetic", (), {}, 0, id=run_id) for run_id in (1, 2, 3)], sweeps=2
    )
    bars.update({1: ("running", 3), 2: ("running", 0), 3: ("queued", 0)})
    assert [t.description for t in view.tasks] == [
        "job: 2 sweeps",
        "run 1 zoo:ouro-tiny r=2: running",
        "run 2 zoo:ouro-tiny r=2: running",
    ]
    frame = _frame(view)
    assert "3 done" in frame[1] and "/?" not in "".join(frame), frame  # samples stored, the total not known
    bars.update({1: ("finished", 8), 2: ("running", 5), 3: ("running", 1)})
    bars.update({1: ("finished", 8), 2: ("running", 6), 3: ("running", 2)})  # an ended run is counted once
    job = view.tasks[0]
    assert [t.description for t in view.tasks[1:]] == [
        "run 2 zoo:ouro-tiny r=2: running",
        "run 3 zoo:ouro-tiny r=2: running",
    ]
    assert (job.completed, job.total) == (1, 3) and re.fullmatch(r"ETA \d:\d\d:\d\d", job.fields["remaining"])
    bars.update({1: ("finished", 8), 2: ("interrupted", 6), 3: ("finished", 8)})
    assert [t.description for t in view.tasks] == ["job: 2 sweeps"]
    assert view.tasks[0].completed == 2  # an interrupted run is not done: the job never reads 3/3 after Ctrl-C


def test_per_run_lines_stay_whole_when_output_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output to a file or a pipe (no terminal, no $COLUMNS): the threads line and each run's line are one line each,
    however long, where rich would have broken them at its default 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    db = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    assert (
        main(
            [
                "run",
                "--model",
                "zoo:ouro-tiny",
                "--loops",
                "1,2",
                "--tasks",
                "chain2",
                "--limit",
                "1",
                "--samples",
                "1",
                "--no-report",
                "--db",
                db,
            ]
        )
        == 0
    )  # the threads line says why it chose its count: over 80 columns
    lines = capsys.readouterr().out.splitlines()
    threads = [line for line in lines if line.startswith("threads: ")]
    # no live view to read the count from: each finished run's line starts with it and the job's time so far
    runs = [line for line in lines if re.match(r"[12]/2 \d:\d\d:\d\d run \d+ zoo:ouro-tiny r=\d: finished in ", line)]
    assert [line.split("/")[0] for line in runs] == ["1", "2"], lines
    assert len(threads) == 1 and len(runs) == 2, lines
    assert max(map(len, threads + runs)) > 80, "a line long enough that rich would have broken it"
    assert all(line.endswith(")") for line in threads + runs), lines  # each ends where it says its last figure
