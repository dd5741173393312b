"""Plugin discovery: entry points and LOOPEVAL_ADAPTERS folders, broken plugins skipped by name, and a
plugin run end to end through `loopeval run` into a SQLite database."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import adapters
from adapters import AdapterError

ROOT = Path(__file__).resolve().parents[2]
LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))

# A folder plugin: a plain module that registers a prefix, here on top of the tiny engine preset.
FOLDER_PLUGIN = '''
"""Folder plugin: `folderarch:tiny` is the qwen3-tiny preset under another prefix."""
import adapters
from adapters.registry import register


@register("folderarch", "folder plugin wrapping qwen3-tiny")
def load(arg, **overrides):
    adapter = adapters.load("preset:qwen3-tiny", **overrides)
    adapter.spec = f"folderarch:{arg}"
    return adapter
'''


def _write(folder: Path, name: str, code: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(textwrap.dedent(code))


def test_folder_plugins_load_and_a_broken_one_is_skipped_by_name(
    tmp_path: Path, isolated_registry: None, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, "folderarch.py", FOLDER_PLUGIN)
    _write(tmp_path, "broken.py", "raise RuntimeError('this plugin is broken on purpose')\n")
    _write(
        tmp_path,
        "halfway.py",
        """
        from adapters.registry import register
        register("halfway", "registered, then the module fails")(lambda arg, **kw: None)
        raise ImportError("missing dependency: foo")
    """,
    )
    _write(tmp_path, "_private.py", "raise AssertionError('underscore modules are not plugins')\n")
    failures = adapters.registry.load_plugins([tmp_path])
    by_prefix = {e.prefix: e for e in adapters.available()}
    assert by_prefix["folderarch"].source == f"folder {tmp_path.resolve()}"
    assert by_prefix["preset"].source == "builtin" and "transformers" in by_prefix
    assert "halfway" not in by_prefix, "a failed plugin's registrations are rolled back"
    assert {(f.name, f.error) for f in failures} >= {
        ("broken", "RuntimeError: this plugin is broken on purpose"),
        ("halfway", "ImportError: missing dependency: foo"),
    }
    err = capsys.readouterr().err
    assert "loopeval: warning: adapter plugin 'broken' from folder" in err and "skipped: RuntimeError" in err
    assert adapters.load("folderarch:tiny", device="cpu").spec == "folderarch:tiny"
    assert adapters.registry.load_plugins([tmp_path]) == failures  # scanning a folder twice loads nothing twice


def test_a_plugin_cannot_take_a_builtin_prefix(tmp_path: Path, isolated_registry: None) -> None:
    _write(
        tmp_path,
        "squatter.py",
        """
        from adapters.registry import register
        register("preset", "not the real preset")(lambda arg, **kw: None)
    """,
    )
    failures = adapters.registry.load_plugins([tmp_path])
    assert any(f.name == "squatter" and "already registered by builtin" in f.error for f in failures)
    assert next(e for e in adapters.available() if e.prefix == "preset").source == "builtin"


def test_missing_adapters_folder_is_a_user_error(tmp_path: Path, isolated_registry: None) -> None:
    with pytest.raises(AdapterError, match="adapters folder .*nowhere.* does not exist"):
        adapters.registry.load_plugins([tmp_path / "nowhere"])


def _install_entry_point_plugin(target: Path, source: Path) -> None:
    """Install a tiny distribution declaring two entry points, the way pip installs any plugin."""
    _write(
        source / "epdemo",
        "__init__.py",
        '''
        """Entry-point plugin: one factory entry point and one that fails on load."""
        import adapters


        def make(arg, **overrides):
            """epdemo: qwen3-tiny through an entry-point factory"""
            adapter = adapters.load("preset:qwen3-tiny", **overrides)
            adapter.spec = f"epdemo:{arg}"
            return adapter
    ''',
    )
    _write(source / "epdemo", "broken.py", "import a_module_that_does_not_exist\n")
    _write(
        source,
        "pyproject.toml",
        """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "epdemo"
        version = "0.1"

        [project.entry-points."loopeval.adapters"]
        epdemo = "epdemo:make"
        epbroken = "epdemo.broken"

        [tool.setuptools]
        packages = ["epdemo"]
    """,
    )
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        str(target),
        str(source),
    ]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)


@pytest.mark.slow
def test_plugins_from_an_entry_point_and_a_folder_run_end_to_end(tmp_path: Path) -> None:
    """One `loopeval run` sweep over two plugin models (one installed with an entry point, one in
    LOOPEVAL_ADAPTERS) and the transformers backend on a local checkpoint."""
    from adapters.testing import save_tiny_qwen3

    site, folder, db = tmp_path / "site", tmp_path / "plugins", tmp_path / "runs.db"
    checkpoint = save_tiny_qwen3(tmp_path / "tiny-qwen3")
    _install_entry_point_plugin(site, tmp_path / "epdemo-src")
    _write(folder, "folderarch.py", FOLDER_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(site), "LOOPEVAL_ADAPTERS": str(folder), "HF_HUB_OFFLINE": "1"}

    listed = subprocess.run([LOOPEVAL, "models"], capture_output=True, text=True, env=env, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert "epdemo:...  epdemo: qwen3-tiny through an entry-point factory" in listed.stdout
    assert "folderarch:..." in listed.stdout and "preset:..." in listed.stdout
    assert (
        "adapter plugin 'epbroken' from entry point epdemo (epdemo.broken) skipped: ModuleNotFoundError"
        in listed.stderr
    )

    run = subprocess.run(
        [
            LOOPEVAL,
            "run",
            "--model",
            "epdemo:tiny",
            "--model",
            "folderarch:tiny",
            "--model",
            f"transformers:{checkpoint}",
            "--tasks",
            "lookup",
            "--limit",
            "2",
            "--samples",
            "1",
            "--max-new-tokens",
            "8",
            "--db",
            f"sqlite:///{db}",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with sqlite3.connect(db) as con:
        runs = con.execute("select id, model_spec, status from runs order by id").fetchall()
        assert [(spec, status) for _, spec, status in runs] == [
            ("epdemo:tiny", "finished"),
            ("folderarch:tiny", "finished"),
            (f"transformers:{checkpoint}", "finished"),
        ]
        for run_id, _, _ in runs:
            assert con.execute("select count(*) from samples where run_id = ?", (run_id,)).fetchone()[0] == 2
