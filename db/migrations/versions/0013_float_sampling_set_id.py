"""One evaluation set however its float sampling was written: a sweep file's `temperature = 1` (or `top_p = 1`) stored
the integer, `--temperature 1` the float 1.0, and the two hashed to two set ids that no view compared. `Sampling` now
keeps them floats and `db.sets.EvalSet` hashes an integer there as its float; this gives every eval run stored with
such an integer the id its set has now. Only `runs.set_id`, a hash of the run's set columns, changes: the stored
sampling stays as written, and a run whose sampling holds only floats keeps its id.

The hash is copied here as it is at this revision, not imported from `db.sets` (a migration is history). Downgrade
writes those runs' ids back as 0011 hashed them.

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-07

"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FLOATS = ("temperature", "top_p")  # `adapters.base.Sampling`'s float fields at this revision

# Raw columns (Text, not JSON): a damaged value must not fail the upgrade of a whole database.
runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("suite", sa.String),
    sa.column("tasks", sa.Text),
    sa.column("limit", sa.Text),
    sa.column("sampling", sa.Text),
    sa.column("data_fingerprint", sa.String),
    sa.column("set_id", sa.String),
)


def _parsed(raw: Any) -> Any:
    """A JSON column's value: SQLite hands text, a server's driver the parsed value."""
    return json.loads(raw) if isinstance(raw, (str, bytes)) else raw


def _set_id(columns: Sequence[Any], floats: bool) -> str | None:
    """The set id of a run's raw set columns (suite, tasks, limit, sampling, data fingerprint), its float fields' integers as floats where `floats` (this revision's
    `db.sets.EvalSet.id`) or as stored (0011's); None where the run needs no new id: a damaged value, or no integer
    in a float field."""
    suite, tasks, limit, sampling, fingerprint = columns
    try:
        tasks, sampling = _parsed(tasks) or [], _parsed(sampling) or {}
    except ValueError:
        return None
    if not (isinstance(tasks, list) and all(isinstance(t, str) for t in tasks) and isinstance(sampling, dict)):
        return None
    if not any(type(sampling.get(name)) is int for name in FLOATS):
        return None
    if limit is not None and not (type(limit) is int or (isinstance(limit, str) and limit.isdigit())):
        return None
    kept = sorted(
        [key, float(value) if floats and key in FLOATS and type(value) is int else value]
        for key, value in sampling.items()
        if key != "seed"
    )
    value = [suite, sorted(tasks), None if limit is None else int(limit), kept, fingerprint]
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _rehash(floats: bool) -> None:
    connection = op.get_bind()
    columns = (runs.c.id, runs.c.suite, runs.c.tasks, runs.c.limit, runs.c.sampling, runs.c.data_fingerprint)
    rows = connection.execute(sa.select(*columns).where(runs.c.kind == "eval")).all()  # read whole before writing
    for run_id, *fields in rows:
        set_id = _set_id(fields, floats)
        if set_id is not None:
            connection.execute(runs.update().where(runs.c.id == run_id).values(set_id=set_id))


def upgrade() -> None:
    _rehash(floats=True)


def downgrade() -> None:
    _rehash(floats=False)
