"""Add probe_values: `loopeval probe` stores per-loop metrics (angular distance, relative update,
state variance, computational interaction by lag) of a run of kind "probe".

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

"""

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """A new table: existing runs have no probe values."""
    op.create_table(
        "probe_values",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("loop", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("lag", sa.Integer(), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_probe_values_run_id", "probe_values", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_probe_values_run_id", table_name="probe_values")
    op.drop_table("probe_values")
