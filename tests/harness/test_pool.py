"""The local executor's worker processes (`harness.execution.pool`) for real: forked workers running a sweep's runs side by side
store what one process stores, and Ctrl-C, a killed parent or a killed worker leave every run finished or
interrupted (never held), ready for `--resume`, which completes the sweep with every sample stored once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.execution.pool import UNLIMITED_DOCS, default_workers, groups
from db.record import PlannedRun
from harness.planning.plan import SweepPlan
from harness.planning.defaults import SUITE_SAMPLING
from harness.planning.spec import RunSpec
from tests.support.sqlite import query

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
# Two models, each decoding one sequence at a time (max_batch 1) so that samples are committed one by one; 200 samples
# a run (about 2 s each on the tiny presets) leave seconds between "both under way" and the end of a run, where 20
# samples left 0.2 s and a run could finish before the signal reached it.
SLOW_SWEEP = """\
models = [{ spec = "preset:ouro-tiny", overrides = { max_batch = 1 } }, { spec = "preset:qwen3-tiny", overrides = { max_batch = 1 } }]
loops = [2]
tasks = ["addition", "chain2"]
limit = 100
samples = 1
max_new_tokens = 16
"""


def test_a_model_is_one_group_sized_by_its_decode_work() -> None:
    spec = RunSpec.build(models=["preset:ouro-tiny", "preset:qwen3-tiny"], loops=[1, 4], limit=3, samples=2)
    plan = SweepPlan(task_configs=["t1", "t2"], runs=[], params={"preset:ouro-tiny": 100, "preset:qwen3-tiny": 50})
    stored = [
        PlannedRun(model, loops, "synthetic", ("t1", "t2"), {}, 0, id=run_id)
        for run_id, model, loops in (
            (1, "preset:ouro-tiny", 1),
            (2, "preset:ouro-tiny", 4),
            (3, "preset:qwen3-tiny", None),
        )
    ]
    ouro, qwen = groups(spec, plan, stored)
    assert [r.id for r in ouro.runs] == [1, 2] and [r.id for r in qwen.runs] == [3]
    assert ouro.size == 3 * 2 * 2 * 100 * (1 + 4) and qwen.size == 3 * 2 * 2 * 50
    unlimited = groups(RunSpec.build(models=["preset:qwen3-tiny"]), plan, stored[2:])[0]
    assert unlimited.size == UNLIMITED_DOCS * 2 * SUITE_SAMPLING["synthetic"].n * 50  # the synthetic suite's n


def test_workers_fill_the_cores_at_the_runs_thread_count_and_a_gpu_takes_one() -> None:
    assert default_workers(threads=1, cores=2, devices=["cpu"]) == 2
    assert default_workers(threads=2, cores=2, devices=["cpu"]) == 1
    assert default_workers(threads=1, cores=16, devices=["cpu", "cuda"]) == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["--workers", "0"], "--workers must be a whole number of worker processes from 1 to 256, got 0"),
        (
            ["--workers", "2", "--executor", "ray"],
            "--workers (workers in a sweep file) applies only to --executor local: Ray places each run itself",
        ),
    ],
)
def test_bad_worker_counts_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = tmp_path / "r.sqlite"
    assert main(["run", "--model", "preset:qwen3-tiny", *args, "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip() == f"loopeval: error: {message}" and not db.exists()


@pytest.mark.slow
def test_two_workers_store_exactly_what_one_process_stores(tmp_path: Path) -> None:
    argv = [
        "run",
        "--model",
        "zoo:qwen3-tiny-small",
        "--model",
        "zoo:ouro-tiny",
        "--loops",
        "1,2",
        "--tasks",
        "chain2,c30k4",
        "--limit",
        "6",
        "--no-report",
    ]
    for workers in ("1", "2"):
        assert main([*argv, "--workers", workers, "--db", str(tmp_path / f"w{workers}.sqlite")]) == 0
    rows = "SELECT r.id, r.model_spec, r.loops, s.task, s.doc_id, s.sample_index, s.output, s.score FROM samples s JOIN runs r ON r.id = s.run_id ORDER BY 1, 4, 5, 6"
    peaks = "SELECT run_id, value FROM memory_peaks WHERE measure = 'kv_bytes_allocated' ORDER BY run_id"
    one, two = tmp_path / "w1.sqlite", tmp_path / "w2.sqlite"
    assert query(one, rows) == query(two, rows) and len(query(two, rows)) == 3 * 2 * 6 * SUITE_SAMPLING["synthetic"].n
    assert query(one, peaks) == query(two, peaks)
    pids = {
        model: {h for (h,) in query(two, f"SELECT json_extract(host, '$.pid') FROM runs WHERE model_spec = '{model}'")}
        for model in ("zoo:qwen3-tiny-small", "zoo:ouro-tiny")
    }
    assert (
        all(len(p) == 1 for p in pids.values()) and pids["zoo:qwen3-tiny-small"] != pids["zoo:ouro-tiny"]
    )  # a model per worker
    assert os.getpid() not in set.union(*pids.values())


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """The slow sweep on two workers, stopped once a few samples of each run are committed."""
    sweep, db = tmp_path / "sweep.toml", tmp_path / "r.sqlite"
    sweep.write_text(SLOW_SWEEP)
    proc = subprocess.Popen(
        [LOOPEVAL, "run", "--config", str(sweep), "--workers", "2", "--db", str(db), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # as from a terminal, even under `pytest &`
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if len(query(db, "SELECT run_id FROM samples GROUP BY run_id HAVING COUNT(*) >= 2")) == 2:
                return proc, db
        except sqlite3.OperationalError:  # no schema yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"the sweep was not caught with both runs under way: {proc.poll()=}")


def _stopped_cleanly(db: Path) -> None:
    """Every run finished or interrupted, none left held; at least one was caught under way (a tiny run may finish
    in the instant between the check that both are under way and the signal)."""
    statuses = [status for (status,) in query(db, "SELECT status FROM runs")]
    assert set(statuses) <= {"interrupted", "finished"} and "interrupted" in statuses, query(
        db, "SELECT status, error FROM runs"
    )


def _resume_completes(db: Path) -> None:
    (run_id,) = query(db, "SELECT MIN(id) FROM runs WHERE status = 'interrupted'")[0]
    assert main(["run", "--resume", str(run_id), "--db", str(db), "--no-report"]) == 0
    assert query(db, "SELECT status, COUNT(*) FROM runs GROUP BY status") == [("finished", 2)]
    assert query(db, "SELECT COUNT(*), COUNT(DISTINCT run_id || task || doc_id || sample_index) FROM samples") == [
        (400, 400)
    ]


def _workers_of(pid: int) -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]


@pytest.mark.slow
def test_ctrl_c_interrupts_every_worker_and_resume_completes_the_sweep(tmp_path: Path) -> None:
    proc, db = _start(tmp_path)
    proc.send_signal(signal.SIGINT)  # to the parent alone: it passes the interrupt on to its workers
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    _stopped_cleanly(db)
    assert "--resume" in out + err
    _resume_completes(db)


@pytest.mark.slow
def test_a_killed_parent_takes_its_workers_and_their_leases_with_it(tmp_path: Path) -> None:
    proc, db = _start(tmp_path)
    workers = _workers_of(proc.pid)
    assert len(workers) >= 2
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in workers):
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers), "a worker outlived its parent"
    _stopped_cleanly(db)  # each stored by its worker: the parent is gone
    _resume_completes(db)


@pytest.mark.slow
def test_a_killed_worker_leaves_its_run_to_resume_and_the_other_finishes(tmp_path: Path) -> None:
    proc, db = _start(tmp_path)
    ((victim, pid),) = query(db, "SELECT id, json_extract(host, '$.pid') FROM runs ORDER BY id LIMIT 1")
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1 and f"runs {victim} did not finish" in err, out + err
    assert query(db, "SELECT id, status FROM runs ORDER BY id") == [(victim, "interrupted"), (victim + 1, "finished")]
    _resume_completes(db)
