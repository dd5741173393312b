"""The run summary `loopeval results` prints: one plain dict per run, with its metrics, headline and memory."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select

from db.headline import headline
from db.models import MemoryPeak, Run, Sample, TaskMetric
from db.sets import KV_AXIS, configuration, run_set, set_label
from db.store.base import Transactions

# task -> metric -> value (or stderr), per run id
_ByRun = dict[int, dict[str, dict[str, float | None]]]


def _set_fields(run: Run) -> dict[str, str | None]:
    """A run's evaluation set (db.sets): the id stored with it and its label. Profiles and probes have none."""
    if run.set_id is None:
        return {"set_id": None, "set_label": None}
    return {"set_id": run.set_id, "set_label": set_label(run.set_id, run_set(vars(run)))}


def _summary(
    run: Run,
    n_samples: int,
    metrics: dict[str, dict[str, float | None]],
    stderrs: dict[str, dict[str, float | None]],
    memory: dict[str, int | None],
) -> dict[str, Any]:
    """One run's summary from its row and what hangs off it."""
    return {
        "id": run.id,
        "sweep_id": run.sweep_id,
        "kind": run.kind,
        "model": run.model_spec,
        "adapter": run.adapter,
        "loops": run.loops,
        "exit_threshold": run.exit_threshold,
        "exit_criterion": run.exit_criterion,
        "overrides": configuration(vars(run)),  # what else of its identity changes the model (db.sets)
        "suite": run.suite,
        "tasks": run.tasks,
        "limit": run.limit,
        "sampling": run.sampling,
        "seed": run.seed,
        "data_fingerprint": run.data_fingerprint,
        **_set_fields(run),
        "status": run.status,
        "error": run.error,
        "n_samples": n_samples,
        "metrics": {task: dict(values) for task, values in metrics.items()},
        # one pass@1 per benchmark and their unweighted mean (db.headline), what the tables show
        "pass_at_1": dataclasses.asdict(headline(metrics, run.suite)),
        "stderr": {task: dict(values) for task, values in stderrs.items()},
        "memory": dict(memory),
        # the KV policy and dtype it ran with: where swept its own (`overrides` holds them too), else as the
        # adapter described itself (None if it did not), and what one more token of context adds to its KV cache
        **{key: getattr(run, key) or (run.model_config or {}).get(key) for key in KV_AXIS},
        "kv_bytes_per_token": (run.model_config or {}).get("kv_bytes_per_token"),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "wall_seconds": run.wall_seconds,
        "generate_seconds": run.generate_seconds,
        "energy_joules": run.energy_joules,
    }


class Summaries(Transactions):
    """Every run summarised in one read (`run_summaries`)."""

    def run_summaries(self, kind: str | None = None) -> list[dict[str, Any]]:
        """One plain dict per run, oldest first: identity, status, sample count, metrics and memory peaks."""
        with self._read() as session:
            query = select(Run).order_by(Run.id)
            if kind is not None:
                query = query.where(Run.kind == kind)
            runs = list(session.scalars(query))
            counts = dict(session.execute(select(Sample.run_id, func.count()).group_by(Sample.run_id)).all())
            metrics: _ByRun = defaultdict(lambda: defaultdict(dict))
            stderrs: _ByRun = defaultdict(lambda: defaultdict(dict))
            for m in session.scalars(select(TaskMetric)):
                metrics[m.run_id][m.task][m.metric] = m.value
                stderrs[m.run_id][m.task][m.metric] = m.stderr
            memory: dict[int, dict[str, int | None]] = defaultdict(dict)
            for p in session.scalars(select(MemoryPeak)):
                memory[p.run_id][p.measure] = p.value
        return [_summary(run, counts.get(run.id, 0), metrics[run.id], stderrs[run.id], memory[run.id]) for run in runs]
