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
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from db.record import PlannedRun
from db.sets import id_ranges
from harness.execution.recorder import new_sweep_id
from harness.execution.runner import RunOutcome, settle_interrupted, skip_stored, store_sweep
from harness.hints import env_command, with_db
from harness.planning.plan import SweepPlan, largest_model, prepare_sweep, stored_params
from harness.planning.spec import RunSpec
from harness.planning.sweep import SweepRequest

if TYPE_CHECKING:
    from db.store import Store
    from harness.progress import JobProgress

Log = Callable[[str], None]
NOTHING_STORED = "interrupted before any run was stored: nothing to continue; run the command again"


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
        try:
            with _planning():
                plans = [] if resume is not None else [prepare_sweep(spec) for spec in request.specs]  # bad names here
        except KeyboardInterrupt:
            say(_interrupted(None, [], request.db))
            raise
        with executor.connected():
            store, chosen = _open_store(request, plans, resume, threads)
            job: list[int] = []  # the ids of the runs this job stored (or the resumed sweep's), as soon as they are
            try:
                outcomes = _run_or_resume(executor, request, plans, store, resume, rerun, chosen, say, job)
            except KeyboardInterrupt:
                say(_interrupted(store, job, request.db))
                store.close()
                raise
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
    job: list[int],
) -> list[RunOutcome]:
    """The runs not already stored finished (unless --rerun), stored as one sweep and executed; or the resumed one.
    `job` gets the ids of the runs as they are stored, for the line an interrupt ends with."""
    skipped = [] if rerun else [outcome for plan in plans for outcome in skip_stored(plan, store, say)]
    if resume is not None:
        job.extend(run.id for run in store.sweep_runs(stored_sweep(store, resume)))
        with _view() as bars:
            return executor.resume(resume, store, chosen.count, bars, _console_log(bars, chosen))
    sweep_id = new_sweep_id()
    queued = []
    for spec, plan in zip(request.specs, plans):
        if plan.runs:
            queued.append(Queued(spec, plan, store_sweep(plan, store, sweep_id)))
            job.extend(run.run_id for run in queued[-1].runs)
    if job:
        say(f"job: {len(job)} runs in {len(queued)} sweep{'s' * (len(queued) != 1)}, stored as runs {id_ranges(job)}")
    executor.prepare(queued, chosen.count)
    with _view() as bars:
        return skipped + executor.run(store, bars, _console_log(bars, chosen))


@contextlib.contextmanager
def _view() -> Iterator[JobProgress]:
    """The job's live view; after Ctrl-C its job line says so instead of an ETA (the job's last line says the rest)."""
    from harness.progress import JobProgress

    with JobProgress() as bars:
        try:
            yield bars
        except KeyboardInterrupt:
            bars.interrupted()
            raise


def stored_sweep(store: Store, run_id: int) -> str:
    """The sweep a stored run belongs to (the run is known to exist: `_open_store` checked it)."""
    run = store.get_run(run_id)
    assert run is not None
    return str(run.sweep_id)


def _interrupted(store: Store | None, job: list[int], db: str | None) -> str:
    """The one line a job ends with after Ctrl-C or SIGTERM: how many of its runs finished, and the one command that
    continues them all (`--resume` of one run completes its whole sweep, and a job is one sweep). Runs it never
    reached are stored as interrupted, as the ones it stopped are."""
    if store is None or not job:
        return NOTHING_STORED
    settle_interrupted(store, job)
    states = store.run_progress(job)
    count = Counter(status for status, _ in states.values())
    line = f"{count['finished']} of {len(job)} runs finished" + (
        f", {count['failed']} failed" if count["failed"] else ""
    )
    left = [run_id for run_id in job if states[run_id][0] != "finished"]
    if not left:
        return line
    resume = with_db(f"{env_command('loopeval')} run --resume {left[0]}", db)
    return f"{line}, {len(left) - count['failed']} interrupted; continue with: {resume}"


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
