"""Initial schema: exactly db/models.py as first shipped (runs, task_metrics, samples, memory series and peaks, profile points).

Revision ID: 0001
Revises:
Create Date: 2026-11-30

"""

from collections.abc import Sequence

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model_spec", sa.String(length=512), nullable=False),
        sa.Column("adapter", sa.String(length=64), nullable=False),
        sa.Column("model_config", sa.JSON(), nullable=False),
        sa.Column("loops", sa.Integer(), nullable=True),
        sa.Column("suite", sa.String(length=64), nullable=False),
        sa.Column("tasks", sa.JSON(), nullable=False),
        sa.Column("sampling", sa.JSON(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("limit", sa.Integer(), nullable=True),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("host", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("wall_seconds", sa.Float(), nullable=True),
        sa.Column("generate_seconds", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_runs_sweep_id", "runs", ["sweep_id"])

    op.create_table(
        "memory_peaks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("measure", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "measure"),
    )
    op.create_index("ix_memory_peaks_run_id", "memory_peaks", ["run_id"])

    op.create_table(
        "memory_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("phase", sa.String(length=128), nullable=True),
        sa.Column("generated_tokens", sa.BigInteger(), nullable=True),
        sa.Column("kv_bytes_used", sa.BigInteger(), nullable=True),
        sa.Column("kv_bytes_allocated", sa.BigInteger(), nullable=True),
        sa.Column("torch_allocated", sa.BigInteger(), nullable=True),
        sa.Column("torch_reserved", sa.BigInteger(), nullable=True),
        sa.Column("nvml_process", sa.BigInteger(), nullable=True),
        sa.Column("nvml_device", sa.BigInteger(), nullable=True),
        sa.Column("rss", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_memory_samples_run_id", "memory_samples", ["run_id"])

    op.create_table(
        "profile_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("context_tokens", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("loops", sa.Integer(), nullable=True),
        sa.Column("weights_bytes", sa.BigInteger(), nullable=True),
        sa.Column("kv_bytes_analytic", sa.BigInteger(), nullable=True),
        sa.Column("kv_bytes_allocated", sa.BigInteger(), nullable=True),
        sa.Column("kv_bytes_used", sa.BigInteger(), nullable=True),
        sa.Column("torch_allocated_peak", sa.BigInteger(), nullable=True),
        sa.Column("torch_reserved_peak", sa.BigInteger(), nullable=True),
        sa.Column("nvml_process_peak", sa.BigInteger(), nullable=True),
        sa.Column("nvml_device_peak", sa.BigInteger(), nullable=True),
        sa.Column("rss_peak", sa.BigInteger(), nullable=True),
        sa.Column("prefill_seconds", sa.Float(), nullable=True),
        sa.Column("decode_tokens_per_second", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_profile_points_run_id", "profile_points", ["run_id"])

    op.create_table(
        "samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(length=128), nullable=False),
        sa.Column("doc_id", sa.String(length=128), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("gold", sa.Text(), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("generated_tokens", sa.Integer(), nullable=True),
        sa.Column("loops_used", sa.Float(), nullable=True),
        sa.Column("finish_reason", sa.String(length=16), nullable=True),
        sa.Column("latency_seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "task", "doc_id", "sample_index"),
    )
    op.create_index("ix_samples_run_id", "samples", ["run_id"])

    op.create_table(
        "task_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(length=128), nullable=False),
        sa.Column("metric", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("stderr", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "task", "metric"),
    )
    op.create_index("ix_task_metrics_run_id", "task_metrics", ["run_id"])


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_task_metrics_run_id", table_name="task_metrics")
    op.drop_table("task_metrics")
    op.drop_index("ix_samples_run_id", table_name="samples")
    op.drop_table("samples")
    op.drop_index("ix_profile_points_run_id", table_name="profile_points")
    op.drop_table("profile_points")
    op.drop_index("ix_memory_samples_run_id", table_name="memory_samples")
    op.drop_table("memory_samples")
    op.drop_index("ix_memory_peaks_run_id", table_name="memory_peaks")
    op.drop_table("memory_peaks")
    op.drop_index("ix_runs_sweep_id", table_name="runs")
    op.drop_table("runs")
