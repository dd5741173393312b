"""Commands printed as hints ("continue with: ...") must run as printed, whether or not the venv is active."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from urllib.parse import urlsplit

from db import DB_ENV


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


def has_password(db: str) -> bool:
    """Whether a database URL carries a password (in its user part or as a `password=` query parameter).

    A string that does not parse as a URL counts as having one: printing it could print a secret.
    """
    if "://" not in db:
        return False  # a SQLite path
    try:
        parts = urlsplit(db)
        return parts.password is not None or "password=" in parts.query.lower()
    except ValueError:
        return True


def with_db(command: str, db: str | None) -> str:
    """`command` with the `--db` option that reaches the database `db` again, runnable as printed, never its password.

    `db` is what the user named (`--db`, a sweep file's `db`); None is the default database or
    $LOOPEVAL_DB, which the same shell reaches again without an option. A URL with a password is given as
    `--db "$LOOPEVAL_DB"`, and the hint says to set that variable unless it already holds the URL.
    """
    if db is None or db == os.environ.get(DB_ENV):
        return command
    if not has_password(db):
        return f"{command} --db {shlex.quote(db)}"
    return f'{command} --db "${DB_ENV}"  (first set {DB_ENV} to the database URL: its password is never printed)'
