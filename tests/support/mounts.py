"""A real read-only mount for the tests: the tests run as root, whom file permissions do not stop, but a read-only
mount does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def remount_read_only(folder: Path) -> None:
    """Remount the tests' tmpfs (`small_disk`, where the test has put its files) read-only."""
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    with pytest.raises(OSError):
        (folder / "probe").write_text("x")
