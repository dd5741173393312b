"""`loopeval profile` on tiny presets: measured KV equals the analytic model, stored as a profile run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from harness.cli import main


def test_profile_points_match_the_analytic_kv_and_are_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "p.sqlite"
    assert (
        main(
            [
                "profile",
                "preset:ouro-tiny",
                "--lengths",
                "16,48",
                "--loops",
                "1,2",
                "--batch",
                "2",
                "--decode-steps",
                "2",
                "--json",
                "--db",
                str(db),
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    points = result["points"]
    assert [(p["loops"], p["context_tokens"]) for p in points] == [(1, 16), (1, 48), (2, 16), (2, 48)]
    for p in points:
        assert p["kv_bytes_analytic"] == p["kv_bytes_allocated"] > 0
        assert p["batch"] == 2 and p["prefill_seconds"] > 0 and p["rss"] > 0
        assert p["nvml_process"] is None or p["nvml_process"] > 0
    by_key = {(p["loops"], p["context_tokens"]): p["kv_bytes_allocated"] for p in points}
    assert by_key[(2, 48)] == 2 * by_key[(1, 48)]  # per_loop KV grows with r

    conn = sqlite3.connect(db)
    ((run_id, kind, model),) = conn.execute("SELECT id, kind, model_spec FROM runs").fetchall()
    assert (run_id, kind, model) == (result["run_id"], "profile", "preset:ouro-tiny")
    (row,) = conn.execute(
        'SELECT sweep_id, adapter, model_config, loops, suite, tasks, sampling, seed, "limit",'
        " data_fingerprint, spec, versions, host, status FROM runs"
    ).fetchall()
    assert len(row[0]) == 12 and row[1] == "preset" and json.loads(row[2]) == result["description"]
    assert (row[3], row[4], json.loads(row[5]), row[7], row[8], row[9]) == (None, "profile", [], 0, None, None)
    assert json.loads(row[6]) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": None,
        "max_new_tokens": 2,
        "n": 1,
        "seed": 0,
        "stop": [],
    }
    assert json.loads(row[10]) == {"lengths": [16, 48], "loops": [1, 2], "batch": 2, "decode_steps": 2}
    assert "torch" in json.loads(row[11]) and json.loads(row[12])["cpu_count"] > 0 and row[13] == "finished"
    stored = conn.execute("SELECT loops, context_tokens, kv_bytes_analytic FROM profile_points ORDER BY id").fetchall()
    assert stored == [(p["loops"], p["context_tokens"], p["kv_bytes_analytic"]) for p in points]
    peaks = dict(conn.execute("SELECT measure, value FROM memory_peaks").fetchall())
    assert peaks["kv_bytes_allocated"] == max(by_key.values())


def test_gated_kv_does_not_grow_with_loops(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "profile",
                "preset:melt-tiny",
                "--lengths",
                "40",
                "--loops",
                "1,4",
                "--decode-steps",
                "1",
                "--json",
                "--no-store",
            ]
        )
        == 0
    )
    points = json.loads(capsys.readouterr().out)["points"]
    assert len({p["kv_bytes_allocated"] for p in points}) == 1
    assert all(p["kv_bytes_allocated"] == p["kv_bytes_analytic"] for p in points)


def test_every_length_is_checked_against_the_context_before_any_point_or_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`profile zoo:melt-tiny --lengths 256,1024` used to measure 256, create the database, then refuse 1024."""
    monkeypatch.chdir(tmp_path)  # where the default database (results/loopeval.sqlite) would be created
    assert main(["profile", "zoo:melt-tiny", "--lengths", "256,1024"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no point measured: each is printed as soon as it is
    assert err == (
        "loopeval: error: --lengths 1024 plus 8 generated tokens exceeds zoo:melt-tiny's context of 512 tokens: "
        "at most 504 fits (`loopeval models` and `loopeval zoo list` show each model's context)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_longest_length_that_fits_is_measured_and_a_bare_name_is_stored_by_its_full_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "p.sqlite"
    assert main(["profile", "qwen3-tiny", "--lengths", "511", "--decode-steps", "1", "--json", "--db", str(db)]) == 0
    (point,) = json.loads(capsys.readouterr().out)["points"]
    assert point["context_tokens"] == 511 and point["kv_bytes_allocated"] == point["kv_bytes_analytic"]
    stored = sqlite3.connect(db).execute("SELECT model_spec, adapter FROM runs").fetchall()
    assert stored == [("preset:qwen3-tiny", "preset")]
    assert main(["profile", "qwen3-tiny", "--lengths", "511", "--decode-steps", "2", "--no-store"]) == 2
    assert "at most 510 fits" in capsys.readouterr().err
