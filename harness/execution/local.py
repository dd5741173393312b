"""The local executor (`--executor local`, the default): a job's runs in this process one after another, each model
loaded once, or in worker processes side by side when the cores allow (`harness.execution.pool`). It never imports
Ray. `--resume` completes every unfinished run of the resumed run's sweep, in this process."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from harness.execution.executor import Log, Queued
from harness.execution.pool import Workers, default_workers, groups
from harness.execution.runner import RunOutcome, resume_run, run_stored
from harness.planning.sweep import SweepRequest

if TYPE_CHECKING:
    from db.store import Store
    from harness.progress import JobProgress


class LocalExecutor:
    """Runs in this process, or in the worker processes `prepare` forks (before any thread starts here)."""

    def __init__(self, request: SweepRequest) -> None:
        self.request = request
        self.queued: list[Queued] = []
        self.workers: Workers | None = None

    def preflight(self) -> None:
        """Nothing to check: this machine is where the runs execute."""

    def connected(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def prepare(self, queued: list[Queued], threads: int) -> None:
        """Fork worker processes when more than one run would go at once: one group of runs (one model), one core
        to spare per run, or --workers 1 run in this process."""
        from adapters.threads import cores
        from db.session import resolve_db_url

        self.queued = queued
        devices = [device for q in queued for device in q.plan.devices.values()]
        wanted = self.request.workers or default_workers(threads, cores(), devices)
        run_groups = [group for q in queued for group in groups(q.spec, q.plan, q.runs)] if wanted > 1 else []
        if len(run_groups) >= 2:
            self.workers = Workers.start(run_groups, resolve_db_url(self.request.db), min(wanted, len(run_groups)))

    def run(self, store: Store, progress: JobProgress, log: Log) -> list[RunOutcome]:
        if self.workers is not None:
            return self.workers.wait(store, progress, log, len(self.queued))
        progress.start_job(sum(len(q.runs) for q in self.queued), len(self.queued))
        return [
            outcome
            for q in self.queued
            for outcome in run_stored(q.spec, q.runs, q.plan.task_configs, store, progress, log, q.plan.loaded)
        ]

    def resume(self, run_id: int, store: Store, threads: int, progress: JobProgress, log: Log) -> list[RunOutcome]:
        return resume_run(run_id, store, self.request.db, progress=progress, log=log)
