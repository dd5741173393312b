"""What a long command shows while it works: rich progress bars, and the live view of a whole `loopeval run`.

A job (the default run: the recurrence lab's depth sweep, then the headline sweep) can hold dozens of runs
and take an hour. Its view stays a few lines tall, whatever the terminal, so the present is always on
screen: the job (runs done of all, what is left, an ETA from the runs finished so far), the sweep
running now with its current run, and that run's own bars (the bridge's `generating`). When a run
ends its bars go; what stays above the view is the one line the runner logs for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text


class _Remaining(ProgressColumn):
    """The task's `remaining` field: the job's ETA, blank for every other bar."""

    def render(self, task: Any) -> Text:
        return Text(task.fields.get("remaining", ""), style="progress.remaining")


class _Count(MofNCompleteColumn):
    """`done/total`, or where the total is not known (a run's bar drawn from the store: its samples stored so far)
    the count alone, "37 done", never rich's "37/?"."""

    def render(self, task: Any) -> Text:
        if task.total is None:
            return Text(f"{int(task.completed)} done", style="progress.download")
        return super().render(task)


def columns() -> tuple[ProgressColumn, ...]:
    """One bar's columns, each on one line at 80 columns: what it is (stored names shown as written, never as
    console markup; cut with an ellipsis when long), a short bar, count, time, and the job's ETA."""
    return (
        TextColumn("{task.description}", markup=False, table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
        BarColumn(bar_width=12),
        _Count(),
        TimeElapsedColumn(),
        _Remaining(table_column=Column(no_wrap=True)),
    )


def eta_text(elapsed: float, done: int, left: int) -> str:
    """What is left of a job at the pace of its finished runs (elapsed / done x left): 'ETA 0:03:10'."""
    if left == 0:
        return "done"
    if done == 0:
        return "ETA after 1 run"
    return f"ETA {clock(elapsed / done * left)}"


def clock(seconds: float) -> str:
    """Seconds as H:MM:SS, as the view's elapsed and ETA columns show time."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class JobProgress(Progress):
    """The live view of one job: `start_job`, then per part of it `start_sweep`, per run `start_run` and `end_run`;
    where runs go side by side (`harness.execution.pool`, Ray) a `RunBars` draws them from the store and calls `count_run`.

    It is a rich `Progress`, so the bridge and the Ray executor add their bars to it as to any other.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(*columns(), transient=False, **kwargs)
        self._job: TaskID | None = None
        self._sweep: TaskID | None = None
        self._sweeps = (0, 0)  # (this sweep's number, how many)
        self._kept: set[TaskID] = set()  # bars that outlive a run: the job's and the sweep's
        self._began = time.monotonic()
        self._done = 0

    def start_job(self, runs: int, sweeps: int) -> None:
        """The job's line: `runs` runs in `sweeps` sweeps, none done yet."""
        self._began, self._done, self._sweeps = time.monotonic(), 0, (0, sweeps)
        self._job = self.add_task(
            f"job: {sweeps} sweep{'s' * (sweeps != 1)}", total=runs, remaining=eta_text(0, 0, runs)
        )
        self._kept.add(self._job)

    def start_sweep(self, runs: int) -> None:
        """The line of the sweep that runs now (the previous sweep's line goes)."""
        if self._job is None:  # a sweep on its own (resume, a Ray submission): it is the job
            self.start_job(runs, 1)
        if self._sweep is not None:
            self._drop(self._sweep)
        number, count = self._sweeps[0] + 1, self._sweeps[1]
        self._sweeps = (number, count)
        self._sweep = self.add_task(f"sweep {number}/{count}", total=runs)
        self._kept.add(self._sweep)

    def start_run(self, label: str) -> None:
        """Name the run that starts on the sweep's line."""
        if self._sweep is not None:
            sweep = self._tasks[self._sweep].description.split(": ", 1)[0]
            self.update(self._sweep, description=f"{sweep}: {label}")

    def end_run(self) -> None:
        """The run is over: its bars go and the sweep counts it (the job counts it with its line, `ended`)."""
        for task_id in [t for t in self.task_ids if t not in self._kept]:
            self._drop(task_id)
        if self._sweep is not None:
            self.advance(self._sweep)

    def ended(self, line: str, counted: bool, log: Callable[[str], None]) -> None:
        """Log a run's closing line; a run that is over (`counted`: finished or failed, not interrupted) is then
        counted on the job's line.

        Where the output is no terminal (`loopeval run > run.log`) there is no live view to read the count from, so
        the line itself starts with it and the job's time so far, "14/95 0:01:23 run 14 ...": `tail -f` tells 10%
        from 90%, and the lines count up in the order they are written, whichever worker ran them."""
        from db.store.base import interrupts_held

        if counted and self._job is not None and not self.console.is_terminal:
            total = int(self._tasks[self._job].total or 0)
            line = f"{self._done + 1}/{total} {clock(time.monotonic() - self._began)} {line}"
        with interrupts_held():  # Ctrl-C mid-print would leave the line printed twice and the run not counted
            log(line)
            if counted:
                self.count_run()

    def count_run(self) -> None:
        """One more run of the job is over (several may run at once: worker processes, Ray tasks)."""
        if self._job is not None:
            self._done += 1
            job = self._tasks[self._job]
            left = int(job.total or 0) - self._done
            self.update(
                self._job, completed=self._done, remaining=eta_text(time.monotonic() - self._began, self._done, left)
            )

    def interrupted(self) -> None:
        """The job was stopped: its line keeps the count of runs done and says so where the ETA was."""
        if self._job is not None:
            self.update(self._job, remaining="interrupted")

    def _drop(self, task_id: TaskID) -> None:
        self.remove_task(task_id)
        self._kept.discard(task_id)
