"""`loopeval run` flags that reach the adapter registry: `--adapters-dir` and `--trust-remote-code`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness.cli import main

PLUGIN = """
from adapters import load, register


@register("flagplug", "a folder plugin wrapping an engine preset")
def make(arg, **overrides):
    return load("preset:" + arg, **overrides)
"""


def test_adapters_dir_flag_runs_a_folder_plugin(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "flagplug.py").write_text(PLUGIN)
    db = tmp_path / "r.sqlite"
    argv = [
        "run",
        "--adapters-dir",
        str(plugins),
        "--model",
        "flagplug:qwen3-tiny",
        "--tasks",
        "lookup",
        "--limit",
        "2",
        "--samples",
        "1",
        "--max-new-tokens",
        "3",
        "--db",
        str(db),
        "--no-report",
    ]
    assert main(argv) == 0
    with sqlite3.connect(db) as con:
        assert con.execute("select model_spec, status from runs").fetchall() == [("flagplug:qwen3-tiny", "finished")]
        assert con.execute("select count(*) from samples").fetchone()[0] == 2


def test_missing_adapters_dir_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--adapters-dir", str(tmp_path / "nope"), "--db", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope" in err
    assert not (tmp_path / "r.sqlite").exists()


def test_trust_remote_code_flag_reaches_only_the_transformers_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adapters.testing import save_tiny_qwen3

    model_dir = save_tiny_qwen3(tmp_path / "qwen3")
    db = tmp_path / "r.sqlite"
    argv = [
        "run",
        "--trust-remote-code",
        "--model",
        f"transformers:{model_dir}",
        "--model",
        "preset:qwen3-tiny",
        "--tasks",
        "lookup",
        "--limit",
        "1",
        "--samples",
        "1",
        "--max-new-tokens",
        "3",
        "--db",
        str(db),
        "--no-report",
    ]
    assert main(argv) == 0
    assert "trust_remote_code=True" in capsys.readouterr().err
    with sqlite3.connect(db) as con:
        assert sorted(s for (s,) in con.execute("select status from runs")) == ["finished", "finished"]
