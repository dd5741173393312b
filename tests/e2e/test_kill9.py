"""kill -9 at five points of a run, and in the middle of a sweep: after `--resume`, every sample is
stored exactly once, every run of the sweep is finished, the memory peaks are real and the memory
trace covers both the killed stretch and the resumed one. Two processes never run one run at once."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from tests.support.sqlite import query

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') skips it

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
PLUGINS = Path(__file__).parents[1] / "harness" / "plugins"
BATCHES = 8  # 2 tasks x 8 docs, 2 prompts per generate call
RUN = [
    "run",
    "--model",
    "killer:ouro-tiny",
    "--tasks",
    "addition,chain2",
    "--limit",
    "8",
    "--samples",
    "1",
    "--max-new-tokens",
    "4",
    "--batch-size",
    "2",
    "--no-report",
]


def _env(kill_at: str = "") -> dict[str, str]:
    env = {**os.environ, "LOOPEVAL_ADAPTERS": str(PLUGINS), "LOOPEVAL_KILL_BATCHES": str(BATCHES)}
    env.pop("LOOPEVAL_KILL_AT", None)
    return env | ({"LOOPEVAL_KILL_AT": kill_at} if kill_at else {})


def _loopeval(args: list[str], kill_at: str = "", tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`loopeval ARGS` in a process of its own, killed at `kill_at`, its temporary files under `tmp` when given."""
    env = _env(kill_at) | ({"TMPDIR": str(tmp)} if tmp else {})
    return subprocess.run([LOOPEVAL, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(autouse=True)
def _plugins_here(monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    """The killed process must be one of its own; the resume may be this one (the evaluation stack imported
    once, not once per test), with the test plugins (`_resume` names their folder) and no kill armed."""
    monkeypatch.setenv("LOOPEVAL_KILL_BATCHES", str(BATCHES))
    monkeypatch.delenv("LOOPEVAL_KILL_AT", raising=False)


def _resume(run_id: int, db: Path) -> int:
    """`loopeval run --resume RUN_ID` in this process; its exit code."""
    return main(["run", "--resume", str(run_id), "--adapters-dir", str(PLUGINS), "--db", str(db), "--no-report"])


def _samples(db: Path) -> int:
    """Samples committed so far (0 while the database or its schema does not exist yet)."""
    try:
        return query(db, "SELECT COUNT(*) FROM samples")[0][0] if db.exists() else 0
    except sqlite3.OperationalError:
        return 0


def _check_completed(db: Path, walls_before: dict[int, float | None], killed_stretch_traced: bool) -> None:
    """Every run finished, every sample once, peaks real, traces on both sides of the kill."""
    runs = query(db, "SELECT id, status, wall_seconds FROM runs ORDER BY id")
    assert [status for _, status, _ in runs] == ["finished"] * len(runs)
    for run_id, _, wall in runs:
        keys = query(db, f"SELECT task, doc_id, sample_index FROM samples WHERE run_id = {run_id}")
        assert len(keys) == 16 and len(set(keys)) == 16, f"run {run_id}: every sample exactly once"
        peaks = dict(query(db, f"SELECT measure, value FROM memory_peaks WHERE run_id = {run_id}"))
        assert peaks["kv_bytes_allocated"] > 0 and peaks["rss"] > 0 and peaks["weights_bytes"] > 0
        ts = [t for (t,) in query(db, f"SELECT t FROM memory_samples WHERE run_id = {run_id} ORDER BY t")]
        before = walls_before.get(run_id) or 0.0
        assert ts and ts[-1] > before, f"run {run_id}: the trace covers the resumed stretch"
        assert wall >= before
        if killed_stretch_traced and before:
            assert ts[0] <= before, f"run {run_id}: the killed stretch's trace survived"


@pytest.mark.parametrize(
    "kill_at",
    ["load", "generate:3", "generate:5", f"generate:{BATCHES}", "scoring"],
    ids=["load", "early", "mid", "late", "scoring"],
)
def test_kill9_then_resume_loses_and_duplicates_nothing(kill_at: str, tmp_path: Path) -> None:
    db, scratch = tmp_path / "r.sqlite", tmp_path / "tmp"
    scratch.mkdir()
    killed = _loopeval([*RUN, "--loops", "2", "--db", str(db)], kill_at, tmp=scratch)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not list(scratch.glob("loopeval*")), "a killed run leaves no temporary folder of its own behind"
    ((run_id, status, wall, owner),) = query(db, "SELECT id, status, wall_seconds, lease_owner FROM runs")
    assert status in ("queued", "running") and owner, "a killed run keeps its state and its dead holder's lease"
    stored = query(db, "SELECT COUNT(*) FROM samples")[0][0]
    if kill_at not in ("load",):
        assert wall is not None and wall > 0, "timings were written while the run went"
        assert (
            query(db, f"SELECT value FROM memory_peaks WHERE run_id = {run_id} AND measure = 'kv_bytes_allocated'")[0][
                0
            ]
            > 0
        )
    assert _resume(run_id, db) == 0
    assert query(db, "SELECT COUNT(*) FROM samples")[0][0] == 16 >= stored
    _check_completed(db, {run_id: wall}, killed_stretch_traced=kill_at != "load")


def test_a_killed_sweep_is_completed_by_resuming_any_of_its_runs(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    killed = _loopeval([*RUN, "--loops", "2,4", "--db", str(db)], "generate:5")
    assert killed.returncode == -signal.SIGKILL
    runs = query(db, "SELECT id, loops, status, wall_seconds FROM runs ORDER BY id")
    assert [(loops, status) for _, loops, status, _ in runs] == [(2, "running"), (4, "queued")], "stored whole up front"
    assert _resume(runs[1][0], db) == 0
    _check_completed(db, {run_id: wall for run_id, _, _, wall in runs}, killed_stretch_traced=True)
    assert _resume(runs[0][0], db) == 2


def test_a_run_in_progress_cannot_be_resumed_by_a_second_process(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    first = subprocess.Popen(
        [LOOPEVAL, *RUN, "--loops", "2", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and _samples(db) < 2:
        time.sleep(0.2)
    assert first.poll() is None, first.communicate()
    capfd.readouterr()
    assert _resume(1, db) == 2  # this test's process is the second one
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "is being run by" in lines[0], err
    assert first.wait(timeout=300) == 0
    _check_completed(db, {}, killed_stretch_traced=False)


def test_two_resumes_of_one_sweep_at_once_both_end_0(tmp_path: Path) -> None:
    """The first resume takes run 1; the second (of run 2, so not refused) finds a run the first holds, runs the
    other and waits for it. The sweep is done by the two together: both end 0."""
    db = tmp_path / "r.sqlite"
    killed = _loopeval([*RUN, "--loops", "2,4", "--db", str(db)], "generate:3")
    assert killed.returncode == -signal.SIGKILL
    runs = query(db, "SELECT id, wall_seconds FROM runs ORDER BY id")
    resume = [LOOPEVAL, "run", "--adapters-dir", str(PLUGINS), "--db", str(db), "--no-report", "--resume"]
    slow = _env() | {
        "LOOPEVAL_KILL_DELAY": "3"
    }  # the first still holds run 1 when the second, started later, gets there
    first = subprocess.Popen(
        [*resume, str(runs[0][0])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slow
    )
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline
        and first.poll() is None
        and not query(db, f"SELECT 1 FROM runs WHERE id = {runs[0][0]} AND lease_owner LIKE '%:{first.pid}:%'")
    ):
        time.sleep(0.1)
    assert first.poll() is None, first.communicate()
    second = _loopeval([*resume[1:], str(runs[1][0])])
    out, err = first.communicate(timeout=300)
    assert (first.returncode, second.returncode) == (0, 0), (err[-2000:], second.stderr[-2000:])
    assert "did not finish" not in err + second.stderr and "failed" not in err + second.stderr
    # Which run the second finds held depends on how far the first got (on a loaded machine it may be past run 1).
    waited = re.search(r"run (\d+): waiting for the process running it to finish", second.stdout + second.stderr)
    assert waited and int(waited.group(1)) in dict(runs), second.stdout
    _check_completed(db, dict(runs), killed_stretch_traced=True)


@pytest.mark.parametrize(
    "exits",
    [[], ["--exit-threshold", "0.5"], ["--kv-policy", "shared-mean", "--kv-dtype", "int8"]],
    ids=["every-loop", "exits-on", "shared-mean-int8"],
)  # the run's options beyond RUN
def test_kill9_in_a_workload_then_resume_gives_the_unbroken_run(exits: list[str], tmp_path: Path) -> None:
    """An adapter that takes whole workloads (the engine's scheduler) killed mid-task: the resumed run stores
    each sample once, and every sample is the one an unbroken run draws (per-sample random streams), with
    per-token exits on as without them (the same tokens and the same loops run per token), and under a KV policy
    and dtype, which the resume reads back from the run's row."""
    run = [*RUN, "--loops", "4" if "--exit-threshold" in exits else "2", "--temperature", "1.0", *exits]
    run[run.index("killer:ouro-tiny")] = "killer-workload:ouro-tiny"
    unbroken, db = tmp_path / "whole.sqlite", tmp_path / "r.sqlite"
    assert main([*run, "--adapters-dir", str(PLUGINS), "--db", str(unbroken)]) == 0  # in this process: nothing to kill
    killed = _loopeval([*run, "--db", str(db)], "finished:5")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    stored = query(db, "SELECT COUNT(*) FROM samples")[0][0]
    assert 0 < stored < 16, "samples were committed as they finished, before the kill"
    assert _resume(1, db) == 0
    _check_completed(db, {}, killed_stretch_traced=False)
    outputs = "SELECT task, doc_id, sample_index, output, loops_used, loops_histogram FROM samples ORDER BY task, doc_id, sample_index"
    assert query(db, outputs) == query(unbroken, outputs)
    if "--kv-policy" in exits:
        assert query(db, "SELECT kv_policy, kv_dtype FROM runs") == [("shared-mean", "int8")]
    elif exits:
        assert query(db, "SELECT exit_threshold FROM runs") == [(0.5,)]
        assert any(loops < 4 for *_, loops, _ in query(db, outputs)), "some tokens exited before the last loop"
