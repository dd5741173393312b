"""What a run measured besides its samples: metrics, the memory sampler's ticks and peaks, profile points, probes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import delete, insert, select

from db.models import MemoryPeak, MemorySample, ProbeValue, ProfilePoint, TaskMetric
from db.store.base import Transactions
from measures import BY_NAME, merged_peak


class Measurements(Transactions):
    """Writes of a run's metrics, memory, profile points and probe values, and a read of its peaks (to merge)."""

    def set_metrics(self, run_id: int, metrics: Mapping[str, Mapping[str, tuple[float | None, float | None]]]) -> None:
        """Replace the run's metrics: task -> metric -> (value, stderr); task "all" is the suite average."""
        with self._write() as session:
            session.execute(delete(TaskMetric).where(TaskMetric.run_id == run_id))
            session.add_all(
                TaskMetric(run_id=run_id, task=task, metric=metric, value=value, stderr=stderr)
                for task, by_metric in metrics.items()
                for metric, (value, stderr) in by_metric.items()
            )

    def add_memory_samples(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
        ticks = [{**row, "run_id": run_id} for row in rows]
        if ticks:
            with self._write() as session:
                session.execute(insert(MemorySample), ticks)

    def merge_memory_peaks(self, run_id: int, peaks: Mapping[str, int | None]) -> None:
        """Merge `peaks` into the stored ones by `measures.merged_peak` (a resumed run keeps earlier stretches'
        peaks)."""
        merged = dict(self.memory_peaks(run_id))
        for name, value in peaks.items():
            merged[name] = merged_peak(name, merged.get(name), value)
        self.set_memory_peaks(run_id, merged)

    def set_memory_peaks(self, run_id: int, peaks: Mapping[str, int | None]) -> None:
        """Replace the run's peaks: `measures` name -> bytes, None where the source was unavailable."""
        with self._write() as session:
            session.execute(delete(MemoryPeak).where(MemoryPeak.run_id == run_id))
            session.add_all(
                MemoryPeak(run_id=run_id, measure=name, kind=BY_NAME[name].stored_as, value=value)
                for name, value in peaks.items()
            )

    def memory_peaks(self, run_id: int) -> dict[str, int | None]:
        with self._read() as session:
            rows = session.execute(select(MemoryPeak.measure, MemoryPeak.value).where(MemoryPeak.run_id == run_id))
            return dict(rows.all())

    def add_profile_points(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
        with self._write() as session:
            session.add_all(ProfilePoint(run_id=run_id, **row) for row in rows)

    def add_probe_values(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """`loopeval probe` values (loop, metric, lag, value), NaN stored as NULL."""
        with self._write() as session:
            session.add_all(
                ProbeValue(run_id=run_id, **{**row, "value": None if math.isnan(row["value"]) else row["value"]})
                for row in rows
            )
