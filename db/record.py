"""`PlannedRun`: one run as planned, the one record that goes from the plan to the executors, into the store and
back out of it.

The harness plans it from a RunSpec (`harness.planning.plan`), the executors pass it (`harness.execution`), the
store writes its `runs` columns (`columns`, through `harness.execution.recorder.run_row`) and a stored row reads back
as one (`PlannedRun.of`), so nothing between them carries a run as a tuple or reads its axes back from the database.
It lives in `db/` because the store writes and reads it and `db/` never imports harness types; it imports no
sqlalchemy, so light modules may hold one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from db.sets import EvalSet, configuration, run_key, run_set

# The `runs` columns a PlannedRun fills, in its own field names where they differ (`model` is `runs.model_spec`).
_COLUMNS = (
    "loops",
    "suite",
    "limit",
    "seed",
    "data_fingerprint",
    "exit_threshold",
    "exit_criterion",
    "kv_policy",
    "kv_dtype",
    "sweep_id",
)


@dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: a model at a point of each axis (None: the run is not on that axis), on one evaluation set,
    with one seed. `spec` is the request it was planned from as `runs.spec` keeps it (what `--resume` rebuilds the
    RunSpec from); `id` is its `runs` row once stored, `sweep_id` the sweep it was stored in."""

    model: str
    loops: int | None
    suite: str
    tasks: tuple[str, ...]
    sampling: Mapping[str, Any]  # `adapters.base.Sampling` as `runs.sampling` holds it ({}: sampled nothing)
    seed: int
    limit: int | None = None
    data_fingerprint: str | None = None
    exit_threshold: float | None = None
    exit_criterion: str | None = None  # None when the run is off the exit axis
    kv_policy: str | None = None
    kv_dtype: str | None = None
    spec: Mapping[str, Any] = field(default_factory=dict)
    sweep_id: str | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        """`sampling` and `spec` as their JSON columns hold them (lists, not tuples): a run read back equals itself."""
        for name in ("sampling", "spec"):
            object.__setattr__(self, name, json.loads(json.dumps(getattr(self, name))))

    @property
    def run_id(self) -> int:
        """Its `runs` row: what executes a run has it stored first."""
        if self.id is None:
            raise ValueError(f"a run of {self.model} is planned but not stored")
        return self.id

    @property
    def overrides(self) -> dict[str, Any]:
        """The load overrides the request gave this run's model alone (a sweep file's `overrides`), but for its KV
        policy and dtype: the planner stores those resolved in `kv_policy` and `kv_dtype` (`db.sets.resolved_kv`)."""
        return dict((self.spec.get("model_overrides") or {}).get(self.model, {}))

    @property
    def configuration(self) -> dict[str, Any]:
        """What beyond its model, loops and exit point changes the model it runs (`db.sets.configuration`)."""
        return configuration(self.columns())

    @property
    def key(self) -> str:
        """Its identity (`db.sets.run_key`): a finished run with the same key is the same experiment."""
        return run_key(self.columns())

    @property
    def eval_set(self) -> EvalSet:
        return run_set(self.columns())

    def stored(self, run_id: int, sweep_id: str) -> PlannedRun:
        """This run as stored: row `run_id` of sweep `sweep_id`."""
        return replace(self, id=run_id, sweep_id=sweep_id)

    def columns(self) -> dict[str, Any]:
        """The `runs` columns it fills, as the store writes them (lists and dicts: JSON columns)."""
        return {
            "model_spec": self.model,
            "tasks": list(self.tasks),
            "sampling": dict(self.sampling),
            "spec": dict(self.spec),
            **{name: getattr(self, name) for name in _COLUMNS},
        }

    @classmethod
    def of(cls, row: Any) -> PlannedRun:
        """A stored run (a `db.models.Run`, or a mapping of its columns) read back as the run it was planned as."""
        names = ("id", "model_spec", "tasks", "sampling", "spec", *_COLUMNS)
        read = row.get if isinstance(row, Mapping) else lambda name: getattr(row, name)
        values: dict[str, Any] = {name: read(name) for name in names}
        return cls(
            model=values.pop("model_spec"),
            tasks=tuple(values.pop("tasks") or ()),
            sampling=dict(values.pop("sampling") or {}),
            spec=dict(values.pop("spec") or {}),
            **values,
        )
