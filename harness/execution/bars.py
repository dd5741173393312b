"""The progress of runs going side by side (worker processes, Ray tasks), drawn from the store: the one place where
every process writes how far its run has got."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from db.record import PlannedRun
from harness.execution.runner import run_label

if TYPE_CHECKING:
    from harness.progress import JobProgress


class RunBars:
    """Runs going side by side, drawn from the store on a job's view: the job's line counts the runs that ended,
    and each run has a bar while it runs (samples stored); a run that ends leaves its bar (its worker logs how it
    ended), so the bars on screen are the present."""

    def __init__(
        self, progress: JobProgress | None, runs: list[PlannedRun], sweeps: int = 1, counts: bool = True
    ) -> None:
        self.progress = progress
        self.counts = counts  # False where each run's closing line counts it (`JobProgress.ended`: worker processes)
        self.labels = {run.run_id: run_label(run) for run in runs}
        self.bars: dict[int, Any] = {}
        self.ended: set[int] = set()
        if progress is not None:
            progress.start_job(len(runs), sweeps)

    def update(self, states: dict[int, tuple[str, int]]) -> None:
        if self.progress is None:
            return
        for run_id, (status, samples) in states.items():
            ended = status not in ("queued", "running")
            if ended and run_id not in self.ended:
                self.ended.add(run_id)
                if self.counts and status != "interrupted":
                    self.progress.count_run()
            bar = self.bars.get(run_id)
            if bar is None and status == "running":
                bar = self.bars[run_id] = self.progress.add_task(f"{self.labels[run_id]}: running", total=None)
            if bar is not None and ended:
                self.progress.remove_task(self.bars.pop(run_id))
            elif bar is not None:
                self.progress.update(bar, completed=samples)
