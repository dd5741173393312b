"""`loopeval adapter new`: the package it writes passes its own conformance test unchanged and is
found from its folder (LOOPEVAL_ADAPTERS) as well as through its entry point.

Every package is scaffolded under a name no user picks (`unique_name`), never the docs' `myarch`: a user who
followed the README's "Add your model" has `loopeval-myarch` installed in this venv, which makes `myarch` a
registered prefix that `adapter new` rightly refuses."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

from adapters import registry

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') skips it

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))


def _loopeval(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOOPEVAL, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def unique_name(stem: str) -> str:
    """A prefix no installed plugin has: the stem and a random suffix (lowercase hex, a valid adapter name)."""
    return f"{stem}_{uuid.uuid4().hex[:8]}"


def test_scaffold_passes_its_own_test_and_is_discoverable(tmp_path: Path) -> None:
    name = unique_name("scaffoldtest")
    made = _loopeval("adapter", "new", name, "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    root = tmp_path / f"loopeval-{name}"
    assert f"wrote {root}" in made.stdout
    # the hint's pip is this environment's (a bare `pip` would be the system's when the venv is not active)
    next_line = made.stdout.splitlines()[-1]
    assert next_line.startswith(f"next: (cd {root} && ") and " pip install" not in next_line.replace(
        " -m pip install", ""
    )
    python = next_line.split(" && ")[1].split(" -m pip ")[0]
    assert python == "python" or Path(python).parent.resolve() == Path(LOOPEVAL).parent.resolve()  # a linked .venv too
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["loopeval.adapters"] == {name: f"loopeval_{name}"}
    assert "python -m pytest" in (root / "README.md").read_text()

    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert "1 passed" in tested.stdout

    # the same folder, not installed, is found through LOOPEVAL_ADAPTERS / --adapters-dir (a package loaded by path)
    registry.available()  # built-ins loaded before the snapshot, so restoring it keeps them for later tests
    saved = dict(registry._REGISTRY)
    try:
        assert not [f for f in registry.load_plugins([root]) if f.name == f"loopeval_{name}"]
        entry = next(e for e in registry.available() if e.prefix == name)
        assert entry.source == f"folder {root.resolve()}"
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


def test_adapter_check_reports_unknown_specs_as_user_errors() -> None:
    out = _loopeval("adapter", "check", "nosuch:thing", "--no-bridge")
    assert out.returncode == 2 and "unknown model prefix 'nosuch'" in out.stderr and "Traceback" not in out.stderr


def test_scaffold_refuses_bad_names_and_existing_folders(tmp_path: Path) -> None:
    for name, message in (
        ("My-Arch", "must be lowercase letters, digits and _"),
        ("preset", "already a registered prefix (builtin)"),
    ):
        out = _loopeval("adapter", "new", name, "--dir", str(tmp_path))
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    twice = unique_name("twice")
    assert _loopeval("adapter", "new", twice, "--dir", str(tmp_path)).returncode == 0
    again = _loopeval("adapter", "new", twice, "--dir", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_without_dir_the_package_lands_here_or_beside_loopevals_source_folder(tmp_path: Path) -> None:
    from harness.cli.adapter import CHECKOUT, default_parent

    checkout = tmp_path / "loopeval"
    (checkout / "harness").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("[project]\nname = 'loopeval'\n")
    assert default_parent(checkout, checkout) == tmp_path  # `loopeval adapter new` typed in the clone
    assert default_parent(checkout / "harness", checkout) == tmp_path
    assert default_parent(tmp_path / "work", checkout) == tmp_path / "work"
    assert default_parent(tmp_path, tmp_path / "site-packages") == tmp_path  # an installed loopeval: no source folder
    assert (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "harness" / "cli" / "adapter.py").is_file()


def test_the_suggested_run_stores_into_the_new_adapters_own_database(tmp_path: Path) -> None:
    """`next:` runs in the package's folder and stores into the package's own database, as docs/adding-adapters.md
    does: the results database of the folder it was typed in (the checkout's, often) is never touched."""
    work = tmp_path / "work"
    work.mkdir()
    name = unique_name("herearch")
    made = _loopeval("adapter", "new", name, cwd=work)
    assert made.returncode == 0, made.stderr
    root = work / f"loopeval-{name}"
    assert made.stdout.splitlines()[0] == f"wrote {root}"
    line = made.stdout.splitlines()[-1]
    assert line.startswith(f"next: (cd {root} && ") and line.endswith(")")
    steps = line.removeprefix("next: (").removesuffix(")").split(" && ")
    run, results = steps[-2:]
    assert f" run --model {name}:tiny --tasks lookup --limit 2 --samples 1 " in run
    assert run.endswith(f" --db sqlite:///{name}.db")
    assert results.endswith(f" results --db sqlite:///{name}.db")
    # The package found through its folder instead of being pip-installed into this venv; the run as printed otherwise.
    env = {**os.environ, "LOOPEVAL_ADAPTERS": str(root), "HF_HUB_OFFLINE": "1"}
    env.pop("LOOPEVAL_DB", None)
    done = subprocess.run(
        ["bash", "-c", f"{steps[0]} && {run} --no-report && {results}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{name}:tiny" in done.stdout, done.stdout  # `results` shows the run it just stored
    assert (root / f"{name}.db").is_file() and not (work / "results").exists() and not (root / "results").exists()


def test_the_next_line_is_the_readmes_add_your_model_steps() -> None:
    """The README's walk-through and the `next:` line `adapter new` prints are the same steps, in the same order."""
    from harness.cli.adapter import next_steps

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("## Add your model", 1)[1].split("\n\n", 3)[2]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    assert lines[:2] == ["loopeval adapter new myarch --dir ..", "cd ../loopeval-myarch"]
    assert lines[2:] == next_steps("myarch")
