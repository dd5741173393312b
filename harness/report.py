"""The static report written to its file: `dashboards.report` builds the page, the harness writes it whole
(`adapters.files.write_atomically`), so a reader never sees half a report and dashboards write no file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from adapters.files import write_atomically
from db import ResultsError


def write_report(db_url: str, out: Path, log: Callable[[str], None] | None = None) -> Path:
    """Write the static report of the database at `db_url` to `out`; return its path.

    Raises `db.ResultsError` (one line, exit 2 in the CLI) when the database is missing or holds no runs;
    a missing SQLite file is not created. A run holding a damaged value is left out, named by a line to `log`.
    """
    from dashboards.report import build_report  # lazy: plotly is heavy, absent on GPUs
    from db.session import open_existing
    from db.stored import hide_damaged

    engine = open_existing(db_url)
    try:
        skipped = hide_damaged(engine)
        if log is not None:
            for line in skipped:
                log(line)
        text = build_report(engine)
    finally:
        engine.dispose()
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(out, text.encode("utf-8"))  # readable by its group, as the database beside it
    except OSError as exc:
        raise ResultsError(
            f"cannot write the report to {out}: {exc.strerror or exc}; any report already there is unchanged"
        ) from None
    return out
