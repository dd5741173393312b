"""A run's sampling is stored once, in runs.sampling: an eval run's runs.spec (its RunSpec) no longer
repeats it. `--resume` rebuilds the spec from both columns. No column changes; the rows' run
identity and evaluation set are read from runs.sampling and do not change.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

"""

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


def _eval_runs(connection: sa.Connection) -> Sequence[sa.Row[Any, Any, Any]]:
    """(id, spec, sampling) of every eval run, read whole before any is rewritten."""
    return connection.execute(sa.select(runs.c.id, runs.c.spec, runs.c.sampling).where(runs.c.kind == "eval")).all()


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
