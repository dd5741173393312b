"""Worker processes of the local executor: a sweep's runs side by side on this machine's cores.

A tiny model decodes fastest on one thread (`adapters.threads`), so a sweep of tiny models run one
after another leaves every core but one idle. With more than one worker the local executor forks that
many processes once the sweep is planned and stored (the evaluation stack, already imported, is shared
instead of imported again), and each worker takes the next group of runs from a queue. A group is one
RunSpec's runs of one model, so a worker loads each model once; groups are handed out largest first,
so the workers finish close together. A worker runs its groups exactly as the in-process executor runs
a sweep (`harness.execution.runner.run_stored`): samples committed as they finish, each run's lease held, memory
sampled in the worker's own process (RSS is the worker's). The parent draws the progress from the
store, as the Ray executor does, and prints the workers' log lines.

What survives: Ctrl-C or SIGTERM interrupts every worker (each stores its run as interrupted); a worker
whose parent dies is sent SIGTERM; a run whose worker died, and runs no worker reached, are stored as
interrupted, and `--resume` of any of them completes the sweep.

The default is as many workers as the cores allow at the runs' thread count (`default_workers`).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from typing import TYPE_CHECKING, Any

from adapters.base import interrupt
from db import ResultsError
from db.record import PlannedRun
from db.store.base import interrupts_held
from harness.execution.bars import RunBars
from harness.execution.runner import (
    RunOutcome,
    run_stored,
    settle_interrupted,
    sigterm_as_interrupt,
    stored_row,
)
from harness.planning.plan import SweepPlan
from harness.planning.spec import RunSpec

if TYPE_CHECKING:
    from harness.progress import JobProgress

    from db.store import Store

POLL_SECONDS = (
    0.5  # how often the parent reads the store's progress and the workers' log lines (CPU the workers would use)
)
GRACE_SECONDS = 30.0  # after Ctrl-C, how long workers get to store their runs as interrupted
UNLIMITED_DOCS = 10_000  # a run without --limit counts this many docs per task when groups are ordered by size


@dataclass
class RunGroup:
    """One RunSpec's runs of one model, in order: what a worker runs with the model loaded once."""

    spec: RunSpec
    task_configs: list[Any]
    runs: list[PlannedRun]
    adapter: Any = None  # loaded while planning, for adapters that cannot describe themselves from their config
    size: float = 0.0  # decode work, only to hand the largest groups out first


def groups(spec: RunSpec, plan: SweepPlan, runs: Sequence[PlannedRun]) -> list[RunGroup]:
    """A stored sweep's runs (`runner.store_sweep`) as one group per model, each sized by its decode work:
    samples x the model's parameters x loops."""
    samples = (spec.limit or UNLIMITED_DOCS) * len(plan.task_configs) * spec.sampling.n
    by_model: dict[str, RunGroup] = {}
    for run in runs:
        group = by_model.setdefault(run.model, RunGroup(spec, plan.task_configs, [], plan.loaded.get(run.model)))
        group.runs.append(run)
        group.size += samples * (plan.params.get(run.model) or 1) * (run.loops or 1)
    return list(by_model.values())


def default_workers(threads: int, cores: int, devices: Sequence[str]) -> int:
    """Runs side by side: the cores over each run's threads; one when a run uses a GPU (runs would share its memory)."""
    return 1 if any(device.startswith("cuda") for device in devices) else max(1, cores // threads)


class Workers:
    """Forked worker processes running a list of run groups; `start` them before any thread starts here."""

    def __init__(self, groups: list[RunGroup], processes: list[Any], lines: Any) -> None:
        self.groups, self.processes, self.lines = groups, processes, lines
        self.failure: str | None = None  # a worker's store failed (disk full, unreachable): the sweep ends with it

    @classmethod
    def start(cls, run_groups: list[RunGroup], db_url: str, workers: int) -> Workers:
        """Fork `workers` processes that take the groups, largest first, until none is left."""
        context = multiprocessing.get_context("fork")
        todo, lines = context.SimpleQueue(), context.SimpleQueue()
        for index in sorted(range(len(run_groups)), key=lambda i: -run_groups[i].size):
            todo.put(index)
        for _ in range(workers):
            todo.put(None)
        processes = [
            context.Process(target=_work, args=(run_groups, todo, lines, db_url), name=f"loopeval worker {k + 1}")
            for k in range(workers)
        ]
        # Held until every worker has started: a Ctrl-C landing inside fork's handlers (logging's at-fork lock
        # release) is printed as "Exception ignored" and lost there, and the job would run on to its end.
        with interrupts_held():
            for process in processes:
                process.start()
        return cls(run_groups, processes, lines)

    def wait(
        self, store: Store, progress: JobProgress | None, log: Callable[[str], None], sweeps: int
    ) -> list[RunOutcome]:
        """Draw the job's progress (its runs in `sweeps` sweeps) from the store until every worker has ended; one
        outcome per run, in order.

        Ctrl-C or SIGTERM here interrupts the workers, waits for them to store their runs and stores the
        runs they never reached as interrupted."""
        runs = [run for group in self.groups for run in group.runs]
        ids = [run.run_id for run in runs]
        bars = RunBars(progress, runs, sweeps, counts=False)  # each run's closing line counts it
        try:
            with sigterm_as_interrupt():
                while alive := [process.sentinel for process in self.processes if process.is_alive()]:
                    self._print(log, progress)
                    bars.update(store.run_progress(ids))
                    connection.wait(alive, POLL_SECONDS)  # back at once when a worker ends
        except KeyboardInterrupt:
            self._interrupt()
            raise
        finally:
            self._join()
            self._print(log, progress)
            settle_interrupted(store, ids)
            bars.update(store.run_progress(ids))
        if self.failure is not None:
            raise ResultsError(self.failure)
        return _outcomes(store, runs)

    def _join(self) -> None:
        """Every worker ended: those still alive after the grace period are killed, so no run is left held."""
        deadline = time.monotonic() + GRACE_SECONDS
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()

    def _print(self, log: Callable[[str], None], progress: JobProgress | None) -> None:
        """The workers' messages: log lines, runs' closing lines (counted on the job's line as they are printed), and
        a store failure, which ends the sweep once every worker has."""
        while not self.lines.empty():
            kind, text = self.lines.get()
            if kind == "failure":
                self.failure = self.failure or text
            elif kind == "ended" and progress is not None:
                progress.ended(text, True, log)
            else:
                log(text)

    def _interrupt(self) -> None:
        """Ctrl-C reaches every process of the terminal's group; a signal sent to this process alone is passed on."""
        for process in self.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGINT)


def _work(run_groups: list[RunGroup], todo: Any, lines: Any, db_url: str) -> None:
    """A worker: take groups until the queue says stop, running each with its own store connection.

    SIGTERM (a killed parent's included) stops the worker as Ctrl-C does wherever it lands, not only inside
    a run's generation (a store call in hand finishes first: `db.store.base.interrupts_held`); the worker then
    stores its own group's unfinished runs as interrupted, since the parent that would otherwise do it may
    be gone."""
    from db.store import Store

    signal.signal(signal.SIGINT, interrupt)  # not the handler the parent held while forking it
    signal.signal(signal.SIGTERM, interrupt)
    _die_with_parent()
    try:
        store = Store.open(db_url)  # never the parent's connection: a database connection does not survive a fork
    except ResultsError as exc:
        lines.put(("failure", str(exc)))
        return
    group: RunGroup | None = None
    try:
        while (index := todo.get()) is not None:
            group = run_groups[index]
            loaded = {group.runs[0].model: group.adapter} if group.adapter is not None else None
            run_stored(
                group.spec,
                group.runs,
                group.task_configs,
                store,
                None,
                lambda line: lines.put(("log", line)),
                loaded,
                starts=False,
                ended=lambda line, counted: lines.put(("ended" if counted else "log", line)),
            )
    except KeyboardInterrupt:
        # Ctrl-C reaches the worker twice (the terminal's, then the parent's passed on): the second must not cut
        # short the storing of its runs as interrupted
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if group is not None:
            settle_interrupted(store, [run.run_id for run in group.runs])
    except ResultsError as exc:  # the store failed: every later run would too
        lines.put(("failure", str(exc)))
    finally:
        store.close()


def _die_with_parent() -> None:
    """Linux: SIGTERM this worker when its parent dies (kill -9 included), so its run is stored as interrupted."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def _outcomes(store: Store, runs: list[PlannedRun]) -> list[RunOutcome]:
    """How each run ended, as its worker stored it."""
    outcomes = []
    for run in runs:
        row = stored_row(store, run.run_id)
        outcomes.append(RunOutcome(run, row.status, error=row.error))
    return outcomes
