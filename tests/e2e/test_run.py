"""`loopeval run` end to end: tiny presets, the synthetic suite, the real LightEval pipeline, a real SQLite file.

Also: resume after a real interruption of the process (SIGINT to a subprocess), and `loopeval results --json`.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.interrupted_runs import SAMPLES, one_at_a_time

from harness.cli import main
from measures import PEAK_MEASURES as MEASURES
from tests.support.sqlite import query

pytestmark = pytest.mark.slow
LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))


def test_sweep_stores_runs_samples_metrics_and_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "results.sqlite"
    argv = [
        "run",
        "--model",
        "preset:qwen3-tiny",
        "--model",
        "preset:ouro-tiny",
        "--loops",
        "1,2",
        "--tasks",
        "addition,lookup",
        "--limit",
        "3",
        "--samples",
        "2",
        "--max-new-tokens",
        "3",
        "--batch-size",
        "4",
        "--db",
        str(db),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"results: sqlite:///{db}" in out
    report = tmp_path / "report.html"
    assert f"report: {report}" in out and report.stat().st_size > 10_000

    runs = query(
        db, "SELECT id, sweep_id, model_spec, loops, status, wall_seconds, generate_seconds FROM runs ORDER BY id"
    )
    # qwen3-tiny does not loop: one run; ouro-tiny: one per loop count; all in one sweep.
    assert [(r[2], r[3], r[4]) for r in runs] == [
        ("preset:qwen3-tiny", None, "finished"),
        ("preset:ouro-tiny", 1, "finished"),
        ("preset:ouro-tiny", 2, "finished"),
    ]
    assert len({r[1] for r in runs}) == 1
    assert all(0 < r[6] <= r[5] for r in runs)
    for run_id, *_ in runs:
        samples = query(
            db,
            "SELECT task, doc_id, sample_index, output, score, generated_tokens, prompt_tokens FROM samples WHERE run_id = ?",
            run_id,
        )
        assert len(samples) == 2 * 3 * 2  # tasks x docs x samples, each exactly once
        assert len({s[:3] for s in samples}) == len(samples)
        assert {s[2] for s in samples} == {0, 1}
        assert all(s[4] in (0.0, 1.0) and 0 <= s[5] <= 3 and s[6] > 0 for s in samples)
        metrics = query(db, "SELECT task, metric, value FROM task_metrics WHERE run_id = ?", run_id)
        assert {m[0] for m in metrics} == {"addition", "lookup", "all"}
        assert all(m[2] is not None for m in metrics)
        series = query(
            db, "SELECT phase, rss, nvml_process, kv_bytes_allocated FROM memory_samples WHERE run_id = ?", run_id
        )
        assert len(series) >= 2 and all(s[1] > 0 for s in series)
        assert any(s[0] and s[0].startswith("task:") for s in series)
        peaks = dict(query(db, "SELECT measure, value FROM memory_peaks WHERE run_id = ?", run_id))
        assert set(peaks) == set(MEASURES)
        assert peaks["weights_bytes"] > 0 and peaks["kv_bytes_allocated"] > 0 and peaks["rss"] > 0
    (config,) = query(db, "SELECT model_config, versions, host, spec FROM runs WHERE loops = 2")
    assert json.loads(config[0])["loops"] == 2 and json.loads(config[0])["family"] == "ouro"
    assert "torch" in json.loads(config[1]) and "lighteval" in json.loads(config[1])
    assert "sampler" in json.loads(config[2]) and json.loads(config[3])["batch_size"] == 4
    # More loops, more per_loop KV: the stored peaks show it.
    kv = dict(
        query(
            db,
            "SELECT r.loops, p.value FROM memory_peaks p JOIN runs r ON r.id = p.run_id "
            "WHERE p.measure = 'kv_bytes_allocated' AND r.model_spec = 'preset:ouro-tiny'",
        )
    )
    assert kv[2] == 2 * kv[1]

    assert main(["results", "--db", str(db), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [r[0] for r in runs]
    for entry in listed:
        assert {"id", "sweep_id", "model", "loops", "suite", "status", "n_samples", "metrics", "memory"} <= set(entry)
        assert entry["n_samples"] == 12 and entry["suite"] == "synthetic"
        assert set(entry["metrics"]) == {"addition", "lookup", "all"}
        assert set(entry["memory"]) == set(MEASURES)
        assert entry["memory"]["rss"] > 0
    # KV per token as each run's adapter described it: per-loop KV grows with the loop count
    per_token = {(e["model"], e["loops"]): e["kv_bytes_per_token"] for e in listed}
    assert per_token[("preset:ouro-tiny", 2)] == 2 * per_token[("preset:ouro-tiny", 1)] > 0
    assert main(["results", "--db", str(db)]) == 0
    table = capsys.readouterr().out
    words = " ".join(table.split())  # the caption wraps at the table's width
    assert "GB = 1e9 bytes" in words and "preset:ouro-tiny" in table


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_resume_after_a_real_interrupt_stores_every_sample_once(signum: int, tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    argv = [LOOPEVAL, "run", "--config", str(one_at_a_time(tmp_path)), "--db", str(db), "--no-report"]
    # Ctrl-C must reach the run even when pytest itself was started in the background (`cmd &`),
    # where the shell hands children SIGINT ignored and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    committed = 0
    deadline = time.monotonic() + 120
    while committed < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        if db.exists():
            try:
                committed = query(db, "SELECT COUNT(*) FROM samples")[0][0]
            except sqlite3.OperationalError:  # schema not created yet
                pass
    assert proc.poll() is None, f"run ended before it could be interrupted: {proc.communicate()}"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    ((run_id, status),) = query(db, "SELECT id, status FROM runs")
    assert status == "interrupted"
    assert f"--resume {run_id}" in out + err
    kept = query(db, "SELECT id, task, doc_id, sample_index, output FROM samples ORDER BY id")
    assert 3 <= len(kept) < SAMPLES

    assert main(["run", "--resume", str(run_id), "--db", str(db), "--no-report"]) == 0
    rows = query(db, "SELECT id, task, doc_id, sample_index, output FROM samples ORDER BY id")
    assert len(rows) == SAMPLES and len({r[1:4] for r in rows}) == SAMPLES  # each exactly once
    assert rows[: len(kept)] == kept  # what was committed before the interrupt is untouched
    assert query(db, "SELECT status FROM runs") == [("finished",)]
    assert {m[0] for m in query(db, "SELECT task FROM task_metrics")} == {"addition", "chain2", "all"}
    assert main(["run", "--resume", str(run_id), "--db", str(db), "--no-report"]) == 2  # finished runs do not resume
