"""The executor interface, and one `loopeval run` job through it: plan, open the store, store the runs, execute.

An `Executor` is where a job's stored runs execute: `LocalExecutor` (`harness.execution.local`: this process, or
its forked workers) or `RayExecutor` (`harness.execution.ray_executor`: one Ray task per run). Both get the same
stored runs (`db.record.PlannedRun`, with their ids) and return one `RunOutcome` per run; everything else a job
does, planning, the thread count, the store, the runs already stored, is `run_job`'s, once for both.
See docs/architecture.md ("Executors") for what each executor guarantees.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from db.record import PlannedRun
from harness.execution.recorder import new_sweep_id
from harness.execution.runner import RunOutcome, skip_stored, store_sweep
from harness.planning.plan import SweepPlan, largest_model, prepare_sweep, stored_params
from harness.planning.spec import RunSpec
from harness.planning.sweep import SweepRequest

if TYPE_CHECKING:
    from db.store import Store
    from harness.progress import JobProgress

Log = Callable[[str], None]


@dataclass
class Queued:
    """One RunSpec's runs as stored (ids and sweep id set), with the plan they came from."""

    spec: RunSpec
    plan: SweepPlan
    runs: list[PlannedRun]


class Executor(Protocol):
    """Where a job's stored runs execute. `run_job` calls `preflight`, then, planned and with the store open inside
    `connected`, either `resume` or `prepare` and then `run`."""

    def preflight(self) -> None:
        """Refuse in one line what cannot run here, before the seconds planning takes."""

    def connected(self) -> AbstractContextManager[None]:
        """Where the runs execute, reachable for the length of the job."""

    def prepare(self, queued: list[Queued], threads: int) -> None:
        """Make the stored runs ready to go, before the job's view starts a thread in this process."""

    def run(self, store: Store, progress: JobProgress, log: Log) -> list[RunOutcome]:
        """Execute what `prepare` readied; one outcome per run, in order."""

    def resume(self, run_id: int, store: Store, threads: int, progress: JobProgress, log: Log) -> list[RunOutcome]:
        """Continue the stopped run `run_id` (and what of its sweep the executor completes with it)."""


@dataclass
class JobOutcome:
    """What a job leaves: the open store (the caller summarises and closes it) and every run's outcome."""

    store: Store
    outcomes: list[RunOutcome]


def executor_for(request: SweepRequest, plugin_dirs: Sequence[str]) -> Executor:
    """The executor the request names (`--executor`); Ray is imported only for Ray."""
    if request.executor == "ray":
        from harness.execution.ray_executor import RayExecutor

        return RayExecutor(request, plugin_dirs)
    from harness.execution.local import LocalExecutor

    return LocalExecutor(request)


@contextlib.contextmanager
def run_job(
    request: SweepRequest, resume: int | None, rerun: bool, threads: int | None, plugin_dirs: Sequence[str], say: Log
) -> Iterator[JobOutcome]:
    """Run the request's sweeps (or `--resume` one) on its executor; `say` prints the job's lines before its view
    starts. The store stays open for the caller until the block ends; on an error it is closed here."""
    try:
        executor = executor_for(request, plugin_dirs)
        executor.preflight()
        with _planning():
            plans = [] if resume is not None else [prepare_sweep(spec) for spec in request.specs]  # bad names fail here
        with executor.connected():
            store, chosen = _open_store(request, plans, resume, threads)
            try:
                outcomes = _run_or_resume(executor, request, plans, store, resume, rerun, chosen, say)
            except BaseException:
                store.close()  # an open SQLite connection would leave -wal and -shm files beside the database
                raise
        yield JobOutcome(store, outcomes)
    finally:
        gc.unfreeze()  # what `_planning` froze is collectable again once the job is done (tests call it in-process)


def _run_or_resume(
    executor: Executor,
    request: SweepRequest,
    plans: list[SweepPlan],
    store: Store,
    resume: int | None,
    rerun: bool,
    chosen: Any,
    say: Log,
) -> list[RunOutcome]:
    """The runs not already stored finished (unless --rerun), stored as one sweep and executed; or the resumed one."""
    from harness.progress import JobProgress

    skipped = [] if rerun else [outcome for plan in plans for outcome in skip_stored(plan, store, say)]
    if resume is not None:
        with JobProgress() as bars:
            return executor.resume(resume, store, chosen.count, bars, _console_log(bars, chosen))
    sweep_id = new_sweep_id()
    executor.prepare(
        [
            Queued(spec, plan, store_sweep(plan, store, sweep_id))
            for spec, plan in zip(request.specs, plans)
            if plan.runs
        ],
        chosen.count,
    )
    with JobProgress() as bars:
        return skipped + executor.run(store, bars, _console_log(bars, chosen))


@contextlib.contextmanager
def _planning() -> Iterator[None]:
    """Plan with Python's cyclic collector paused, then freeze what planning built (`gc.freeze`) until the job ends.

    Planning imports LightEval, torch and transformers, whose objects live as long as the command, and the
    collector's full passes over them as they grew took about 1.5 s of it (2 s to the first generated token).
    Frozen, no later pass walks them, here or in the worker processes forked after: the use of `gc.freeze` its
    documentation gives, before a fork."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _open_store(
    request: SweepRequest, plans: list[SweepPlan], resume: int | None, requested: int | None
) -> tuple[Store, Any]:
    """The results store (read only to resume: it is never created then) and the thread count of this job, decided
    from its largest model (`adapters.threads`) and checked before anything is written."""
    from adapters.threads import apply, choose
    from db.store import Store
    from harness.execution.runner import resumable_run

    if resume is not None:
        store = Store.read(request.db, write=True)
        try:
            resumable_run(store, resume)  # a run that cannot resume is refused before anything else is said
            chosen = apply(choose(largest_model(stored_params(store, resume)), requested))
        except BaseException:
            store.close()
            raise
    else:
        chosen = apply(choose(largest_model([p for plan in plans for p in plan.params.values()]), requested))
        store = Store.open(request.db)
    return store, chosen


def _console_log(bars: Any, threads: Any) -> Log:
    """A log line printer for the job's view: lines name models and errors, so plain text, never markup.
    The first line the work logs is preceded by the thread count, said once (a refusal before any work says only
    itself). Output that is not a terminal (a file, a pipe, CI) gets each line whole: rich would break it at 80 columns there,
    and a run's line split in two no longer greps as one."""
    said, whole = False, not bars.console.is_terminal

    def log(line: str) -> None:
        nonlocal said
        if not said:
            bars.console.print(f"threads: {threads}", markup=False, soft_wrap=whole)
            said = True
        bars.console.print(line, markup=False, soft_wrap=whole)

    return log
