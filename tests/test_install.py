"""scripts/install.sh: the main job installs only Python packages, `--test` adds the Debian packages the
tests use, and every step says what it does.

A real install takes minutes and apt changes the machine, so the script runs in a scratch copy where
`.venv/bin/python` (the venv already made) and `apt-get` are stand-ins that log their arguments, and
PATH holds only the tools the script calls: what is checked is the script's own logic.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install.sh"
LOGGER = '#!/bin/sh\necho "${0##*/} $*" >> "$LOG"\n'


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "install.sh")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("dirname", "id", "ls"):
        (tools / name).symlink_to(shutil.which(name))
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for stand_in in (tmp_path / ".venv" / "bin" / "python", tools / "apt-get"):
        stand_in.write_text(LOGGER)
        stand_in.chmod(0o755)
    return tmp_path


def install(root: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = root / "calls.log"
    env = {"PATH": str(root / "bin"), "LOG": str(log), "HOME": str(root)}
    done = subprocess.run(
        [shutil.which("bash"), str(root / "scripts" / "install.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return done, log.read_text().splitlines() if log.exists() else []


def test_the_main_job_installs_python_packages_only_with_a_header_per_step(scratch: Path) -> None:
    done, calls = install(scratch)
    assert done.returncode == 0, done.stderr
    headers = [
        re.sub(r"\(\d+s so far\)", "(Ns so far)", line) for line in done.stdout.splitlines() if line.startswith("==>")
    ]
    assert headers == [  # any count of seconds: a busy machine takes more than 0
        "==> install.sh [1/3] virtual environment .venv and an up-to-date pip (Ns so far)",
        "==> install.sh [2/3] torch 2.13.0, CPU build (Ns so far)",
        "==> install.sh [3/3] loopeval and its pinned dependencies (constraints.txt) (Ns so far)",
    ]
    assert calls == [
        "python -m pip install -q --upgrade pip",
        "python -m pip install --progress-bar on torch==2.13.0",
        "python -m pip install --progress-bar on -c constraints.txt -e .",
    ]  # no apt-get: no Chromium
    assert ".venv/bin/loopeval" in done.stdout.splitlines()[-1]


@pytest.mark.skipif(os.geteuid() != 0, reason="the script installs Debian packages only as root")
def test_the_test_setup_adds_the_missing_debian_packages(scratch: Path) -> None:
    done, calls = install(scratch, "--test")
    assert done.returncode == 0, done.stderr
    assert "==> install.sh [4/4] Debian packages for the tests: chromium bubblewrap" in done.stdout
    assert calls[2] == "python -m pip install --progress-bar on -c constraints.txt -e .[test]"
    assert calls[3:] == [
        "apt-get update",
        "apt-get install -y chromium bubblewrap" + ("" if Path("/usr/lib/postgresql").is_dir() else " postgresql"),
    ]


def test_unknown_options_are_refused(scratch: Path) -> None:
    done, calls = install(scratch, "--tests")
    assert done.returncode == 2 and done.stderr == "usage: scripts/install.sh [--test]\n" and calls == []
