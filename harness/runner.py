"""One sweep of evaluations: RunSpec (validated) -> adapters -> LightEval suite -> results store.

`RunSpec` is what the user asked for; `run_sweep()` turns it into one stored run per
(model, loop count) sharing a `sweep_id`. Loop counts apply to looped models only: a plain model
runs once. While a run generates, a `MemorySampler` thread records memory, every scored sample is
committed at once through `StoreSink` (so Ctrl-C, SIGTERM or a crash keep finished work), and
`--resume RUN_ID` continues a run by skipping the samples already stored.

What a run is (`RunSpec`, the defaults, each suite's sampling) lives in `harness.spec`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from adapters.base import (Finished, Generation, Prompt, Request, Sampling, Scheduling, checked_context, checked_description,
                           checked_generation, checked_memory, hook, one_line)
from db import ResultsError
from db.session import display_url, resolve_db_url
from db.sets import id_ranges, run_key
from db.stored import DamagedRun
from harness.measurement.capacity import check_fits
from harness.errors import UserError
from harness.hints import env_command, with_db
from harness.recorder import FLUSH_SECONDS, RunBusy, RunRecorder, holder_is_gone, host_info, new_sweep_id, run_row
from harness.measurement.sampler import MemorySampler
from harness.spec import DEFAULT_EXIT_CRITERION, RunSpec, at_loops, is_looped

if TYPE_CHECKING:
    from db.store import Store
    from harness.progress import JobProgress


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


def raise_interrupt(signum: int, frame: Any) -> None:
    """A signal handler that stops the work in hand as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while a run is going, so either one marks the run interrupted."""
    try:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class RunOutcome:
    run_id: int
    model: str
    loops: int | None
    status: str
    metrics: dict[str, dict[str, float | None]] = field(default_factory=dict)
    error: str | None = None


def failure_summary(outcomes: Sequence[RunOutcome]) -> list[str]:
    """The lines that end a sweep with failed runs (none when every run finished)."""
    failed = [o for o in outcomes if o.status in ("failed", "busy")]
    if not failed:
        return []
    lines = [f"{len(failed)} of {len(outcomes)} runs failed:"]
    lines += [
        f"  run {o.run_id} {o.model}" + (f" loops={o.loops}" if o.loops is not None else "") + f": {o.error}" for o in failed
    ]
    return lines


def _load_tasks(spec: RunSpec) -> list[Any]:
    """The suite's LightEval task configs; unknown suite, task or missing data -> UserError."""
    from suites import SuiteError
    from suites.registry import load_suite

    try:
        return load_suite(spec.suite, tasks=list(spec.tasks) if spec.tasks else None, data_dir=spec.data_dir)
    except SuiteError as exc:
        raise UserError(str(exc)) from None


class Run(NamedTuple):
    """One run of a plan: a model at a point of each axis; None where the run is not on that axis."""

    model: str
    loops: int | None
    exit_threshold: float | None = None
    kv_policy: str | None = None
    kv_dtype: str | None = None


@dataclass
class SweepPlan:
    """What a sweep will run, worked out before anything is written: task configs and (model, loops, exit threshold) runs.

    `loaded` keeps the adapters that had to be loaded to learn whether they loop (specs whose
    adapter cannot describe itself from its config), so the sweep does not load them twice.
    """

    task_configs: list[Any]
    runs: list[Run]
    loaded: dict[str, Any] = field(default_factory=dict)
    params: dict[str, int | None] = field(default_factory=dict)  # each model's parameters (None: unknown)
    devices: dict[str, str] = field(default_factory=dict)  # where each model computes (cpu, cuda)
    fingerprint: str | None = None  # of the task files (`suites.registry.data_fingerprint`), part of the runs' set


def prepare_sweep(spec: RunSpec) -> SweepPlan:
    """Check the suite and every model spec from configs, without loading weights where the adapter allows.

    Bad names fail here as UserError. Engine and zoo specs are described from their config files;
    other adapters are loaded once and kept for the sweep.
    """
    import adapters
    from suites.registry import data_fingerprint

    configs = _load_tasks(spec)
    plan = SweepPlan(configs, [], fingerprint=data_fingerprint(configs))
    for model in spec.models:
        overrides = spec.load_overrides(model)
        description = adapters.inspect(model, **overrides)
        if description is None:  # a plugin's values are checked here, before anything is stored
            adapter = plan.loaded[model] = adapters.load(model, **overrides)
            checked_context(model, hook(model, "max_context", getattr, adapter, "max_context"))
            checked_memory(model, hook(model, "memory()", adapter.memory))
            description = checked_description(model, hook(model, "describe()", adapter.describe))
        elif "max_context" in description:
            checked_context(model, description["max_context"])
        plan.params[model] = description.get("params")
        plan.devices[model] = str(description.get("device") or "cpu")
        if description.get("has_tokenizer") is False:
            raise UserError(f"{model} has no tokenizer, so it cannot read a suite's prompts: evaluate a checkpoint "
                            "(e.g. qwen3:PATH) or a zoo model; real-size presets are for `loopeval profile` and `estimate`")
        runs = _model_runs(spec, model, description)
        for run in runs:
            _check_fits(spec, run)
        plan.runs.extend(runs)
    if spec.exit_thresholds and all(run.exit_threshold is None for run in plan.runs):
        raise UserError("--exit-threshold applies to looped models, and none of the sweep's models loops")
    if spec.kv_policies and all(run.kv_policy is None for run in plan.runs):
        raise UserError("--kv-policy applies to looped models, and none of the sweep's models loops (--kv-dtype applies to all)")
    return plan


def _model_runs(spec: RunSpec, model: str, description: dict[str, Any]) -> list[Run]:
    """The runs of one model: each loop count at each exit threshold and KV policy (those outer, so the model is
    loaded once per point of them) for a looped model, one run for a plain one, as the loops axis treats it; either
    at each KV dtype. UserError where the exit axis cannot apply (a looped model outside the engine, or the gate
    criterion without a gate) or the KV axis (a model outside the engine). Whether its family takes a KV policy or
    dtype is its inspector's to say (`_check_fits`)."""
    if (spec.kv_policies or spec.kv_dtypes) and "kv_policy" not in description:
        option = "--kv-dtype" if spec.kv_dtypes else "--kv-policy"
        raise UserError(f"{option}: {model} is not an engine model, whose KV cache the axis sets")
    dtypes = spec.kv_dtypes or (None,)
    if not is_looped(description):
        return [Run(model, None, kv_dtype=d) for d in dtypes]
    if spec.exit_thresholds:
        config = description.get("config")
        if not isinstance(config, dict) or "exit_gate" not in config:
            raise UserError(f"--exit-threshold: {model} is not an engine model, whose per-token exit the axis sets")
        if spec.exit_criterion == DEFAULT_EXIT_CRITERION and not config["exit_gate"]:
            raise UserError(f"--exit-threshold: {model} has no exit gate for --exit-criterion {DEFAULT_EXIT_CRITERION}; "
                            f"kl or entropy need none")
    return [Run(model, r, t, p, d) for t in spec.exit_thresholds or (None,) for p in spec.kv_policies or (None,)
            for d in dtypes for r in spec.loops]


def largest_model(params: Sequence[int | None]) -> int | None:
    """The parameters of the largest of these models; None when one of them has no known size (so treated as large)."""
    return None if not params or None in params else max(params)  # type: ignore[type-var]


def stored_params(store: Store, run_id: int) -> list[int | None]:
    """The parameters of every model of run `run_id`'s sweep, from their configs (what `--resume` runs)."""
    import adapters

    run = store.get_run(run_id)
    spec = stored_spec(run, None, store.url)
    facts = [adapters.inspect(model, **spec.load_overrides(model)) for model in {r.model_spec for r in store.sweep_runs(run.sweep_id)}]
    return [None if f is None else f.get("params") for f in facts]


def _check_fits(spec: RunSpec, run: Run) -> None:
    """Refuse a run whose weights and KV cache cannot fit the machine (new tokens only: a lower bound); the
    adapter checks the run's overrides (its exit threshold and KV policy and dtype among them) on the way, before
    anything is stored."""
    import adapters

    model, loops = run.model, run.loops
    overrides = spec.run_overrides(model, run.exit_threshold, spec.exit_criterion, run.kv_policy, run.kv_dtype)
    facts = adapters.inspect(model, **overrides, **({} if loops is None else {"loops": loops}))
    if facts is None:
        return
    tokens = min(spec.sampling.max_new_tokens, facts.get("max_context", spec.sampling.max_new_tokens))
    sequences = min(spec.batch_size * spec.sampling.n, facts.get("max_batch", spec.batch_size * spec.sampling.n))
    what = model + ("" if loops is None else f" at loops={loops}")
    check_fits(what, facts, tokens, sequences, "--loops, --samples, --batch-size or --max-new-tokens")


def _sweep_row(spec: RunSpec, plan: SweepPlan, run: Run, sweep_id: str | None) -> dict[str, Any]:
    """The `runs` row of one run of a sweep, queued, with the spec so the run can be resumed by id; the row is the
    one home of its exit threshold and KV policy and dtype, which the executor reads back (`run_stored`)."""
    return run_row("eval", run.model, loops=run.loops, suite=spec.suite, tasks=[t.name for t in plan.task_configs],
                   sampling=spec.sampling, seed=spec.seed, limit=spec.limit, data_fingerprint=plan.fingerprint,
                   spec=spec.to_dict(), sweep_id=sweep_id, status="queued", exit_threshold=run.exit_threshold,
                   exit_criterion=None if run.exit_threshold is None else spec.exit_criterion,
                   kv_policy=run.kv_policy, kv_dtype=run.kv_dtype)


def stored_spec(run: Any, db_url: str | None, where: str | None = None) -> RunSpec:
    """The RunSpec an eval run was stored with: `runs.spec`, and its sampling from `runs.sampling`.

    Both are JSON objects (`db.stored` checked them as the run was read); fields a RunSpec does not take, or
    values it refuses, make the run a `DamagedRun` too, named in one line with `where` (default: `db_url`).
    """
    for column, rebuild in (("runs.sampling", lambda: Sampling(**run.sampling)),
                            ("runs.spec", lambda: RunSpec.from_dict(run.spec, run.sampling, db_url))):
        try:
            spec = rebuild()
        except (TypeError, ValueError) as exc:  # UserError is a ValueError
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise DamagedRun(run.id, column, f"does not hold what this loopeval stores there ({reason})",
                             where or display_url(resolve_db_url(db_url))) from None
    return spec


def skip_stored(spec: RunSpec, plan: SweepPlan, store: Store, log: Callable[[str], None]) -> list[RunOutcome]:
    """Take out of `plan` every run identical to a finished one (same model, overrides, loops, set and seed).

    Says which stored runs they match ("identical to runs 13-15") and returns those runs' outcomes, so
    the summary shows their results; `loopeval run --rerun` does not call this.
    """
    stored = store.finished_run_keys()
    kept, skipped = [], []
    for run in plan.runs:
        twin = stored.get(run_key(_sweep_row(spec, plan, run, None)))  # the key of the row it would be stored as
        if twin is None:
            kept.append(run)
        else:
            skipped.append(RunOutcome(twin, run.model, run.loops, "finished"))
    if skipped:
        ids = sorted(o.run_id for o in skipped)
        what = f"{len(skipped)} of {len(plan.runs)} runs" if kept else f"all {len(plan.runs)} runs"
        log(f"{what} identical to finished run{'s' if len(ids) > 1 else ''} {id_ranges(ids)} "
            "(same model, overrides, loops, exit threshold, KV policy and dtype, evaluation set and seed): skipped; "
            "--rerun runs them again")
    plan.runs = kept
    return skipped


def store_sweep(spec: RunSpec, plan: SweepPlan, store: Store, sweep_id: str) -> list[tuple[int, str, int | None]]:
    """Store every run of the sweep up front (status "queued"): a killed sweep is then completed by
    `--resume` of any of its runs. Returns (run id, model spec, loops) in the order they run."""
    ids = store.create_runs([_sweep_row(spec, plan, run, sweep_id) for run in plan.runs])  # one transaction: all or none
    return [(run_id, run.model, run.loops) for run_id, run in zip(ids, plan.runs)]


def run_sweep(
    spec: RunSpec, plan: SweepPlan, store: Store, progress: JobProgress | None = None, log: Callable[[str], None] = print,
    sweep_id: str | None = None,
) -> list[RunOutcome]:
    """Store the sweep, then run every (model, loops) of it, each model loaded once; one outcome per run, in order.

    A run that fails is stored as failed with its reason and the sweep goes on; Ctrl-C stops it.
    `sweep_id` joins this spec's runs to others' (a sweep file with several seeds is one sweep).
    """
    runs = store_sweep(spec, plan, store, sweep_id or new_sweep_id())
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
        raise UserError(f"--resume {run_id}: the run is being run by {holder} right now; two processes never run one run at once")
    return run


def resume_run(
    run_id: int, store: Store, db_url: str | None, progress: JobProgress | None = None, log: Callable[[str], None] = print
) -> list[RunOutcome]:
    """Complete the sweep of run `run_id`: that run and every other unfinished run of its sweep, in order.

    Samples already stored are not generated again; each run's memory trace and timings continue
    from where the stopped process last wrote them.
    """
    run = resumable_run(store, run_id)
    todo = [(r.id, r.model_spec, r.loops) for r in store.sweep_runs(run.sweep_id) if r.status != "finished"]
    if not todo:
        raise UserError(f"--resume {run_id}: run {run_id} and the rest of its sweep {run.sweep_id} already finished")
    spec = stored_spec(run, db_url, store.url)
    log(f"resuming sweep {run.sweep_id}: run(s) {', '.join(str(r[0]) for r in todo)}")
    outcomes = run_stored(spec, todo, _load_tasks(spec), store, progress, log)
    return [_awaited(store, outcome, log) if outcome.status == "busy" else outcome for outcome in outcomes]


def _awaited(store: Store, busy: RunOutcome, log: Callable[[str], None]) -> RunOutcome:
    """The outcome of a run another live process held (two `--resume`s of one sweep at once): once that process
    lets it go, what it left, so a sweep the two complete together ends well in both."""
    log(f"run {busy.run_id}: waiting for the process running it to finish")
    while store.lease_holder(busy.run_id, holder_is_gone) is not None:
        time.sleep(FLUSH_SECONDS)
    row = store.get_run(busy.run_id)
    return dataclasses.replace(busy, status=row.status, error=row.error)


def run_one(run_id: int, store: Store, db_url: str | None, log: Callable[[str], None] = print) -> RunOutcome:
    """Run, or continue, exactly the stored run `run_id` (what one Ray task does); stored samples are skipped."""
    run = resumable_run(store, run_id)
    if run.status == "finished":
        raise UserError(f"--resume {run_id}: run already finished")
    spec = stored_spec(run, db_url, store.url)
    return run_stored(spec, [(run.id, run.model_spec, run.loops)], _load_tasks(spec), store, None, log)[0]


def run_stored(
    spec: RunSpec, runs: list[tuple[int, str, int | None]], task_configs: list[Any], store: Store,
    progress: JobProgress | None, log: Callable[[str], None], loaded: dict[str, Any] | None = None, starts: bool = True,
) -> list[RunOutcome]:
    """Execute stored runs in order, loading each model once (runs are model-major).

    With a `progress` view the current run is named on the sweep's line, and each finished run leaves the
    one line `_execute` logs for it; without one, each run's start is logged too, unless `starts` is False
    (a worker process, whose parent's view shows a bar for each run under way).
    """
    outcomes = []
    if progress is not None:
        progress.start_sweep(len(runs))
    adapter, current = None, None
    for run_id, model, loops in runs:
        row = store.get_run(run_id)
        # the run's point on the exit and KV axes (None: not swept), load overrides all
        axes = (row.exit_threshold, row.exit_criterion, row.kv_policy, row.kv_dtype)
        if progress is not None:
            progress.start_run(run_label(run_id, model, loops, row))
        elif starts:
            log(f"{run_label(run_id, model, loops, row)}: starting on {spec.suite}")
        try:
            if (model, axes) != current:  # the previous model, or its exit or KV settings, is done with
                adapter = (loaded or {}).pop(model, None) if axes == (None,) * 4 else None
                current = (model, axes)
            adapter = at_loops(adapter, model, loops, spec.run_overrides(model, *axes))
            outcomes.append(_execute(spec, store, run_id, (model, loops), adapter, task_configs, progress, log))
        except ResultsError:  # the store itself failed (disk full, damaged, unreachable): every later run would too
            raise
        except RunBusy as exc:  # another live process runs it: leave its row alone
            log(f"run {run_id} skipped: {exc}")
            outcomes.append(RunOutcome(run_id, model, loops, "busy", error=str(exc)))
        except Exception as exc:  # stored as failed with its reason; the next (model, loops) still runs
            error = _error(exc)
            store.finish_run(run_id, "failed", error=error)
            log(f"run {run_id} failed: {error}")
            outcomes.append(RunOutcome(run_id, model, loops, "failed", error=error))
            adapter, current = None, None
        if progress is not None:
            progress.end_run()
    return outcomes


def run_label(run_id: int, model: str, loops: int | None, row: Any = None) -> str:
    """How progress and log lines name a run: 'run 14 zoo:ouro-tiny r=4', 'run 15 zoo:ouro-tiny r=4 exit=0.5',
    'run 16 zoo:ouro-tiny r=4 shared-last int8' (a plain model has no r, a run off an axis nothing of it); `row` is
    its `runs` row (None: off every axis)."""
    threshold = getattr(row, "exit_threshold", None)
    kv = [value for value in (getattr(row, "kv_policy", None), getattr(row, "kv_dtype", None)) if value is not None]
    return (f"run {run_id} {model}" + ("" if loops is None else f" r={loops}")
            + ("" if threshold is None else f" exit={threshold:g}") + "".join(f" {value}" for value in kv))


def _execute(
    spec: RunSpec,
    store: Store,
    run_id: int,
    run: tuple[str, int | None],
    adapter: Any,
    task_configs: list[Any],
    progress: JobProgress | None,
    log: Callable[[str], None],
) -> RunOutcome:
    """Generate and score one stored run, (model spec, loops), with `adapter`, keeping the store current
    whatever happens: samples are committed as they finish, the recorder writes memory, timings and
    the run's lease every second, so a kill -9 loses at most the last second."""
    from harness.bridge.evaluation import run_suite
    from harness.bridge.records import CONTEXT_LIMIT

    sampler = MemorySampler(adapter, interval=spec.sampler_interval, spec=run[0])
    timed = TimedAdapter(adapter, sampler, run[0])
    previous = store.get_run(run_id)
    recorder = RunRecorder(store, run_id, sampler, timed, previous=previous)
    recorder.acquire()  # refuses a run another live process is running
    host = {**(previous.host or {}), **host_info(), "pid": os.getpid()}  # the process that runs it (a worker, a Ray task)
    store.update_run(run_id, status="running", error=None, model_config=timed.describe(), host=host)
    status, error, metrics = "failed", None, {}
    sampler.start()
    recorder.start()
    try:
        with sigterm_as_interrupt():
            result = run_suite(
                timed, task_configs, spec.sampling, sink=StoreSink(store, run_id, sampler), limit=spec.limit,
                batch_size=spec.batch_size, progress=progress,
            )
        if result.context_cut:
            log(
                f"run {run_id}: {result.context_cut} samples reached the end of {run[0]}'s context ({adapter.max_context} "
                f"tokens) before max_new_tokens={spec.sampling.max_new_tokens}; their finish reason is {CONTEXT_LIMIT!r}"
            )
        if sampler.failure is not None:
            raise sampler.failure
        metrics = {task: {name: value for name, (value, _) in by_metric.items()} for task, by_metric in result.metrics.items()}
        store.set_sample_scores(run_id, result.scores)
        store.set_metrics(run_id, result.metrics)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        resume = with_db(f"{env_command('loopeval')} run --resume {run_id}", spec.db_url)
        log(f"run {run_id} interrupted; finished samples are stored. Continue with: {resume}")
        raise
    except Exception as exc:
        error = _error(exc)
        raise
    finally:
        sampler.stop()
        try:
            recorder.stop()
            label = run_label(run_id, *run, previous)
            _record_sampler(store, run_id, sampler, log, f"{label}: {status} in {recorder.wall_seconds:.1f} s "
                            f"({timed.generate_seconds:.1f} s generating")
            store.finish_run(run_id, status, error=error)
        finally:
            recorder.release()
    return RunOutcome(run_id, *run, status, metrics)


def _error(exc: Exception) -> str:
    """A failed run's reason as stored and logged: one line."""
    return one_line(f"{type(exc).__name__}: {exc}")


def _record_sampler(store: Store, run_id: int, sampler: MemorySampler, log: Callable[[str], None], headline: str) -> None:
    """Log the run's one closing line with what the memory sampler cost, and store that cost in full (ticks, time
    per tick) with the run: its overhead is part of what a run reports."""
    overhead = sampler.overhead()
    log(f"{headline}; sampler {100 * overhead['busy_fraction']:.1f}%)")
    host = dict(store.get_run(run_id).host or {})
    host["sampler"] = {**overhead, "interval": sampler.interval, "unavailable": sampler.unavailable}
    store.update_run(run_id, host=host)
