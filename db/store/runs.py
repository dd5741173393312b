"""The store's runs: stored (a sweep's whole, at once), updated and closed, and read back one or a sweep at a time.

An eval run's evaluation set id (`db.sets.EvalSet.id`) is hashed here, once, as the run is written
(`runs.set_id`): every view reads it instead of hashing the set's columns again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select

from db.models import Run, Sample, utcnow
from db.sets import SET_COLUMNS, run_key, run_set
from db.store.base import Transactions
from db.stored import damaged_runs, require_intact


def _set_id(run: Mapping[str, Any]) -> str | None:
    """The evaluation set id of a run given as its `runs` columns (a new run's row: "eval" is the default kind);
    None for a profile or a probe, which evaluate no set."""
    return run_set(run).id if run.get("kind", "eval") == "eval" else None


class Runs(Transactions):
    """Writes and reads of `runs` rows. A run holding a damaged value (`db.stored`) is refused by name where one
    run is asked for (`get_run`, `sweep_runs`) and left out where runs are compared (`finished_run_keys`)."""

    def create_run(self, **fields: Any) -> int:
        """Insert a run (status "running" unless given) and return its id."""
        return self.create_runs([fields])[0]

    def create_runs(self, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert runs in one transaction, all or none (a sweep is stored whole), and return their ids in order."""
        with self._write() as session:
            runs = [Run(**fields, set_id=_set_id(fields)) for fields in rows]
            session.add_all(runs)
            session.flush()
            return [run.id for run in runs]

    def update_run(self, run_id: int, **fields: Any) -> None:
        with self._write() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise KeyError(f"no run {run_id}")
            for name, value in fields.items():
                setattr(run, name, value)
            if fields.keys() & {*SET_COLUMNS, "kind"}:  # what its set is made of: the stored id follows
                run.set_id = _set_id(vars(run))

    def finish_run(self, run_id: int, status: str, *, error: str | None = None, **fields: Any) -> None:
        """Close a run with its final status (finished, failed, interrupted) and timings."""
        self.update_run(run_id, status=status, error=error, finished_at=utcnow(), **fields)

    def get_run(self, run_id: int) -> Run | None:
        """The run row (detached, attributes loaded), or None; DamagedRun when it holds a damaged value."""
        require_intact(self.engine, run_id)
        with self._read() as session:
            return session.get(Run, run_id)

    def sweep_runs(self, sweep_id: str) -> list[Run]:
        """Every run of a sweep, in the order they were stored (the order the sweep runs them); DamagedRun for the
        first of them holding a damaged value."""
        with self._read() as session:
            ids = list(session.scalars(select(Run.id).where(Run.sweep_id == sweep_id)))
        for damaged in damaged_runs(self.engine, ids).values():
            raise damaged
        with self._read() as session:
            return list(session.scalars(select(Run).where(Run.sweep_id == sweep_id).order_by(Run.id)))

    def finished_run_keys(self) -> dict[str, int]:
        """`db.sets.run_key` of every finished eval run -> the newest such run's id (what a rerun would repeat).
        A run holding a damaged value is left out: what it was cannot be told, so nothing is skipped as its twin."""
        columns = [
            Run.id,
            Run.model_spec,
            Run.loops,
            Run.suite,
            Run.tasks,
            Run.limit,
            Run.sampling,
            Run.data_fingerprint,
            Run.seed,
            Run.spec,
            Run.exit_threshold,
            Run.exit_criterion,
            Run.kv_policy,
            Run.kv_dtype,
            Run.model_config,  # the KV strategy an older run's KV setting resolves by (`db.sets.configuration`)
        ]
        damaged = list(damaged_runs(self.engine))
        with self._read() as session:
            rows = session.execute(
                select(*columns)
                .where(Run.kind == "eval", Run.status == "finished", Run.id.not_in(damaged))
                .order_by(Run.id)
            )
            return {run_key(row._mapping): row.id for row in rows}

    def run_progress(self, run_ids: Iterable[int]) -> dict[int, tuple[str, int]]:
        """Status of each run, with the samples a running one has stored (0 for the others): what a sweep's
        submitter polls to show progress. Only running runs are counted, so a poll stays cheap however many
        samples the finished ones hold."""
        ids = list(run_ids)
        with self._read() as session:
            statuses = session.execute(select(Run.id, Run.status).where(Run.id.in_(ids))).all()
            running = [run_id for run_id, status in statuses if status == "running"]
            counted = select(Sample.run_id, func.count()).where(Sample.run_id.in_(running)).group_by(Sample.run_id)
            counts = dict(session.execute(counted).all())
        return {run_id: (status, counts.get(run_id, 0)) for run_id, status in statuses}
