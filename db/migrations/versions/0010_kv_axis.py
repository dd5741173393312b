"""The KV memory axis: each run's KV policy and KV dtype (runs.kv_policy, kv_dtype; `--kv-policy`, `--kv-dtype`),
NULL when the sweep did not vary them (the model's own policy and dtype), as for every run stored before. A run's
identity (`db.sets.run_key`) and configuration (`db.sets.configuration`) gain them only where they are set, so
stored runs keep their keys and points. What one token of context costs under them is the adapter's description
(`runs.model_config`'s `kv_bytes_per_token`), stored with the run already.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

"""

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kv_policy", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("kv_dtype", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("kv_dtype")
        batch_op.drop_column("kv_policy")
