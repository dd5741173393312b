"""Commands printed as hints ("continue with: ...") must run as printed, whether or not the venv is active."""

from __future__ import annotations

import os
import shlex
import shutil
import sys


def env_command(name: str) -> str:
    """This environment's `name` (loopeval, python) as a hint the user can paste and run: the bare name
    when the shell finds this very script, else its full path.

    The README starts with `.venv/bin/loopeval run` without activating the venv, where a bare `loopeval`
    is not found and a bare `pip` or `python` is the system's. Paths are not resolved: a venv's python is
    a link to the system's, and only the link knows its venv.
    """
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), name)
    found = shutil.which(name)
    if (found and os.path.abspath(found) == script) or not os.path.exists(script):
        return name
    return shlex.quote(script)
