"""Stored runs executed: each `db.record.PlannedRun` of a sweep generated, scored and measured with its model loaded once.

`store_sweep` stores a plan's runs up front (status "queued"), so any process can run, or continue, a run from its
id alone; `run_stored` runs them in order (what the local executor does in this process, each worker process, and a
Ray task for its one run). While a run generates, a `MemorySampler` thread records memory, every scored sample is
committed at once through `StoreSink` (so Ctrl-C, SIGTERM or a crash keep finished work), and `--resume RUN_ID`
continues a run by skipping the samples already stored.

What a run is (`RunSpec`, the defaults) lives in `harness.planning.spec`, how a sweep's runs are planned in
`harness.planning.plan`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.base import (
    Finished,
    Generation,
    Prompt,
    Request,
    Sampling,
    Scheduling,
    checked_context,
    checked_description,
    checked_generation,
    checked_memory,
    hook,
    interrupt,
    one_line,
)
from db import ResultsError
from db.record import PlannedRun
from db.sets import id_ranges
from harness.errors import UserError
from harness.execution.recorder import (
    FLUSH_SECONDS,
    RunBusy,
    RunRecorder,
    holder_is_gone,
    host_info,
    new_sweep_id,
    run_row,
)
from harness.planning.plan import SweepPlan, load_tasks, stored_spec
from harness.planning.spec import RunSpec, at_loops
from harness.measurement.sampler import MemorySampler

if TYPE_CHECKING:
    from db.store import Store
    from harness.progress import JobProgress

# Where a run's closing line goes: (the line, whether the run is over, finished or failed, and counts as done).
Ended = Callable[[str, bool], None]


class TimedAdapter:
    """The adapter as the bridge sees it: same API, but `generate` is timed and its tokens counted.

    The time inside `generate` is what the harness overhead is measured against; the token count
    feeds the sampler's running `generated_tokens`. Every hook goes through `adapters.base.hook`, so an
    exception in one fails the run with one line.
    """

    def __init__(self, adapter: Any, sampler: MemorySampler, spec: str) -> None:
        self.inner = adapter
        self.sampler = sampler
        self.generate_seconds = 0.0
        self.spec = spec
        self.tokenizer = hook(spec, "tokenizer", getattr, adapter, "tokenizer")
        self.max_context = checked_context(spec, hook(spec, "max_context", getattr, adapter, "max_context"))
        if isinstance(adapter, Scheduling):  # the bridge hands such an adapter whole workloads
            self.generate_requests = self._generate_requests

    def _generate_requests(self, requests: Sequence[Request], on_finished: Callable[[list[Finished]], None]) -> None:
        """`generate_requests`, timed, counting each finished sample's tokens as it arrives."""

        def counted(done: list[Finished]) -> None:
            for _, _, generation in done:
                checked_generation(self.spec, generation)
            self.sampler.add_generated_tokens(sum(g.generated_tokens for _, _, g in done))
            on_finished(done)

        began = time.perf_counter()
        try:
            hook(self.spec, "generate_requests()", self.inner.generate_requests, requests, counted)
        finally:
            self.generate_seconds += time.perf_counter() - began

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        began = time.perf_counter()
        try:
            generated = hook(self.spec, "generate()", self.inner.generate, prompts, sampling)
            generations = [checked_generation(self.spec, g) for g in generated]
        finally:
            self.generate_seconds += time.perf_counter() - began
        self.sampler.add_generated_tokens(sum(g.generated_tokens for g in generations))
        return generations

    def forward_logits(self, input_ids: Any) -> Any:
        return hook(self.spec, "forward_logits()", self.inner.forward_logits, input_ids)

    def memory(self) -> dict[str, int | None]:
        return checked_memory(self.spec, hook(self.spec, "memory()", self.inner.memory))

    def describe(self) -> dict[str, Any]:
        return checked_description(self.spec, hook(self.spec, "describe()", self.inner.describe))

    def __getattr__(self, name: str) -> Any:  # optional adapter extras (reset_memory_peak, ...)
        return getattr(self.inner, name)


class StoreSink:
    """The bridge's SampleSink on top of the store: resume lookups, phase tags, a commit per group of finished samples."""

    def __init__(self, store: Store, run_id: int, sampler: MemorySampler) -> None:
        self.store = store
        self.run_id = run_id
        self.sampler = sampler

    def finished(self, task: str) -> dict[tuple[str, int], Any]:
        from harness.bridge.records import SampleRecord

        names = {f.name for f in dataclasses.fields(SampleRecord)}
        return {
            (row.doc_id, row.sample_index): SampleRecord(**{name: getattr(row, name) for name in names})
            for row in self.store.samples(self.run_id, task)
        }

    def on_batch_start(self, task: str, batch_index: int, n_prompts: int) -> None:
        self.sampler.set_phase(f"task:{task} batch:{batch_index}")

    def on_records(self, records: list[Any]) -> None:
        if self.sampler.failure is not None:  # the adapter's memory() returned a value that cannot be stored
            raise self.sampler.failure
        self.store.add_samples(self.run_id, [vars(record) for record in records])  # shallow: asdict deep-copies


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while a run is going, so either one marks the run interrupted."""
    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class RunOutcome:
    """How a run of the job ended: its record (with its id), its status and, when it finished here, its metrics."""

    run: PlannedRun
    status: str
    metrics: dict[str, dict[str, float | None]] = field(default_factory=dict)
    error: str | None = None

    @property
    def run_id(self) -> int:
        return self.run.run_id


def failure_summary(outcomes: Sequence[RunOutcome]) -> list[str]:
    """The lines that end a sweep with failed runs (none when every run finished)."""
    failed = [o for o in outcomes if o.status in ("failed", "busy")]
    if not failed:
        return []
    lines = [f"{len(failed)} of {len(outcomes)} runs failed:"]
    lines += [
        f"  run {o.run_id} {o.run.model}"
        + (f" loops={o.run.loops}" if o.run.loops is not None else "")
        + f": {o.error}"
        for o in failed
    ]
    return lines


def store_sweep(plan: SweepPlan, store: Store, sweep_id: str) -> list[PlannedRun]:
    """Store every run of the plan up front (status "queued"): a killed sweep is then completed by `--resume` of any
    of its runs. Returns the runs as stored (with their ids), in the order they run."""
    rows = [run_row("eval", dataclasses.replace(run, sweep_id=sweep_id), status="queued") for run in plan.runs]
    ids = store.create_runs(rows)  # one transaction: all or none
    return [run.stored(run_id, sweep_id) for run_id, run in zip(ids, plan.runs)]


def skip_stored(plan: SweepPlan, store: Store, log: Callable[[str], None]) -> list[RunOutcome]:
    """Take out of `plan` every run identical to a finished one (same model, overrides, loops, set and seed).

    Says which stored runs they match ("identical to runs 13-15") and returns those runs' outcomes, so
    the summary shows their results; `loopeval run --rerun` does not call this.
    """
    stored = store.finished_run_keys()
    kept, skipped = [], []
    for run in plan.runs:
        twin = stored.get(run.key)
        if twin is None:
            kept.append(run)
        else:
            skipped.append(RunOutcome(dataclasses.replace(run, id=twin), "finished"))
    if skipped:
        ids = sorted(o.run_id for o in skipped)
        what = f"{len(skipped)} of {len(plan.runs)} runs" if kept else f"all {len(plan.runs)} runs"
        log(
            f"{what} identical to finished run{'s' if len(ids) > 1 else ''} {id_ranges(ids)} "
            "(same model, overrides, loops, exit threshold, KV policy and dtype, evaluation set and seed): skipped; "
            "--rerun runs them again"
        )
    plan.runs = kept
    return skipped


def run_sweep(
    spec: RunSpec,
    plan: SweepPlan,
    store: Store,
    progress: JobProgress | None = None,
    log: Callable[[str], None] = print,
    sweep_id: str | None = None,
) -> list[RunOutcome]:
    """Store the sweep, then run every run of it, each model loaded once; one outcome per run, in order.

    A run that fails is stored as failed with its reason and the sweep goes on; Ctrl-C stops it.
    `sweep_id` joins this spec's runs to others' (a sweep file with several seeds is one sweep).
    """
    runs = store_sweep(plan, store, sweep_id or new_sweep_id())
    return run_stored(spec, runs, plan.task_configs, store, progress, log, plan.loaded)


def resumable_run(store: Store, run_id: int) -> Any:
    """The stored run `run_id` if it is an eval run stored with its spec; else UserError.

    A run that another live process holds (its lease) is refused: two processes never run one run.
    """
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"--resume {run_id}: no such run in {store.url}")
    if run.kind != "eval":
        raise UserError(f"--resume {run_id}: run is a {run.kind} run, only eval runs resume")
    if not run.spec:
        raise UserError(f"--resume {run_id}: run was stored without its spec and cannot be resumed")
    holder = store.lease_holder(run_id, holder_is_gone)
    if holder is not None:
        raise UserError(
            f"--resume {run_id}: the run is being run by {holder} right now; two processes never run one run at once"
        )
    return run


def resume_run(
    run_id: int,
    store: Store,
    db_url: str | None,
    progress: JobProgress | None = None,
    log: Callable[[str], None] = print,
) -> list[RunOutcome]:
    """Complete the sweep of run `run_id`: that run and every other unfinished run of its sweep, in order.

    Samples already stored are not generated again; each run's memory trace and timings continue
    from where the stopped process last wrote them.
    """
    run = resumable_run(store, run_id)
    todo = [PlannedRun.of(r) for r in store.sweep_runs(run.sweep_id) if r.status != "finished"]
    if not todo:
        raise UserError(f"--resume {run_id}: run {run_id} and the rest of its sweep {run.sweep_id} already finished")
    spec = stored_spec(run, db_url, store.url)
    log(f"resuming sweep {run.sweep_id}: run(s) {', '.join(str(r.id) for r in todo)}")
    outcomes = run_stored(spec, todo, load_tasks(spec), store, progress, log)
    return [_awaited(store, outcome, log) if outcome.status == "busy" else outcome for outcome in outcomes]


def _awaited(store: Store, busy: RunOutcome, log: Callable[[str], None]) -> RunOutcome:
    """The outcome of a run another live process held (two `--resume`s of one sweep at once): once that process
    lets it go, what it left, so a sweep the two complete together ends well in both."""
    log(f"run {busy.run_id}: waiting for the process running it to finish")
    while store.lease_holder(busy.run_id, holder_is_gone) is not None:
        time.sleep(FLUSH_SECONDS)
    row = stored_row(store, busy.run_id)
    return dataclasses.replace(busy, status=row.status, error=row.error)


def run_one(run_id: int, store: Store, db_url: str | None, log: Callable[[str], None] = print) -> RunOutcome:
    """Run, or continue, exactly the stored run `run_id` (what one Ray task does); stored samples are skipped."""
    run = resumable_run(store, run_id)
    if run.status == "finished":
        raise UserError(f"--resume {run_id}: run already finished")
    spec = stored_spec(run, db_url, store.url)
    return run_stored(spec, [PlannedRun.of(run)], load_tasks(spec), store, None, log)[0]


def run_stored(
    spec: RunSpec,
    runs: list[PlannedRun],
    task_configs: list[Any],
    store: Store,
    progress: JobProgress | None,
    log: Callable[[str], None],
    loaded: dict[str, Any] | None = None,
    starts: bool = True,
    ended: Ended | None = None,
) -> list[RunOutcome]:
    """Execute stored runs in order, loading each model once per point of the exit and KV axes (runs are model-major).

    With a `progress` view the current run is named on the sweep's line, and each finished run leaves the
    one line `_execute` logs for it, counted on the job's line (`JobProgress.ended`); without one, each run's start
    is logged too, unless `starts` is False (a worker process, whose parent's view shows a bar for each run under
    way), and each closing line goes to `ended` (the worker's parent counts it), else to `log`.
    """
    outcomes = []
    if ended is None:
        ended = (lambda line, counted: log(line)) if progress is None else partial(progress.ended, log=log)
    if progress is not None:
        progress.start_sweep(len(runs))
    adapter, current = None, None
    for run in runs:
        if progress is not None:
            progress.start_run(run_label(run))
        elif starts:
            log(f"{run_label(run)}: starting on {spec.suite}")
        try:
            overrides = spec.run_overrides(run)  # what the model is loaded with: all but its loops
            if (run.model, overrides) != current:  # the previous model, or its exit or KV settings, is done with
                adapter = (loaded or {}).pop(run.model, None) if overrides == spec.load_overrides(run.model) else None
                current = (run.model, overrides)
            adapter = at_loops(adapter, run.model, run.loops, overrides)
            outcomes.append(_execute(spec, store, run, adapter, task_configs, progress, log, ended))
        except ResultsError:  # the store itself failed (disk full, damaged, unreachable): every later run would too
            raise
        except RunBusy as exc:  # another live process runs it: leave its row alone
            ended(f"run {run.id} skipped: {exc}", True)
            outcomes.append(RunOutcome(run, "busy", error=str(exc)))
        except Exception as exc:  # stored as failed with its reason; the next run still runs
            error = _error(exc)
            store.finish_run(run.run_id, "failed", error=error)
            ended(f"run {run.id} failed: {error}", True)
            outcomes.append(RunOutcome(run, "failed", error=error))
            adapter, current = None, None
        if progress is not None:
            progress.end_run()
    return outcomes


def run_label(run: PlannedRun) -> str:
    """How progress and log lines name a run: 'run 14 zoo:ouro-tiny r=4', 'run 15 zoo:ouro-tiny r=4 exit=0.5',
    'run 16 zoo:ouro-tiny r=4 shared-last int8' (a plain model has no r, a run off an axis nothing of it)."""
    kv = [value for value in (run.kv_policy, run.kv_dtype) if value is not None]
    return (
        f"run {run.id} {run.model}"
        + ("" if run.loops is None else f" r={run.loops}")
        + ("" if run.exit_threshold is None else f" exit={run.exit_threshold:g}")
        + "".join(f" {value}" for value in kv)
    )


def _execute(
    spec: RunSpec,
    store: Store,
    run: PlannedRun,
    adapter: Any,
    task_configs: list[Any],
    progress: JobProgress | None,
    log: Callable[[str], None],
    ended: Ended,
) -> RunOutcome:
    """Generate and score one stored run with `adapter`, keeping the store current whatever happens: samples are
    committed as they finish, the recorder writes memory, timings and the run's lease every second, so a kill -9
    loses at most the last second. Its closing line goes to `ended`, counted when it finished (a failed run is
    counted by the line `run_stored` adds with the reason)."""
    from harness.bridge.evaluation import run_suite
    from harness.bridge.records import CONTEXT_LIMIT

    run_id = run.run_id
    sampler = MemorySampler(adapter, interval=spec.sampler_interval, spec=run.model)
    timed = TimedAdapter(adapter, sampler, run.model)
    previous = stored_row(store, run_id)  # the measurements of its earlier stretches, if it was stopped
    recorder = RunRecorder(store, run_id, sampler, timed, previous=previous)
    recorder.acquire()  # refuses a run another live process is running
    host = {
        **(previous.host or {}),
        **host_info(),
        "pid": os.getpid(),
    }  # the process that runs it (a worker, a Ray task)
    store.update_run(run_id, status="running", error=None, model_config=timed.describe(), host=host)
    status, error = "failed", None
    metrics: dict[str, dict[str, float | None]] = {}
    sampler.start()
    recorder.start()
    try:
        with sigterm_as_interrupt():
            result = run_suite(
                timed,
                task_configs,
                spec.sampling,
                sink=StoreSink(store, run_id, sampler),
                limit=spec.limit,
                batch_size=spec.batch_size,
                progress=progress,
            )
        if result.context_cut:
            log(
                f"run {run_id}: {result.context_cut} samples reached the end of {run.model}'s context ({adapter.max_context} "
                f"tokens) before max_new_tokens={spec.sampling.max_new_tokens}; their finish reason is {CONTEXT_LIMIT!r}"
            )
        if sampler.failure is not None:
            raise sampler.failure
        metrics = {
            task: {name: value for name, (value, _) in by_metric.items()} for task, by_metric in result.metrics.items()
        }
        store.set_sample_scores(run_id, result.scores)
        store.set_metrics(run_id, result.metrics)
        status = "finished"
    except KeyboardInterrupt:  # the job's last line says how to continue, once for all its runs
        status = "interrupted"
        raise
    except Exception as exc:
        error = _error(exc)
        raise
    finally:
        sampler.stop()
        try:
            recorder.stop()
            headline = f"{run_label(run)}: {status} in {recorder.wall_seconds:.1f} s ({timed.generate_seconds:.1f} s generating"
            ended(_record_sampler(store, run_id, sampler, headline), status == "finished")
            store.finish_run(run_id, status, error=error)
        finally:
            recorder.release()
    return RunOutcome(run, status, metrics)


def settle_interrupted(store: Store, run_ids: list[int]) -> None:
    """Runs still queued or running once every process running them has ended were cut short (Ctrl-C, a killed
    worker, a job stopped before it reached them): stored as interrupted, ready to resume."""
    for run_id, (status, _) in store.run_progress(run_ids).items():
        if status in ("queued", "running"):
            store.finish_run(run_id, "interrupted", error="sweep interrupted before this run finished")


def stored_row(store: Store, run_id: int) -> Any:
    """The `runs` row of a run this job stored or was given by id; one gone meanwhile was deleted under the job."""
    row = store.get_run(run_id)
    if row is None:
        raise ResultsError(f"run {run_id} is no longer in {store.url}")
    return row


def _error(exc: Exception) -> str:
    """A failed run's reason as stored and logged: one line."""
    return one_line(f"{type(exc).__name__}: {exc}")


def _record_sampler(store: Store, run_id: int, sampler: MemorySampler, headline: str) -> str:
    """The run's one closing line with what the memory sampler cost; that cost is stored in full (ticks, time per
    tick) with the run: its overhead is part of what a run reports."""
    overhead = sampler.overhead()
    line = f"{headline}; sampler {100 * overhead['busy_fraction']:.1f}%)"
    host = dict(stored_row(store, run_id).host or {})
    host["sampler"] = {**overhead, "interval": sampler.interval, "unavailable": sampler.unavailable}
    store.update_run(run_id, host=host)
    return line
