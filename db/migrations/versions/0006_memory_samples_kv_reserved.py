"""Add memory_samples.kv_bytes_reserved: the KV store's reserved bytes per tick (the engine's block
pool while a workload runs, 0 between calls). Ticks stored before it keep NULL (not recorded); the
run's peak of it was already stored in memory_peaks as `kv_bytes_reserved`.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

"""

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Existing ticks have no reserved reading."""
    with op.batch_alter_table("memory_samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kv_bytes_reserved", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("memory_samples", schema=None) as batch_op:
        batch_op.drop_column("kv_bytes_reserved")
