"""`loopeval run --executor ray` for real: a local Ray instance (2 CPUs) and a throwaway Postgres server.

A sweep of four runs goes to Ray from a sweep file; one worker is killed (SIGKILL) in the middle of
its run; Ray retries the task, which resumes the run. Every run must end finished with every sample
stored exactly once, and the same sweep file on the local executor must store identical samples.
A run interrupted on the local executor resumes on Ray, into a SQLite file given by a relative path.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.interrupted_runs import SAMPLES, one_at_a_time
from sqlalchemy import create_engine, inspect, text

from harness.cli import main
from harness.execution.ray_executor import resources
from harness.planning.spec import RunSpec

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))

# 2 models x loops 1, 2 = 4 runs, each 2 tasks x 12 docs x 1 sample, one doc per batch so a run
# commits 24 times and can be caught in the middle.
SWEEP = """\
models = ["preset:ouro-tiny", {spec = "preset:melt-tiny", overrides = {max_batch = 4}}]
tasks = ["addition", "chain2"]
loops = [1, 2]
samples = 1
max_new_tokens = 6
limit = 12
batch_size = 1
seed = 7
"""
PER_RUN = 2 * 12


def samples(url: str) -> dict[tuple, str]:
    """(model, loops, task, doc_id, sample_index) -> output, for every stored sample."""
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.model_spec, r.loops, s.task, s.doc_id, s.sample_index, s.output FROM samples s JOIN runs r ON r.id = s.run_id"
            )
        ).all()
    engine.dispose()
    stored = {tuple(row[:5]): row[5] for row in rows}
    assert len(stored) == len(rows), "a sample is stored twice"
    return stored


def kill_a_worker_mid_run(url: str, proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, int]:
    """Wait until a run is running with some samples committed, SIGKILL its worker; (run id, killed pid)."""
    engine = create_engine(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            with engine.connect() as conn:
                rows = (
                    conn.execute(
                        text(
                            "SELECT r.id, r.host FROM runs r WHERE r.status = 'running' "
                            "AND (SELECT COUNT(*) FROM samples s WHERE s.run_id = r.id) BETWEEN 3 AND :most"
                        ),
                        {"most": PER_RUN - 8},
                    ).all()
                    if inspect(conn).has_table("runs")
                    else []
                )  # the CLI creates the schema
            for run_id, host in rows:
                if "pid" in (host or {}):
                    os.kill(host["pid"], signal.SIGKILL)
                    return run_id, host["pid"]
            time.sleep(0.05)
    finally:
        engine.dispose()
    raise AssertionError(f"no run was caught mid-way: {proc.poll()=}")


@pytest.mark.slow
def test_a_killed_worker_is_resumed_and_the_sweep_matches_the_local_executor(
    tmp_path: Path, ray_address: str, postgres_server: object
) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    on_ray, here = postgres_server.database("ray_sweep"), postgres_server.database("local_sweep")
    proc = subprocess.Popen(
        [
            LOOPEVAL,
            "run",
            "--config",
            str(sweep),
            "--executor",
            "ray",
            "--ray-address",
            ray_address,
            "--db",
            on_ray,
            "--no-report",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed_run, killed_pid = kill_a_worker_mid_run(on_ray, proc)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    assert (
        "4 runs queued on Ray" in out and "job: 1 sweep" in out and "4/4" in out
    )  # the sweep's progress, in this terminal

    engine = create_engine(on_ray)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT id, model_spec, loops, status, host FROM runs ORDER BY id")).all()
    engine.dispose()
    assert [(r.model_spec, r.loops, r.status) for r in runs] == [
        ("preset:ouro-tiny", 1, "finished"),
        ("preset:ouro-tiny", 2, "finished"),
        ("preset:melt-tiny", 1, "finished"),
        ("preset:melt-tiny", 2, "finished"),
    ]
    assert all(
        r.host["threads"] == {"count": 1, "reason": "the 1 CPU Ray gave this task"} for r in runs
    )  # tiny models: one CPU each
    retried = next(r for r in runs if r.id == killed_run)
    assert retried.host["pid"] != killed_pid, "Ray's retry ran the killed run again, in another worker"
    stored = samples(on_ray)
    assert len(stored) == 4 * PER_RUN  # every sample of every run, each exactly once

    # The same sweep file on the local executor, which also computes with one thread (the thread policy's
    # choice for tiny models; CPU float sums may round differently with another thread count).
    local = subprocess.run(
        [LOOPEVAL, "run", "--config", str(sweep), "--db", here, "--no-report"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "threads: 1 thread" in local.stdout
    assert local.returncode == 0, local.stdout + local.stderr
    assert samples(here) == stored


@pytest.mark.slow
def test_an_interrupted_run_resumes_on_ray(tmp_path: Path, ray_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # `--db r.sqlite` is relative to here; Ray's workers run elsewhere
    argv = [LOOPEVAL, "run", "--config", str(one_at_a_time(tmp_path)), "--db", "r.sqlite", "--no-report"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    committed, deadline = 0, time.monotonic() + 120
    while committed < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        try:
            committed = sqlite3.connect("r.sqlite").execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        except sqlite3.OperationalError:  # no schema yet
            pass
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    ((run_id, status),) = sqlite3.connect("r.sqlite").execute("SELECT id, status FROM runs").fetchall()
    assert status == "interrupted"

    assert (
        main(["run", "--resume", str(run_id), "--executor", "ray", "--db", "r.sqlite", "--no-report"]) == 0
    )  # this process's Ray
    conn = sqlite3.connect("r.sqlite")
    assert conn.execute("SELECT status FROM runs").fetchall() == [("finished",)]
    assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT task || doc_id || sample_index) FROM samples").fetchone() == (
        SAMPLES,
        SAMPLES,
    )
    conn.close()


def test_a_run_asks_ray_for_its_gpus_and_a_tensor_parallel_model_for_all_of_them() -> None:
    spec = RunSpec.build(
        models=["preset:qwen3-tiny", "vllm:/models/qwen3"],
        model_overrides={"vllm:/models/qwen3": {"tensor_parallel_size": 4}},
    )
    assert resources(spec, "preset:qwen3-tiny", 0.0) == {"num_cpus": 1}
    assert resources(spec, "preset:qwen3-tiny", 0.0, cpus=2) == {
        "num_cpus": 2
    }  # a CPU run asks for the CPUs it computes with
    assert resources(spec, "preset:qwen3-tiny", 0.5, cpus=2) == {"num_cpus": 1, "num_gpus": 0.5}
    assert resources(spec, "preset:qwen3-tiny", 0.5) == {"num_cpus": 1, "num_gpus": 0.5}
    assert resources(spec, "vllm:/models/qwen3", 1.0) == {"num_cpus": 1, "num_gpus": 4.0}
    assert resources(spec, "vllm:/models/qwen3", 8.0) == {"num_cpus": 1, "num_gpus": 8.0}


@pytest.mark.slow
def test_a_run_that_fails_in_its_worker_is_stored_as_failed_and_the_others_finish(
    tmp_path: Path, ray_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A vLLM spec passes planning here (its folder is checked, vLLM is not needed to plan) but cannot load in a
    worker without vLLM: that run fails, with its error stored, while the sweep's other run finishes."""
    from adapters.testing import save_tiny_qwen3

    model = save_tiny_qwen3(tmp_path / "tiny-qwen3")
    db = tmp_path / "r.sqlite"
    rc = main(
        [
            "run",
            "--executor",
            "ray",
            "--model",
            f"vllm:{model}",
            "--model",
            "preset:qwen3-tiny",
            "--tasks",
            "lookup",
            "--limit",
            "2",
            "--samples",
            "1",
            "--max-new-tokens",
            "2",
            "--db",
            str(db),
            "--no-report",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 1 and "did not finish" in captured.err
    conn = sqlite3.connect(db)
    runs = conn.execute("SELECT model_spec, status, error FROM runs ORDER BY id").fetchall()
    conn.close()
    assert [(m, s) for m, s, _ in runs] == [(f"vllm:{model}", "failed"), ("preset:qwen3-tiny", "finished")]
    assert "vLLM is not installed" in runs[0][2]


@pytest.mark.slow
def test_a_run_never_asks_for_more_cpus_than_a_node_has(ray_address: str) -> None:
    """`--threads 8` on the 2-CPU test instance asks Ray for 2 CPUs per run: 8 would leave the task waiting forever."""
    import ray

    from harness.execution.ray_executor import feasible_cpus

    assert [feasible_cpus(ray, n) for n in (1, 2, 8)] == [1, 2, 2]
