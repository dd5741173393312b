"""One vocabulary for memory: a run's peaks and the profile points take the names of the series they are the
maximum of (`measures`), and `memory_peaks.kind` says whether a value is a peak or a fixed size.

Peak rows: `kv_bytes_peak` (the adapter's exact peak of its KV allocation) becomes the `kv_bytes_allocated`
peak, replacing the sampled maximum stored under that name where it is known (it is never smaller: the
sampler now takes a source's exact peak over its samples, as it did for torch's); `torch_allocated_peak`,
`torch_reserved_peak`, `nvml_process_peak`, `nvml_device_peak` and `rss_peak` lose the suffix.
`weights_bytes` is kind "fixed", every other row "peak". The `*_peak` columns of `profile_points` lose the
suffix the same way. The names are written out here, not read from `measures`: a migration is history.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

"""

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUFFIXED = ("torch_allocated", "torch_reserved", "nvml_process", "nvml_device", "rss")


def upgrade() -> None:
    """Rename the peak rows and the profile columns, and fill the new kind."""
    op.execute(
        "DELETE FROM memory_peaks WHERE measure = 'kv_bytes_allocated' AND run_id IN "
        "(SELECT run_id FROM memory_peaks WHERE measure = 'kv_bytes_peak' AND value IS NOT NULL)"
    )
    op.execute(
        "DELETE FROM memory_peaks WHERE measure = 'kv_bytes_peak' AND value IS NULL AND run_id IN "
        "(SELECT run_id FROM memory_peaks WHERE measure = 'kv_bytes_allocated')"
    )
    op.execute("UPDATE memory_peaks SET measure = 'kv_bytes_allocated' WHERE measure = 'kv_bytes_peak'")
    for name in SUFFIXED:
        op.execute(f"UPDATE memory_peaks SET measure = '{name}' WHERE measure = '{name}_peak'")
    with op.batch_alter_table("memory_peaks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=8), nullable=True))
    op.execute("UPDATE memory_peaks SET kind = CASE WHEN measure = 'weights_bytes' THEN 'fixed' ELSE 'peak' END")
    with op.batch_alter_table("memory_peaks", schema=None) as batch_op:
        batch_op.alter_column("kind", existing_type=sa.String(length=8), nullable=False)
    with op.batch_alter_table("profile_points", schema=None) as batch_op:
        for name in SUFFIXED:
            batch_op.alter_column(f"{name}_peak", new_column_name=name, existing_type=sa.BigInteger())


def downgrade() -> None:
    """The old names back; the `kv_bytes_allocated` peak is stored as both `kv_bytes_allocated` and `kv_bytes_peak`
    (the sampled maximum it replaced is gone)."""
    with op.batch_alter_table("profile_points", schema=None) as batch_op:
        for name in SUFFIXED:
            batch_op.alter_column(name, new_column_name=f"{name}_peak", existing_type=sa.BigInteger())
    with op.batch_alter_table("memory_peaks", schema=None) as batch_op:
        batch_op.drop_column("kind")
    for name in SUFFIXED:
        op.execute(f"UPDATE memory_peaks SET measure = '{name}_peak' WHERE measure = '{name}'")
    op.execute(
        "INSERT INTO memory_peaks (run_id, measure, value) "
        "SELECT run_id, 'kv_bytes_peak', value FROM memory_peaks WHERE measure = 'kv_bytes_allocated'"
    )
