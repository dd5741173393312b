"""A run's sampling is stored once, in runs.sampling: an eval run's runs.spec (its RunSpec) no longer
repeats it. `--resume` rebuilds the spec from both columns. No column changes; the rows' run
identity and evaluation set are read from runs.sampling and do not change. A run whose spec or sampling is
damaged (not a JSON object: `db.stored`) is left as it is, and the others are upgraded.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

"""

import json
from collections.abc import Sequence
from typing import Any

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("spec", sa.JSON),
    sa.column("sampling", sa.JSON),
)
# The same columns read raw (Text, not JSON): a damaged value must not fail the upgrade of a whole database.
raw_runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("spec", sa.Text),
    sa.column("sampling", sa.Text),
)


DAMAGED: Any = object()  # a value that is not a JSON object (`db.stored` names it once the database is read)


def _parsed(raw: Any) -> Any:
    """A JSON column's value (SQLite hands text, a server's driver the parsed value): an object, None (NULL or JSON
    null), or `DAMAGED`."""
    try:
        value = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        return DAMAGED
    return value if value is None or isinstance(value, dict) else DAMAGED


def _eval_runs(connection: sa.Connection) -> list[tuple[int, Any, Any]]:
    """(id, spec, sampling) of every eval run, read whole before any is rewritten; a run holding a damaged value in
    either is left out, and so left as it is."""
    statement = sa.select(raw_runs.c.id, raw_runs.c.spec, raw_runs.c.sampling).where(raw_runs.c.kind == "eval")
    rows = [(run_id, _parsed(spec), _parsed(sampling)) for run_id, spec, sampling in connection.execute(statement)]
    return [row for row in rows if DAMAGED not in row[1:]]


def upgrade() -> None:
    """Drop `sampling` from every eval run's spec. Both copies were written from one RunSpec, so they are equal;
    a run whose column is empty (never written so) gets the spec's copy, so no sampling is lost."""
    connection = op.get_bind()
    for run_id, spec, sampling in _eval_runs(connection):
        if spec and "sampling" in spec:
            kept = {key: value for key, value in spec.items() if key != "sampling"}
            connection.execute(
                runs.update().where(runs.c.id == run_id).values(spec=kept, sampling=sampling or spec["sampling"])
            )


def downgrade() -> None:
    """Put the sampling back into every eval run's stored spec, where older code reads it on `--resume`."""
    connection = op.get_bind()
    for run_id, spec, sampling in _eval_runs(connection):
        if spec:
            connection.execute(runs.update().where(runs.c.id == run_id).values(spec={**spec, "sampling": sampling}))
