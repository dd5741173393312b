"""`loopeval adapter new`: the package it writes passes its own conformance test unchanged and is
found from its folder (LOOPEVAL_ADAPTERS) as well as through its entry point."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from adapters import registry

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') skips it

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))


def _loopeval(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOOPEVAL, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def test_scaffold_passes_its_own_test_and_is_discoverable(tmp_path: Path) -> None:
    made = _loopeval("adapter", "new", "myarch", "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    root = tmp_path / "loopeval-myarch"
    assert f"wrote {root}" in made.stdout
    # the hint's pip is this environment's (a bare `pip` would be the system's when the venv is not active)
    next_line = made.stdout.splitlines()[-1]
    assert next_line.startswith(f"next: cd {root} && ") and " pip install" not in next_line.replace(" -m pip install", "")
    python = next_line.split(" && ")[1].split(" -m pip ")[0]
    assert python == "python" or Path(python).parent == Path(LOOPEVAL).parent
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["loopeval.adapters"] == {"myarch": "loopeval_myarch"}
    assert "python -m pytest" in (root / "README.md").read_text()

    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], capture_output=True, text=True,
                            cwd=root, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert "1 passed" in tested.stdout

    # the same folder, not installed, is found through LOOPEVAL_ADAPTERS / --adapters-dir (a package loaded by path)
    registry.available()  # built-ins loaded before the snapshot, so restoring it keeps them for later tests
    saved = dict(registry._REGISTRY)
    try:
        assert not [f for f in registry.load_plugins([root]) if f.name == "loopeval_myarch"]
        entry = next(e for e in registry.available() if e.prefix == "myarch")
        assert entry.source == f"folder {root.resolve()}"
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


def test_adapter_check_reports_unknown_specs_as_user_errors() -> None:
    out = _loopeval("adapter", "check", "nosuch:thing", "--no-bridge")
    assert out.returncode == 2 and "unknown model prefix 'nosuch'" in out.stderr and "Traceback" not in out.stderr


def test_scaffold_refuses_bad_names_and_existing_folders(tmp_path: Path) -> None:
    for name, message in (("My-Arch", "must be lowercase letters, digits and _"),
                          ("preset", "already a registered prefix (builtin)")):
        out = _loopeval("adapter", "new", name, "--dir", str(tmp_path))
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert _loopeval("adapter", "new", "twice", "--dir", str(tmp_path)).returncode == 0
    again = _loopeval("adapter", "new", "twice", "--dir", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr
