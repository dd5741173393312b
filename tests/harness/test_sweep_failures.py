"""A sweep goes on past a failed run, and a new-token budget cut by the context is recorded, not silent.

Real engine presets whose context is shortened by a folder plugin: prompts that do not fit fail the
first run for real, and a context that holds the prompt but not all of max_new_tokens cuts the second.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness.cli import main

PLUGIN = """
from adapters import load, register


@register("shortctx", "an engine preset with a shorter context: shortctx:TOKENS:PRESET")
def make(arg, **overrides):
    tokens, _, preset = arg.partition(":")
    adapter = load("preset:" + preset, **overrides)
    adapter.model.config = adapter.config = adapter.config.replace(max_position=int(tokens))
    adapter.max_context = int(tokens)
    return adapter
"""


def test_a_failed_run_does_not_stop_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "shortctx.py").write_text(PLUGIN)
    db = tmp_path / "r.sqlite"
    # addition prompts are 9-10 tokens: a 6-token context cannot hold them; 14 holds them and a few new tokens.
    argv = ["run", "--adapters-dir", str(plugins), "--model", "shortctx:6:qwen3-tiny", "--model", "shortctx:14:qwen3-tiny",
            "--model", "preset:qwen3-tiny", "--tasks", "addition", "--limit", "3", "--samples", "1",
            "--max-new-tokens", "8", "--temperature", "0", "--db", str(db), "--no-report"]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    with sqlite3.connect(db) as con:
        runs = con.execute("SELECT id, model_spec, status, error FROM runs ORDER BY id").fetchall()
        assert [r[1:3] for r in runs] == [
            ("shortctx:6:qwen3-tiny", "failed"),
            ("shortctx:14:qwen3-tiny", "finished"),
            ("preset:qwen3-tiny", "finished"),
        ]
        assert "does not fit the model's context of 6 tokens" in runs[0][3]
        cut = con.execute(
            "SELECT finish_reason, prompt_tokens, generated_tokens FROM samples WHERE run_id = ?", (runs[1][0],)
        ).fetchall()
        assert len(cut) == 3 and all(r[0] == "context_limit" and r[1] + r[2] <= 14 and r[2] < 8 for r in cut)
        full = con.execute("SELECT finish_reason FROM samples WHERE run_id = ?", (runs[2][0],)).fetchall()
        assert len(full) == 3 and {r[0] for r in full} <= {"length", "eos", "stop"}
    # Reported once per run, and the command ends with a summary naming the failed run and why.
    assert out.count("finish reason is 'context_limit'") == 1 and f"run {runs[1][0]}: 3 samples reached" in out
    assert "1 of 3 runs failed:" in err and f"run {runs[0][0]} shortctx:6:qwen3-tiny: AdapterError" in err
    assert "Traceback" not in out + err
