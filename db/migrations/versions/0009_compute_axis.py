"""Compute beside memory: each run's point on the per-token exit axis (runs.exit_threshold, exit_criterion;
NULL when the sweep did not vary it, as for every run stored before) and its GPU energy (runs.energy_joules,
NULL where NVML was unavailable); per sample, the loops run per generated token as a histogram
(samples.loops_histogram, beside the mean `loops_used`) and the adapter's decode time (samples.decode_seconds).
Rows stored before keep NULL: not recorded. A run's identity (`db.sets.run_key`) gains the threshold only
where it is set, so stored runs keep theirs.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

"""

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("exit_threshold", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("exit_criterion", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("energy_joules", sa.Float(), nullable=True))
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("loops_histogram", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("decode_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("decode_seconds")
        batch_op.drop_column("loops_histogram")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("energy_joules")
        batch_op.drop_column("exit_criterion")
        batch_op.drop_column("exit_threshold")
