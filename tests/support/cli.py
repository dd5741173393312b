"""`loopeval` commands run in the test's process, as a user types them."""

from __future__ import annotations

import contextlib
import io

from harness.cli import main


def printed(argv: list[str]) -> str:
    """What `loopeval ARGV` printed on stdout; the command must end with exit code 0."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0, argv
    return out.getvalue()
