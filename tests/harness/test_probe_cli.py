"""`loopeval probe` end to end on a tiny preset, its refusals (exit 2, nothing written), and `--loops` ranges."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
import torch

from adapters.engine.adapter import load_preset
from adapters.engine.probes import probe
from harness.cli import main
from harness.errors import UserError
from harness.planning.options import int_ranges
from harness.planning.sweep import read_sweep_file

TEXTS = ["x=3; y=x+1; y?", "12+30=42"]


def test_probe_stores_what_the_engine_measures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts, db = tmp_path / "texts.txt", tmp_path / "p.sqlite"
    texts.write_text("\n".join(TEXTS) + "\n\n")
    assert (
        main(
            [
                "probe",
                "preset:coreloop-tiny",
                "--loops",
                "1-3",
                "--text-file",
                str(texts),
                "--positions",
                "8",
                "--db",
                str(db),
            ]
        )
        == 0
    )
    assert "loop probes, r = 3" in capsys.readouterr().out

    conn = sqlite3.connect(db)
    ((run_id, kind, loops, suite),) = conn.execute("SELECT id, kind, loops, suite FROM runs").fetchall()
    assert (kind, loops, suite) == ("probe", 3, "text:texts.txt")
    stored = {
        (l, m, k): v
        for l, m, k, v in conn.execute("SELECT loop, metric, lag, value FROM probe_values WHERE run_id = ?", (run_id,))
    }
    adapter = load_preset("coreloop-tiny", dtype="fp32", device="cpu")  # the same seeded weights
    adapter.loops = 3
    (row,) = conn.execute(
        'SELECT sweep_id, model_spec, adapter, model_config, tasks, sampling, seed, "limit", data_fingerprint,'
        " spec, versions, host, status FROM runs"
    ).fetchall()
    assert len(row[0]) == 12 and row[1:3] == ("preset:coreloop-tiny", "preset")
    assert json.loads(row[3]) == json.loads(json.dumps(adapter.describe()))
    assert (json.loads(row[4]), json.loads(row[5]), row[6], row[7], row[8]) == ([], {}, 0, None, None)
    assert json.loads(row[9]) == {"loops": 3, "source": "text:texts.txt"}
    assert "torch" in json.loads(row[10]) and json.loads(row[11])["cpu_count"] > 0 and row[12] == "finished"
    expected = probe(adapter.model, [torch.tensor(adapter.tokenizer.encode(t)[:8]) for t in TEXTS], 3)
    assert len(stored) == len(expected) == 3 * 3 + 3  # three per-loop metrics x 3 loops, interactions (2,1) (3,1) (3,2)
    for v in expected:
        assert stored[(v.loop, v.metric, v.lag)] == pytest.approx(v.value, rel=1e-6)
        assert not math.isnan(v.value)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--positions", "0"], "--positions and --limit must be positive"),
        (["--text-file", "/nonexistent/t.txt"], "--text-file /nonexistent/t.txt: no such file"),
        (["--suite", "paper"], "probe reads the texts of synthetic"),
        (["--tasks", "chain9"], "unknown task 'chain9' of synthetic"),
        (["--loops", "3-1"], "--loops must be comma-separated positive integers or ranges"),
        (["--loops", "1-65"], "probe runs at most r = 64"),
    ],
)
def test_probe_refusals_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    db = tmp_path / "p.sqlite"
    assert main(["probe", "preset:coreloop-tiny", *args, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not db.exists()


def test_probe_refuses_a_model_that_cannot_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "p.sqlite"
    assert main(["probe", "preset:qwen3-tiny", "--loops", "2", "--db", str(db)]) == 2
    assert "kv_strategy 'per_loop' or 'gated'" in capsys.readouterr().err
    assert not db.exists()


def test_loop_ranges() -> None:
    assert int_ranges("1-12", "--loops") == list(range(1, 13))
    assert int_ranges("1-3,8,2,16", "--loops") == [1, 2, 3, 8, 16]
    assert int_ranges("0-2", "--seed", minimum=0) == [0, 1, 2]
    for bad in ("0-3", "5-2", "3-", "-2", "1-5000", "a-b", ""):
        with pytest.raises(UserError, match="--loops must be comma-separated positive integers or ranges such as 1-12"):
            int_ranges(bad, "--loops")


def test_sweep_file_loops_take_a_range(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('loops = "1-4,8"\n')
    assert read_sweep_file(path)["loops"] == [1, 2, 3, 4, 8]
    path.write_text('loops = "4-1"\n')
    with pytest.raises(UserError, match="loops must be comma-separated"):
        read_sweep_file(path)
