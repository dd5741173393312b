"""One sweep of evaluations: RunSpec (validated) -> adapters -> LightEval suite -> results store.

`RunSpec` is what the user asked for; `run_sweep()` turns it into one stored run per
(model, loop count) sharing a `sweep_id`. Loop counts apply to looped models only: a plain model
runs once. While a run generates, a `MemorySampler` thread records memory, every scored sample is
committed at once through `StoreSink` (so Ctrl-C, SIGTERM or a crash keep finished work), and
`--resume RUN_ID` continues a run by skipping the samples already stored.

`DEFAULTS` holds the sizes of the no-argument `loopeval run` in one place, so they can be tuned
(for example when trained zoo models replace the random-weight presets).
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

from adapters.base import AdapterError, Generation, Prompt, Sampling
from harness.errors import UserError
from harness.sampler import DEFAULT_INTERVAL, MemorySampler

if TYPE_CHECKING:
    from rich.progress import Progress

    from db.store import Store


@dataclass(frozen=True)
class RunDefaults:
    """The default `loopeval run`: the trained tiny zoo on the synthetic suite, in a few minutes on 2 CPU cores."""

    models: tuple[str, ...] = ("zoo:qwen3-tiny-small", "zoo:qwen3-tiny-deep", "zoo:ouro-tiny", "zoo:melt-tiny")
    suite: str = "synthetic"
    loops: tuple[int, ...] = (1, 2, 4, 8)
    samples: int = 4  # n samples per problem for pass@1
    temperature: float = 1.0  # paper protocol
    top_p: float = 0.7  # paper protocol
    max_new_tokens: int = 8  # synthetic answers are a few digits
    limit: int | None = None  # docs per task: all 200 of the test split
    batch_size: int = 32


DEFAULTS = RunDefaults()


def _suite_sampling(suite: str) -> dict[str, float | int]:
    """temperature, top_p, max_new_tokens and n to use where the user gave none."""
    from suites import SuiteError
    from suites.registry import default_sampling

    if suite == DEFAULTS.suite:
        return {"temperature": DEFAULTS.temperature, "top_p": DEFAULTS.top_p, "max_new_tokens": DEFAULTS.max_new_tokens, "n": DEFAULTS.samples}
    try:
        return default_sampling(suite)
    except SuiteError as exc:
        raise UserError(str(exc)) from None


# Backends that can run code shipped inside a model directory, and so take trust_remote_code.
REMOTE_CODE_PREFIXES = ("transformers", "vllm")


@dataclass(frozen=True)
class RunSpec:
    """A validated request for one sweep. Construct it with `RunSpec.build()` from CLI values."""

    models: tuple[str, ...]
    suite: str
    tasks: tuple[str, ...] | None  # None: every task of the suite
    loops: tuple[int, ...]
    sampling: Sampling
    limit: int | None
    batch_size: int
    seed: int
    db_url: str | None = None
    data_dir: str | None = None
    sampler_interval: float = DEFAULT_INTERVAL
    trust_remote_code: bool = False  # only for transformers:/vllm: specs; their loaders warn when used

    @classmethod
    def build(
        cls,
        *,
        models: Sequence[str] | None = None,
        suite: str | None = None,
        tasks: Sequence[str] | None = None,
        loops: Sequence[int] | None = None,
        samples: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        limit: int | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        db_url: str | None = None,
        data_dir: str | None = None,
        sampler_interval: float = DEFAULT_INTERVAL,
        trust_remote_code: bool = False,
    ) -> RunSpec:
        """Fill unset values and check every field; UserError names the bad option.

        On the default suite unset values come from DEFAULTS; on any other suite from the suite's
        own default sampling (the paper protocol for `paper`) and all of its docs.
        """
        suite = suite or DEFAULTS.suite
        suite_sampling = _suite_sampling(suite)
        models = tuple(models or DEFAULTS.models)
        loops = tuple(loops or DEFAULTS.loops)
        if samples is not None and samples < 1:
            raise UserError(f"--samples must be a positive integer, got {samples}")
        if any(r < 1 for r in loops):
            raise UserError(f"--loops must be positive integers, got {','.join(map(str, loops))}")
        if limit is not None and limit < 1:
            raise UserError(f"--limit must be a positive integer, got {limit}")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be a positive integer, got {max_new_tokens}")
        batch_size = DEFAULTS.batch_size if batch_size is None else batch_size
        if batch_size < 1:
            raise UserError(f"--batch-size must be a positive integer, got {batch_size}")
        if data_dir is not None and not os.path.isdir(data_dir):
            raise UserError(f"--data-dir {data_dir} is not a directory")
        try:
            sampling = Sampling(
                temperature=suite_sampling["temperature"] if temperature is None else temperature,
                top_p=suite_sampling["top_p"] if top_p is None else top_p,
                max_new_tokens=max_new_tokens or int(suite_sampling["max_new_tokens"]),
                n=samples or int(suite_sampling["n"]),
                seed=seed,
            )
        except AdapterError as exc:  # name the CLI option, not the dataclass field
            message = str(exc).replace("top_p", "--top-p").replace("temperature", "--temperature")
            raise UserError(message) from None
        if limit is None and suite == DEFAULTS.suite:
            limit = DEFAULTS.limit
        return cls(
            models=models,
            suite=suite,
            tasks=tuple(tasks) if tasks else None,
            loops=tuple(sorted(set(loops))),
            sampling=sampling,
            limit=limit,
            batch_size=batch_size,
            seed=seed,
            db_url=db_url,
            data_dir=data_dir,
            sampler_interval=sampler_interval,
            trust_remote_code=trust_remote_code,
        )

    def load_overrides(self, model: str) -> dict[str, Any]:
        """Overrides every adapter of this sweep is loaded with (the engine rejects unknown ones)."""
        overrides: dict[str, Any] = {"seed": self.seed}
        if self.trust_remote_code and model.partition(":")[0] in REMOTE_CODE_PREFIXES:
            overrides["trust_remote_code"] = True
        return overrides

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["sampling"] = dataclasses.asdict(self.sampling)
        data.pop("db_url")  # where it was stored is not part of what was run
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], db_url: str | None) -> RunSpec:
        fields = {**data, "db_url": db_url}
        fields["sampling"] = Sampling(**data["sampling"])
        for name in ("models", "loops", "tasks"):
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return cls(**fields)


def is_looped(description: dict[str, Any]) -> bool:
    """Whether loop counts mean anything for this model (per_loop / gated KV, or a trained T > 1)."""
    return description.get("kv_strategy", "standard") != "standard" or (description.get("loops") or 1) > 1


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
    error: str | None = None


def failure_summary(outcomes: Sequence[RunOutcome]) -> list[str]:
    """The lines that end a sweep with failed runs (none when every run finished)."""
    failed = [o for o in outcomes if o.status == "failed"]
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


@dataclass
class SweepPlan:
    """What a sweep will run, worked out before anything is written: task configs and (model, loops) pairs."""

    task_configs: list[Any]
    runs: list[tuple[str, int | None]]


def prepare_sweep(spec: RunSpec) -> SweepPlan:
    """Load the suite and each model once (to learn whether it loops); bad names fail here as UserError."""
    import adapters

    task_configs = _load_tasks(spec)
    runs: list[tuple[str, int | None]] = []
    for model in spec.models:
        description = adapters.load(model, **spec.load_overrides(model)).describe()
        if is_looped(description):
            runs.extend((model, r) for r in spec.loops)
        else:
            runs.append((model, None))
    return SweepPlan(task_configs, runs)


def run_sweep(
    spec: RunSpec, plan: SweepPlan, store: Store, progress: Progress | None = None, log: Callable[[str], None] = print
) -> list[RunOutcome]:
    """Run every (model, loops) of the plan as one sweep; returns one outcome per run, in order.

    A run that fails is stored as failed with its reason and the sweep goes on; Ctrl-C stops it.
    """
    sweep_id = uuid.uuid4().hex[:12]
    outcomes = []
    overall = progress.add_task(f"sweep {sweep_id}", total=len(plan.runs)) if progress is not None else None
    for model, loops in plan.runs:
        run_id = store.create_run(
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
            status="running",
        )
        log(f"run {run_id}: {model}" + (f" loops={loops}" if loops is not None else "") + f" on {spec.suite}")
        try:
            outcomes.append(_execute(spec, store, run_id, model, loops, plan.task_configs, progress, log))
        except Exception as exc:  # stored as failed with its reason; the next (model, loops) still runs
            error = _error(exc)
            store.finish_run(run_id, "failed", error=error)
            log(f"run {run_id} failed: {error}")
            outcomes.append(RunOutcome(run_id, model, loops, "failed", error=error))
        if progress is not None and overall is not None:
            progress.advance(overall)
    return outcomes


def resume_run(
    run_id: int, store: Store, db_url: str | None, progress: Progress | None = None, log: Callable[[str], None] = print
) -> RunOutcome:
    """Continue a stopped run: same spec, samples already stored are not generated again."""
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"--resume {run_id}: no such run in {store.url}")
    if run.kind != "eval":
        raise UserError(f"--resume {run_id}: run is a {run.kind} run, only eval runs resume")
    if run.status == "finished":
        raise UserError(f"--resume {run_id}: run already finished")
    if not run.spec:
        raise UserError(f"--resume {run_id}: run was stored without its spec and cannot be resumed")
    spec = RunSpec.from_dict(run.spec, db_url)
    task_configs = _load_tasks(spec)
    store.update_run(run_id, status="running", error=None)
    log(f"run {run_id}: resuming {run.model_spec}" + (f" loops={run.loops}" if run.loops is not None else ""))
    return _execute(spec, store, run_id, run.model_spec, run.loops, task_configs, progress, log, previous=run)


def _execute(
    spec: RunSpec,
    store: Store,
    run_id: int,
    model: str,
    loops: int | None,
    task_configs: list[Any],
    progress: Progress | None,
    log: Callable[[str], None],
    previous: Any | None = None,
) -> RunOutcome:
    """Generate and score one run, keeping the store current whatever happens."""
    import adapters
    from harness.bridge import CONTEXT_LIMIT, run_suite

    overrides = spec.load_overrides(model)
    if loops is not None:
        overrides["loops"] = loops
    adapter = adapters.load(model, **overrides)
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
        if result.context_cut:
            log(
                f"run {run_id}: {result.context_cut} samples reached the end of {model}'s context ({adapter.max_context} "
                f"tokens) before max_new_tokens={spec.sampling.max_new_tokens}; their finish reason is {CONTEXT_LIMIT!r}"
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
        error = _error(exc)
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
    return RunOutcome(run_id, model, loops, status, metrics)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


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

