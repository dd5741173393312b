"""The write API of the results store, plus the run summary that `loopeval results` prints.

Each call is one short transaction, so a run commits samples as they finish and several processes
can share one SQLite file (db.session serialises writers with `BEGIN IMMEDIATE` and a busy timeout)
or, across machines, one Postgres database.
The store takes and returns plain values (dicts, ints); harness types stay in the harness.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, UTC
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.orm import Session

from db.headline import headline
from db.sets import KV_AXIS, configuration, run_key, run_set
from db.models import MemoryPeak, MemorySample, ProbeValue, ProfilePoint, Run, Sample, TaskMetric, utcnow
from db.session import display_url, open_engine, open_existing, session_factory
from db.stored import damaged_runs, hide_damaged, require_intact
from measures import BY_NAME, merged_peak

SAMPLE_FIELDS = (
    "task", "doc_id", "sample_index", "prompt", "output", "gold", "score", "prompt_tokens",
    "generated_tokens", "loops_used", "loops_histogram", "finish_reason", "latency_seconds", "decode_seconds",
)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver them as they came.

    Python raises KeyboardInterrupt at whatever line runs when the signal lands. Inside SQLAlchemy's
    transaction and pool bookkeeping that can leave a connection checked out with SQLite's write lock
    held, so the process's next write (storing its run as interrupted) waits on itself until the busy
    timeout and the sweep ends "database is locked" (seen in 2 of 3,000 random interrupts of a progress read).
    A block lasts one short transaction, at most the busy timeout. Only the main thread handles
    signals; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]  # None: set outside Python
    previous = {s: signal.signal(s, lambda signum, _frame: received.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in received[:1]:  # one is enough: the handler stops the work in hand
            signal.raise_signal(signum)


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands timezone-aware columns back naive; they were written in UTC."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _set_fields(run: Run) -> dict[str, str | None]:
    """A run's evaluation set (db.sets), id and label: only runs of one set are compared. Profiles have none."""
    if run.kind != "eval":
        return {"set_id": None, "set_label": None}
    evaluation = run_set(vars(run))
    return {"set_id": evaluation.id, "set_label": evaluation.label}


class Store:
    """One results database. `Store.open(url)` validates, creates or migrates it first; `Store.read(url)`
    opens an existing one (for a read command, or `--resume` with `write`) and never creates anything.

    A run holding a damaged value (`db.stored`) is refused by name where one run is asked for (`get_run`,
    `sweep_runs`), left out where runs are compared (`finished_run_keys`), and hidden from every read of a
    read command's store by `hide_damaged`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._session = session_factory(engine)

    @classmethod
    def open(cls, url: str | None = None) -> Store:
        return cls(open_engine(url))

    @classmethod
    def read(cls, url: str | None = None, write: bool = False) -> Store:
        return cls(open_existing(url, write))

    def hide_damaged(self) -> list[str]:
        """Leave the runs holding a damaged value out of every later read (`db.stored.hide_damaged`): for a
        store that only reads. Returns one line per run left out, for the command to print."""
        return hide_damaged(self.engine)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """A session for reads, with interrupts held until it is closed (`interrupts_held`)."""
        with interrupts_held(), self._session() as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One transaction, committed at the end of the block, with interrupts held until it ends."""
        with interrupts_held(), self._session.begin() as session:
            yield session

    @property
    def url(self) -> str:
        return display_url(self.engine.url)

    def close(self) -> None:
        self.engine.dispose()

    # --- runs -------------------------------------------------------------------------------

    def create_run(self, **fields: Any) -> int:
        """Insert a run (status "running" unless given) and return its id."""
        return self.create_runs([fields])[0]

    def create_runs(self, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert runs in one transaction, all or none (a sweep is stored whole), and return their ids in order."""
        with self._write() as session:
            runs = [Run(**fields) for fields in rows]
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

    def finish_run(self, run_id: int, status: str, *, error: str | None = None, **fields: Any) -> None:
        """Close a run with its final status (finished, failed, interrupted) and timings."""
        self.update_run(run_id, status=status, error=error, finished_at=utcnow(), **fields)

    def sweep_runs(self, sweep_id: str) -> list[Run]:
        """Every run of a sweep, in the order they were stored (the order the sweep runs them); DamagedRun for the
        first of them holding a damaged value."""
        with self._read() as session:
            ids = list(session.scalars(select(Run.id).where(Run.sweep_id == sweep_id)))
        for damaged in damaged_runs(self.engine, ids).values():
            raise damaged
        with self._read() as session:
            return list(session.scalars(select(Run).where(Run.sweep_id == sweep_id).order_by(Run.id)))

    def take_lease(self, run_id: int, owner: str, seconds: float, lapsed: Callable[[str], bool]) -> str | None:
        """Hold run `run_id` for `owner` for `seconds`; returns None, or the other owner holding it.

        A lease passes to a new owner when it has expired or `lapsed(holder)` says its holder is gone
        (a killed process on this machine). Done in one write transaction, so two processes racing for
        one run cannot both win.
        """
        now = utcnow()
        with self._write() as session:
            run = session.get(Run, run_id, with_for_update=True)
            if run is None:
                raise KeyError(f"no run {run_id}")
            holder, until = run.lease_owner, _aware(run.lease_until)
            if holder and holder != owner and until is not None and until > now and not lapsed(holder):
                return holder
            run.lease_owner, run.lease_until = owner, now + timedelta(seconds=seconds)
        return None

    def lease_holder(self, run_id: int, lapsed: Callable[[str], bool]) -> str | None:
        """Who holds run `run_id` now (an unexpired lease whose holder is not `lapsed`), or None."""
        run = self.get_run(run_id)
        until = _aware(run.lease_until) if run is not None else None
        if run is None or not run.lease_owner or until is None or until <= utcnow() or lapsed(run.lease_owner):
            return None
        return run.lease_owner

    def release_lease(self, run_id: int, owner: str) -> None:
        with self._write() as session:
            session.execute(update(Run).where(Run.id == run_id, Run.lease_owner == owner).values(lease_owner=None, lease_until=None))

    def finished_run_keys(self) -> dict[str, int]:
        """`db.sets.run_key` of every finished eval run -> the newest such run's id (what a rerun would repeat).
        A run holding a damaged value is left out: what it was cannot be told, so nothing is skipped as its twin."""
        columns = [Run.id, Run.model_spec, Run.loops, Run.suite, Run.tasks, Run.limit, Run.sampling,
                   Run.data_fingerprint, Run.seed, Run.spec, Run.exit_threshold, Run.exit_criterion, Run.kv_policy, Run.kv_dtype]
        damaged = list(damaged_runs(self.engine))
        with self._read() as session:
            rows = session.execute(select(*columns).where(Run.kind == "eval", Run.status == "finished",
                                                          Run.id.not_in(damaged)).order_by(Run.id))
            return {run_key(row._mapping): row.id for row in rows}

    def get_run(self, run_id: int) -> Run | None:
        """The run row (detached, attributes loaded), or None; DamagedRun when it holds a damaged value."""
        require_intact(self.engine, run_id)
        with self._read() as session:
            return session.get(Run, run_id)

    # --- samples ----------------------------------------------------------------------------

    def add_samples(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Commit samples now; rows already stored for (run, task, doc_id, sample_index) are skipped.

        Skipping rather than failing is what makes `--resume` safe when a batch is re-generated.
        Returns how many rows were new.
        """
        rows = [{name: row.get(name) for name in SAMPLE_FIELDS} for row in rows]
        if not rows:
            return 0
        with self._write() as session:
            existing = set(
                session.execute(
                    select(Sample.task, Sample.doc_id, Sample.sample_index).where(
                        Sample.run_id == run_id,
                        Sample.task.in_({row["task"] for row in rows}),
                        Sample.doc_id.in_({str(row["doc_id"]) for row in rows}),
                    )
                ).all()
            )
            new: list[dict[str, Any]] = []
            for row in rows:
                key = (row["task"], str(row["doc_id"]), int(row["sample_index"]))
                if key not in existing:
                    existing.add(key)
                    new.append({**row, "run_id": run_id, "doc_id": key[1]})
            if new:  # one executemany INSERT: the ORM's per-object flush costs more than a tiny model's batch
                new.sort(key=lambda row: (row["task"], row["doc_id"], int(row["sample_index"])))  # one lock order: no deadlock
                session.execute(self._insert_samples(), new)
            return len(new)

    def _insert_samples(self) -> Any:
        """The samples INSERT. On Postgres it skips rows another transaction stored meanwhile: two workers
        can hold one run when a Ray node is lost but its process lives on, and the second must not fail.
        (SQLite's `BEGIN IMMEDIATE` already makes the check above and this insert one atomic step.)"""
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as postgres_insert

            return postgres_insert(Sample).on_conflict_do_nothing(index_elements=["run_id", "task", "doc_id", "sample_index"])
        return insert(Sample)

    def set_sample_scores(self, run_id: int, scores: Mapping[tuple[str, str, int], float | None]) -> None:
        """Fill in scores once the suite is scored: (task, doc_id, sample_index) -> score."""
        with self._write() as session:
            keys = session.execute(
                select(Sample.id, Sample.task, Sample.doc_id, Sample.sample_index).where(Sample.run_id == run_id)
            )
            updates = [{"id": id_, "score": scores[(task, doc, idx)]} for id_, task, doc, idx in keys if (task, doc, idx) in scores]
            if updates:  # ORM bulk UPDATE by primary key, one executemany
                session.execute(update(Sample), updates)

    def samples(self, run_id: int, task: str | None = None) -> list[Sample]:
        with self._read() as session:
            query = select(Sample).where(Sample.run_id == run_id)
            if task is not None:
                query = query.where(Sample.task == task)
            return list(session.scalars(query.order_by(Sample.task, Sample.doc_id, Sample.sample_index)))

    def run_progress(self, run_ids: Iterable[int]) -> dict[int, tuple[str, int]]:
        """Status of each run, with the samples a running one has stored (0 for the others): what a sweep's
        submitter polls to show progress. Only running runs are counted, so a poll stays cheap however many
        samples the finished ones hold."""
        ids = list(run_ids)
        with self._read() as session:
            statuses = session.execute(select(Run.id, Run.status).where(Run.id.in_(ids))).all()
            running = [run_id for run_id, status in statuses if status == "running"]
            counts = dict(session.execute(
                select(Sample.run_id, func.count()).where(Sample.run_id.in_(running)).group_by(Sample.run_id)).all())
        return {run_id: (status, counts.get(run_id, 0)) for run_id, status in statuses}

    # --- metrics, memory, profile -----------------------------------------------------------

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
        rows = [{**row, "run_id": run_id} for row in rows]
        if rows:
            with self._write() as session:
                session.execute(insert(MemorySample), rows)

    def merge_memory_peaks(self, run_id: int, peaks: Mapping[str, int | None]) -> None:
        """Merge `peaks` into the stored ones by `measures.merged_peak` (a resumed run keeps earlier stretches' peaks)."""
        merged = dict(self.memory_peaks(run_id))
        for name, value in peaks.items():
            merged[name] = merged_peak(name, merged.get(name), value)
        self.set_memory_peaks(run_id, merged)

    def set_memory_peaks(self, run_id: int, peaks: Mapping[str, int | None]) -> None:
        """Replace the run's peaks: `measures` name -> bytes, None where the source was unavailable."""
        with self._write() as session:
            session.execute(delete(MemoryPeak).where(MemoryPeak.run_id == run_id))
            session.add_all(MemoryPeak(run_id=run_id, measure=name, kind=BY_NAME[name].stored_as, value=value)
                            for name, value in peaks.items())

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
            session.add_all(ProbeValue(run_id=run_id, **{**row, "value": None if math.isnan(row["value"]) else row["value"]})
                            for row in rows)

    # --- reading ----------------------------------------------------------------------------

    def run_summaries(self, kind: str | None = None) -> list[dict[str, Any]]:
        """One plain dict per run, oldest first: identity, status, sample count, metrics and memory peaks."""
        with self._read() as session:
            query = select(Run).order_by(Run.id)
            if kind is not None:
                query = query.where(Run.kind == kind)
            runs = list(session.scalars(query))
            counts = dict(session.execute(select(Sample.run_id, func.count()).group_by(Sample.run_id)).all())
            metrics: dict[int, dict[str, dict[str, float | None]]] = defaultdict(lambda: defaultdict(dict))
            stderrs: dict[int, dict[str, dict[str, float | None]]] = defaultdict(lambda: defaultdict(dict))
            for m in session.scalars(select(TaskMetric)):
                metrics[m.run_id][m.task][m.metric] = m.value
                stderrs[m.run_id][m.task][m.metric] = m.stderr
            memory: dict[int, dict[str, int | None]] = defaultdict(dict)
            for p in session.scalars(select(MemoryPeak)):
                memory[p.run_id][p.measure] = p.value
        return [
            {
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
                "n_samples": counts.get(run.id, 0),
                "metrics": {task: dict(values) for task, values in metrics[run.id].items()},
                # one pass@1 per benchmark and their unweighted mean (db.headline), what the tables show
                "pass_at_1": dataclasses.asdict(headline(metrics[run.id], run.suite)),
                "stderr": {task: dict(values) for task, values in stderrs[run.id].items()},
                "memory": dict(memory[run.id]),
                # the KV policy and dtype it ran with: where swept its own (`overrides` holds them too), else as the
                # adapter described itself (None if it did not), and what one more token of context adds to its KV cache
                **{key: getattr(run, key) or (run.model_config or {}).get(key) for key in KV_AXIS},
                "kv_bytes_per_token": (run.model_config or {}).get("kv_bytes_per_token"),
                "started_at": run.started_at.isoformat() if run.started_at else None,
                "wall_seconds": run.wall_seconds,
                "generate_seconds": run.generate_seconds,
                "energy_joules": run.energy_joules,
            }
            for run in runs
        ]
