"""Each eval run stores its evaluation set's id (runs.set_id, `db.sets.EvalSet.id`), hashed once when the run is
written instead of on every read. Every eval run already stored gets exactly the id readers computed for it
before, so an upgraded database reads the same sets; profiles and probes have none (NULL).

The hash is copied here as it is at this revision, not imported from `db.sets`: a migration is history, and
the ids it writes must not change if `EvalSet.id` ever does. A run whose set columns hold a damaged value
(`db.stored`: invalid JSON, text for a number) gets no id: it is refused or hidden while damaged anyway.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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


def _set_id(suite: str, tasks: Any, limit: Any, sampling: Any, fingerprint: str | None) -> str | None:
    """`db.sets.EvalSet.id` as of this revision, from a run's raw set columns; None for a damaged value."""
    try:
        tasks, sampling = _parsed(tasks) or [], _parsed(sampling) or {}
    except ValueError:
        return None
    if not (isinstance(tasks, list) and all(isinstance(t, str) for t in tasks) and isinstance(sampling, dict)):
        return None
    if limit is not None and not (type(limit) is int or (isinstance(limit, str) and limit.isdigit())):
        return None
    kept = sorted([key, value] for key, value in sampling.items() if key != "seed")
    value = [suite, sorted(tasks), None if limit is None else int(limit), kept, fingerprint]
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("set_id", sa.String(length=8), nullable=True))
        batch_op.create_index(batch_op.f("ix_runs_set_id"), ["set_id"], unique=False)
    connection = op.get_bind()
    columns = (runs.c.id, runs.c.suite, runs.c.tasks, runs.c.limit, runs.c.sampling, runs.c.data_fingerprint)
    rows = connection.execute(sa.select(*columns).where(runs.c.kind == "eval")).all()  # read whole before writing
    for run_id, *fields in rows:
        connection.execute(runs.update().where(runs.c.id == run_id).values(set_id=_set_id(*fields)))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_set_id"))
        batch_op.drop_column("set_id")
