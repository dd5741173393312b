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
import importlib.metadata
import os
import platform
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.base import Generation, Prompt, Sampling
from harness.errors import UserError
from harness.sampler import MemorySampler
from harness.spec import RunSpec, is_looped

if TYPE_CHECKING:
    from rich.progress import Progress

    from db.store import Store


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("loopeval", "torch", "transformers", "lighteval", "sqlalchemy", "alembic", "nvidia-ml-py", "psutil"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def host_info() -> dict[str, Any]:
    """Where the run happened: host, CPU, memory, and the GPU (from torch, else NVML) if any."""
    import psutil

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "gpu": None,
    }
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            info["gpu"] = {"name": props.name, "memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    except ImportError:
        pass
    return info


class TimedAdapter:
    """The adapter as the bridge sees it: same API, but `generate` is timed and its tokens counted.

    The time inside `generate` is what the harness overhead is measured against; the token count
    feeds the sampler's running `generated_tokens`.
    """

    def __init__(self, adapter: Any, sampler: MemorySampler) -> None:
        self.inner = adapter
        self.sampler = sampler
        self.generate_seconds = 0.0
        self.spec = adapter.spec
        self.tokenizer = adapter.tokenizer
        self.max_context = adapter.max_context

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        began = time.perf_counter()
        try:
            generations = self.inner.generate(prompts, sampling)
        finally:
            self.generate_seconds += time.perf_counter() - began
        self.sampler.add_generated_tokens(sum(g.generated_tokens for g in generations))
        return generations

    def forward_logits(self, input_ids: Any) -> Any:
        return self.inner.forward_logits(input_ids)

    def memory(self) -> dict[str, int | None]:
        return self.inner.memory()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def __getattr__(self, name: str) -> Any:  # optional adapter extras (reset_memory_peak, ...)
        return getattr(self.inner, name)


class StoreSink:
    """The bridge's SampleSink on top of the store: resume lookups, phase tags, commits per batch."""

    def __init__(self, store: Store, run_id: int, sampler: MemorySampler) -> None:
        self.store = store
        self.run_id = run_id
        self.sampler = sampler

    def finished(self, task: str) -> dict[tuple[str, int], Any]:
        from harness.bridge import SampleRecord

        names = {f.name for f in dataclasses.fields(SampleRecord)}
        return {
            (row.doc_id, row.sample_index): SampleRecord(**{name: getattr(row, name) for name in names})
            for row in self.store.samples(self.run_id, task)
        }

    def on_batch_start(self, task: str, batch_index: int, n_prompts: int) -> None:
        self.sampler.set_phase(f"task:{task} batch:{batch_index}")

    def on_records(self, records: list[Any]) -> None:
        self.store.add_samples(self.run_id, [vars(record) for record in records])  # shallow: asdict deep-copies


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while a run is going, so either one marks the run interrupted."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
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


def _load_tasks(spec: RunSpec) -> list[Any]:
    """The suite's LightEval task configs; unknown suite, task or missing data -> UserError."""
    from suites import SuiteError
    from suites.registry import load_suite

    try:
        return load_suite(spec.suite, tasks=list(spec.tasks) if spec.tasks else None, data_dir=spec.data_dir)
    except SuiteError as exc:
        raise UserError(str(exc)) from None


@dataclass
class SweepPlan:
    """What a sweep will run, worked out before anything is written: task configs and (model, loops) pairs.

    `loaded` keeps the adapters that had to be loaded to learn whether they loop (specs whose
    adapter cannot describe itself from its config), so the sweep does not load them twice.
    """

    task_configs: list[Any]
    runs: list[tuple[str, int | None]]
    loaded: dict[str, Any] = field(default_factory=dict)


def prepare_sweep(spec: RunSpec) -> SweepPlan:
    """Check the suite and every model spec from configs, without loading weights where the adapter allows.

    Bad names fail here as UserError. Engine and zoo specs are described from their config files;
    other adapters are loaded once and kept for the sweep.
    """
    import adapters

    plan = SweepPlan(_load_tasks(spec), [])
    for model in spec.models:
        overrides = spec.load_overrides(model)
        description = adapters.inspect(model, **overrides)
        if description is None:
            plan.loaded[model] = adapters.load(model, **overrides)
            description = plan.loaded[model].describe()
        if is_looped(description):
            plan.runs.extend((model, r) for r in spec.loops)
        else:
            plan.runs.append((model, None))
    return plan


def _at_loops(adapter: Any, model: str, loops: int | None, spec: RunSpec) -> Any:
    """The sweep's adapter set to run `loops`: changed in place where the adapter allows it (the engine),
    else loaded again with the override. A second full load would double load time on a GPU and can
    inflate NVML peaks, so engine models are loaded once per sweep."""
    import adapters

    if adapter is not None and (loops is None or hasattr(adapter, "loops")):
        if loops is not None:
            adapter.loops = loops
        if hasattr(adapter, "reset_memory_peak"):
            adapter.reset_memory_peak()
        return adapter
    overrides = spec.load_overrides(model) | ({} if loops is None else {"loops": loops})
    return adapters.load(model, **overrides)


def new_sweep_id() -> str:
    """The id that groups a sweep's runs (all seeds of a sweep file, all Ray tasks of one submission)."""
    return uuid.uuid4().hex[:12]


def create_run_row(
    store: Store, spec: RunSpec, plan: SweepPlan, run: tuple[str, int | None], sweep_id: str, status: str = "running"
) -> int:
    """The `runs` row of one (model, loops) of a sweep, with the full spec so the run can be resumed by id."""
    model, loops = run
    return store.create_run(
        sweep_id=sweep_id,
        kind="eval",
        model_spec=model,
        adapter=model.partition(":")[0],
        loops=loops,
        suite=spec.suite,
        tasks=[t.name for t in plan.task_configs],
        sampling=dataclasses.asdict(spec.sampling),
        seed=spec.seed,
        limit=spec.limit,
        spec=spec.to_dict(),
        versions=package_versions(),
        host=host_info(),
        status=status,
    )


def run_sweep(
    spec: RunSpec,
    plan: SweepPlan,
    store: Store,
    progress: Progress | None = None,
    log: Callable[[str], None] = print,
    sweep_id: str | None = None,
) -> list[RunOutcome]:
    """Run every (model, loops) of the plan as one sweep, each model loaded once; one outcome per run, in order.

    `sweep_id` joins this spec's runs to others' (a sweep file with several seeds is one sweep).
    """
    sweep_id = sweep_id or new_sweep_id()
    outcomes = []
    overall = progress.add_task(f"sweep {sweep_id}", total=len(plan.runs)) if progress is not None else None
    adapter, current = None, None
    for model, loops in plan.runs:
        if model != current:  # runs are model-major: the previous model is done with
            adapter, current = plan.loaded.pop(model, None), model
        adapter = _at_loops(adapter, model, loops, spec)
        run_id = create_run_row(store, spec, plan, (model, loops), sweep_id)
        log(f"run {run_id}: {model}" + (f" loops={loops}" if loops is not None else "") + f" on {spec.suite}")
        outcomes.append(_execute(spec, store, run_id, (model, loops), adapter, plan.task_configs, progress, log))
        if progress is not None and overall is not None:
            progress.advance(overall)
    return outcomes


def resumable_run(store: Store, run_id: int) -> Any:
    """The stored run `run_id` if it can be continued (an eval run, with its spec, not finished); else UserError."""
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"--resume {run_id}: no such run in {store.url}")
    if run.kind != "eval":
        raise UserError(f"--resume {run_id}: run is a {run.kind} run, only eval runs resume")
    if run.status == "finished":
        raise UserError(f"--resume {run_id}: run already finished")
    if not run.spec:
        raise UserError(f"--resume {run_id}: run was stored without its spec and cannot be resumed")
    return run


def resume_run(
    run_id: int, store: Store, db_url: str | None, progress: Progress | None = None, log: Callable[[str], None] = print
) -> RunOutcome:
    """Continue a stopped run: same spec, samples already stored are not generated again.

    A queued run (created by the Ray executor, not started yet) goes the same way, from no samples.
    """
    run = resumable_run(store, run_id)
    spec = RunSpec.from_dict(run.spec, db_url)
    task_configs = _load_tasks(spec)
    adapter = _at_loops(None, run.model_spec, run.loops, spec)
    store.update_run(run_id, status="running", error=None)
    verb = "starting" if run.status == "queued" else "resuming"
    log(f"run {run_id}: {verb} {run.model_spec}" + (f" loops={run.loops}" if run.loops is not None else ""))
    return _execute(spec, store, run_id, (run.model_spec, run.loops), adapter, task_configs, progress, log, previous=run)


def _execute(
    spec: RunSpec,
    store: Store,
    run_id: int,
    run: tuple[str, int | None],
    adapter: Any,
    task_configs: list[Any],
    progress: Progress | None,
    log: Callable[[str], None],
    previous: Any | None = None,
) -> RunOutcome:
    """Generate and score one run, (model spec, loops), with `adapter`, keeping the store current whatever happens."""
    from harness.bridge import run_suite

    store.update_run(run_id, model_config=adapter.describe())
    sampler = MemorySampler(adapter, interval=spec.sampler_interval)
    timed = TimedAdapter(adapter, sampler)
    sink = StoreSink(store, run_id, sampler)
    began = time.perf_counter()
    status, error, metrics = "failed", None, {}
    sampler.start()
    try:
        with sigterm_as_interrupt():
            result = run_suite(
                timed, task_configs, spec.sampling, sink=sink, limit=spec.limit, batch_size=spec.batch_size, progress=progress
            )
        metrics = {task: {name: value for name, (value, _) in by_metric.items()} for task, by_metric in result.metrics.items()}
        store.set_sample_scores(run_id, result.scores)
        store.set_metrics(run_id, result.metrics)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        log(f"run {run_id} interrupted; finished samples are stored. Continue with: loopeval run --resume {run_id}")
        raise
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        sampler.stop()
        _store_memory(store, run_id, sampler, previous)
        wall = time.perf_counter() - began
        overhead = sampler.overhead()
        log(
            f"run {run_id} {status} in {wall:.1f} s ({timed.generate_seconds:.1f} s inside generate); memory sampler: "
            f"{overhead['ticks']:.0f} ticks, {1e3 * overhead['seconds_per_tick']:.2f} ms each, "
            f"{100 * overhead['busy_fraction']:.2f}% of wall"
        )
        store.finish_run(
            run_id,
            status,
            error=error,
            wall_seconds=wall + ((previous.wall_seconds or 0.0) if previous else 0.0),
            generate_seconds=timed.generate_seconds + ((previous.generate_seconds or 0.0) if previous else 0.0),
        )
    return RunOutcome(run_id, *run, status, metrics)


def _store_memory(store: Store, run_id: int, sampler: MemorySampler, previous: Any | None) -> None:
    """Write the series and peaks (a resumed run keeps the larger of old and new peaks)."""
    peaks = sampler.peaks()
    offset = 0.0
    if previous is not None:
        for measure, value in store.memory_peaks(run_id).items():
            if measure != "weights_bytes" and value is not None:
                peaks[measure] = value if peaks.get(measure) is None else max(value, peaks[measure])
        offset = previous.wall_seconds or 0.0
    rows = [{**tick, "t": tick["t"] + offset} for tick in sampler.series()]
    store.add_memory_samples(run_id, rows)
    store.set_memory_peaks(run_id, peaks)
    overhead = sampler.overhead()
    host = dict(store.get_run(run_id).host or {})
    host["sampler"] = {**overhead, "interval": sampler.interval, "unavailable": sampler.unavailable}
    store.update_run(run_id, host=host)

