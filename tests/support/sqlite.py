"""Reading a test's SQLite file directly, beside loopeval's own readers: what was stored, as plain tuples."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def query(db: Path, sql: str, *args: object) -> list[tuple]:
    """The rows `sql` (with `args` bound) gives on the database file `db`, read in a connection of its own."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
