"""The results schema, SQLAlchemy 2.0 typed models.

One `Run` is one (model, loops, suite) evaluation or one `loopeval profile`; runs launched together
share a `sweep_id`. Samples, metrics, memory series and peaks hang off a run. Byte counts are
BigInteger; a NULL byte count means "this source was unavailable", never zero.
Alembic migrations in `db/migrations` create exactly this schema; change both together.
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from db.sets import KV_POLICY_LENGTH


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16), default="eval")  # "eval", "profile" or "probe"
    model_spec: Mapped[str] = mapped_column(String(512))
    adapter: Mapped[str] = mapped_column(String(64))  # spec prefix: preset, zoo, ouro, transformers, ...
    model_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # Adapter.describe()
    loops: Mapped[int | None] = mapped_column(Integer)
    suite: Mapped[str] = mapped_column(String(64))
    tasks: Mapped[list[str]] = mapped_column(JSON, default=list)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # Sampling as a dict, the run's only copy
    seed: Mapped[int] = mapped_column(Integer, default=0)
    limit: Mapped[int | None] = mapped_column(Integer)
    # sha256 of the task files evaluated (suites.registry.data_fingerprint); NULL for runs stored before it existed
    data_fingerprint: Mapped[str | None] = mapped_column(String(64))
    # an eval run's evaluation set (`db.sets.EvalSet.id` of the columns above, hashed once when it is written and
    # read by every view); NULL for profiles and probes
    set_id: Mapped[str | None] = mapped_column(String(8), index=True)
    # an eval run's RunSpec less its sampling (`sampling` above), so --resume can rebuild it; a probe's or profile's settings
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    versions: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)  # package -> version
    host: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # hostname, cpu, gpu, ...
    # queued (stored with its sweep, not started yet), running, finished, failed, interrupted
    status: Mapped[str] = mapped_column(String(16), default="running")
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    wall_seconds: Mapped[float | None] = mapped_column(Float)
    generate_seconds: Mapped[float | None] = mapped_column(Float)  # time spent inside Adapter.generate
    # the run's point on the per-token exit axis (`--exit-threshold`, `--exit-criterion`); NULL when not swept
    exit_threshold: Mapped[float | None] = mapped_column(Float)
    exit_criterion: Mapped[str | None] = mapped_column(String(16))
    # the run's point on the KV memory axis (`--kv-policy`, `--kv-dtype`); NULL when not swept (the model's own)
    kv_policy: Mapped[str | None] = mapped_column(String(KV_POLICY_LENGTH))
    kv_dtype: Mapped[str | None] = mapped_column(String(16))
    # GPU energy over the run (NVML's total-energy counter, its stretches summed); NULL where unavailable (no NVML)
    energy_joules: Mapped[float | None] = mapped_column(Float)
    lease_owner: Mapped[str | None] = mapped_column(String(128))  # "host:pid:token" of the process running it
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # renewed every second while it runs

    samples: Mapped[list[Sample]] = relationship(back_populates="run", cascade="all, delete-orphan")
    metrics: Mapped[list[TaskMetric]] = relationship(back_populates="run", cascade="all, delete-orphan")
    memory_series: Mapped[list[MemorySample]] = relationship(back_populates="run", cascade="all, delete-orphan")
    memory_peaks: Mapped[list[MemoryPeak]] = relationship(back_populates="run", cascade="all, delete-orphan")
    profile_points: Mapped[list[ProfilePoint]] = relationship(back_populates="run", cascade="all, delete-orphan")
    probe_values: Mapped[list[ProbeValue]] = relationship(back_populates="run", cascade="all, delete-orphan")


class TaskMetric(Base):
    """A LightEval metric for one task of a run; task "all" holds the suite average."""

    __tablename__ = "task_metrics"
    __table_args__ = (UniqueConstraint("run_id", "task", "metric"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(128))
    metric: Mapped[str] = mapped_column(String(128))
    value: Mapped[float | None] = mapped_column(Float)
    stderr: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="metrics")


class Sample(Base):
    """One generated sample of one doc; committed as soon as it is scored, so interrupted runs keep it."""

    __tablename__ = "samples"
    __table_args__ = (UniqueConstraint("run_id", "task", "doc_id", "sample_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(128))
    doc_id: Mapped[str] = mapped_column(String(128))
    sample_index: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text)
    output: Mapped[str] = mapped_column(Text)
    gold: Mapped[str | None] = mapped_column(Text)
    score: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    generated_tokens: Mapped[int | None] = mapped_column(Integer)
    loops_used: Mapped[float | None] = mapped_column(Float)  # mean loops per generated token
    # loops run -> generated tokens that ran that many ({"1": 3, "4": 17}); NULL for a model that does not loop
    loops_histogram: Mapped[dict[str, int] | None] = mapped_column(JSON(none_as_null=True))  # SQL NULL, not JSON null
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    latency_seconds: Mapped[float | None] = mapped_column(Float)  # its batch's wall time (prefill and decode)
    decode_seconds: Mapped[float | None] = mapped_column(Float)  # the decode time the adapter reported (`Generation`)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="samples")


class MemorySample(Base):
    """One tick of the memory sampler. NULL = source unavailable (no NVML here, no CUDA, ...)."""

    __tablename__ = "memory_samples"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    t: Mapped[float] = mapped_column(Float)  # seconds since the sampler started
    phase: Mapped[str | None] = mapped_column(String(128))  # e.g. "task:addition batch:3"
    generated_tokens: Mapped[int | None] = mapped_column(BigInteger)  # tokens generated so far in the run
    kv_bytes_used: Mapped[int | None] = mapped_column(BigInteger)
    kv_bytes_allocated: Mapped[int | None] = mapped_column(BigInteger)
    kv_bytes_reserved: Mapped[int | None] = mapped_column(
        BigInteger
    )  # the KV pool held; NULL in ticks stored before 0006
    torch_allocated: Mapped[int | None] = mapped_column(BigInteger)
    torch_reserved: Mapped[int | None] = mapped_column(BigInteger)
    nvml_process: Mapped[int | None] = mapped_column(BigInteger)
    nvml_device: Mapped[int | None] = mapped_column(BigInteger)
    rss: Mapped[int | None] = mapped_column(BigInteger)

    run: Mapped[Run] = relationship(back_populates="memory_series")


class MemoryPeak(Base):
    """A run's maximum of one `measures` series (`rss`, `kv_bytes_allocated`, ...; kind "peak"), or a fixed size
    (`weights_bytes`; kind "fixed"), under the name the series has in `memory_samples`."""

    __tablename__ = "memory_peaks"
    __table_args__ = (UniqueConstraint("run_id", "measure"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    measure: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(8))  # "peak" or "fixed" (`measures.Measure.stored_as`)
    value: Mapped[int | None] = mapped_column(BigInteger)

    run: Mapped[Run] = relationship(back_populates="memory_peaks")


class ProfilePoint(Base):
    """One context length of `loopeval profile`: measured memory (each measure's peak over the point, named as
    its series) and speed beside the analytic KV."""

    __tablename__ = "profile_points"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    context_tokens: Mapped[int] = mapped_column(Integer)
    batch: Mapped[int] = mapped_column(Integer)
    loops: Mapped[int | None] = mapped_column(Integer)
    weights_bytes: Mapped[int | None] = mapped_column(BigInteger)
    kv_bytes_analytic: Mapped[int | None] = mapped_column(BigInteger)
    kv_bytes_allocated: Mapped[int | None] = mapped_column(BigInteger)
    kv_bytes_used: Mapped[int | None] = mapped_column(BigInteger)
    torch_allocated: Mapped[int | None] = mapped_column(BigInteger)
    torch_reserved: Mapped[int | None] = mapped_column(BigInteger)
    nvml_process: Mapped[int | None] = mapped_column(BigInteger)
    nvml_device: Mapped[int | None] = mapped_column(BigInteger)
    rss: Mapped[int | None] = mapped_column(BigInteger)
    prefill_seconds: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_second: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="profile_points")


class ProbeValue(Base):
    """One value of `loopeval probe`: a metric of loop `loop` (1-based) of a "probe" run.

    Metrics are `adapters.engine.probes.METRICS`; `lag` is set for "interaction" only; `value` NULL
    where the metric is undefined (an interaction with a loop whose update is zero).
    """

    __tablename__ = "probe_values"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    loop: Mapped[int] = mapped_column(Integer)
    metric: Mapped[str] = mapped_column(String(32))
    lag: Mapped[int | None] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="probe_values")
