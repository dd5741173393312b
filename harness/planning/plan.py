"""A sweep's plan: a RunSpec's runs (`db.record.PlannedRun`), worked out from the models' configs before anything is
written, and a stored run's RunSpec read back (what `--resume` runs).

Loop counts apply to looped models only: a plain model runs once. Each run is checked to fit the machine here, so
a sweep that cannot run is refused before its first row is stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.base import Sampling, checked_context, checked_description, checked_memory, hook
from db.record import PlannedRun
from db.sets import KV_AXIS, OWN_KV_DTYPE, own_kv_policy, resolved_kv
from db.session import display_url, resolve_db_url
from db.stored import DamagedRun
from harness.measurement.capacity import check_fits
from harness.errors import UserError
from harness.planning.defaults import DEFAULT_EXIT_CRITERION
from harness.planning.spec import RunSpec, is_looped

if TYPE_CHECKING:
    from db.store import Store


@dataclass
class SweepPlan:
    """What a sweep will run, worked out before anything is written: task configs and the runs, in the order they run.

    `loaded` keeps the adapters that had to be loaded to learn whether they loop (specs whose
    adapter cannot describe itself from its config), so the sweep does not load them twice.
    """

    task_configs: list[Any]
    runs: list[PlannedRun]
    loaded: dict[str, Any] = field(default_factory=dict)
    params: dict[str, int | None] = field(default_factory=dict)  # each model's parameters (None: unknown)
    devices: dict[str, str] = field(default_factory=dict)  # where each model computes (cpu, cuda)
    fingerprint: str | None = None  # of the task files (`suites.registry.data_fingerprint`), part of the runs' set


def load_tasks(spec: RunSpec) -> list[Any]:
    """The suite's LightEval task configs; unknown suite, task or missing data -> UserError."""
    from suites import SuiteError
    from suites.registry import load_suite

    try:
        return load_suite(
            spec.suite,
            tasks=list(spec.tasks) if spec.tasks else None,
            data_dir=None if spec.data_dir is None else Path(spec.data_dir),
        )
    except SuiteError as exc:
        raise UserError(str(exc)) from None


def prepare_sweep(spec: RunSpec) -> SweepPlan:
    """Check the suite and every model spec from configs, without loading weights where the adapter allows.

    Bad names fail here as UserError. Engine and zoo specs are described from their config files;
    other adapters are loaded once and kept for the sweep.
    """
    import adapters
    from suites.registry import data_fingerprint

    configs = load_tasks(spec)
    plan = SweepPlan(configs, [], fingerprint=data_fingerprint(configs))
    looped = False
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
            raise UserError(
                f"{model} has no tokenizer, so it cannot read a suite's prompts: evaluate a checkpoint "
                "(e.g. qwen3:PATH) or a zoo model; real-size presets are for `loopeval profile` and `estimate`"
            )
        runs = _model_runs(spec, plan, model, description)
        for run in runs:
            _check_fits(spec, run)
        plan.runs.extend(runs)
        looped = looped or is_looped(description)
    if spec.exit_thresholds and not looped:
        raise UserError("--exit-threshold applies to looped models, and none of the sweep's models loops")
    if spec.kv_policies and not looped:
        raise UserError(
            "--kv-policy applies to looped models, and none of the sweep's models loops (--kv-dtype applies to all)"
        )
    return plan


def _model_runs(spec: RunSpec, plan: SweepPlan, model: str, description: dict[str, Any]) -> list[PlannedRun]:
    """The runs of one model: each loop count at each exit threshold and KV policy (those outer, so the model is
    loaded once per point of them) for a looped model, one run for a plain one, as the loops axis treats it; either
    at each KV dtype, each KV setting resolved (`_kv_settings`). UserError where the exit axis cannot apply (a looped
    model outside the engine, or the gate criterion without a gate) or the KV axis (a model outside the engine).
    Whether its family takes a KV policy or dtype is its inspector's to say (`_check_fits`)."""
    if (spec.kv_policies or spec.kv_dtypes) and "kv_policy" not in description:
        option = "--kv-dtype" if spec.kv_dtypes else "--kv-policy"
        raise UserError(f"{option}: {model} is not an engine model, whose KV cache the axis sets")
    first = _planned(spec, plan, model)
    looped = is_looped(description)
    settings = _kv_settings(spec, model, description, looped)
    if not looped:
        return [dataclasses.replace(first, kv_policy=p, kv_dtype=d) for p, d in settings]
    if spec.exit_thresholds:
        config = description.get("config")
        if not isinstance(config, dict) or "exit_gate" not in config:
            raise UserError(f"--exit-threshold: {model} is not an engine model, whose per-token exit the axis sets")
        if spec.exit_criterion == DEFAULT_EXIT_CRITERION and not config["exit_gate"]:
            raise UserError(
                f"--exit-threshold: {model} has no exit gate for --exit-criterion {DEFAULT_EXIT_CRITERION}; "
                f"kl or entropy need none"
            )
    return [
        dataclasses.replace(
            first,
            loops=r,
            exit_threshold=t,
            exit_criterion=None if t is None else spec.exit_criterion,
            kv_policy=p,
            kv_dtype=d,
        )
        for t in spec.exit_thresholds or (None,)
        for p, d in settings
        for r in spec.loops
    ]


KvSetting = tuple[str | None, str | None]  # a run's (kv_policy, kv_dtype) columns: None where the model's own


def _kv_settings(spec: RunSpec, model: str, description: dict[str, Any], looped: bool) -> list[KvSetting]:
    """`model`'s KV settings, each as its runs store it: named on the axis (a policy only on a looped model) or by
    its own overrides, resolved (`db.sets.resolved_kv`: its own policy or dtype named is none named, shared-ema's
    ALPHA always written), so one setting is one run however it was named."""
    own = spec.model_overrides.get(model, {})
    policies = spec.kv_policies if spec.kv_policies and looped else (own.get("kv_policy"),)
    dtypes = spec.kv_dtypes or (own.get("kv_dtype"),)
    if policies == (None,) and dtypes == (None,):
        return [(None, None)]
    _check_own_kv(spec, model)
    strategy = description.get("kv_strategy")
    settings = []
    for policy in policies:
        for dtype in dtypes:
            named = {key: value for key, value in zip(KV_AXIS, (policy, dtype)) if value is not None}
            resolved = resolved_kv(named, strategy, description.get("family"))
            settings.append((resolved.get("kv_policy"), resolved.get("kv_dtype")))
    return list(dict.fromkeys(settings))


def _check_own_kv(spec: RunSpec, model: str) -> None:
    """Refuse a KV setting on a model whose config carries a KV setting of its own (a config.json written by hand:
    loopeval saves none, `save_checkpoint`): a run is identified by what it names beyond the model's own KV
    (`db.sets.own_kv_policy`), which such a model does not have."""
    import adapters

    plain = {key: value for key, value in spec.load_overrides(model).items() if key not in KV_AXIS}
    facts = adapters.inspect(model, **plain) or {}
    own = (own_kv_policy(facts.get("kv_strategy"), facts.get("family")), OWN_KV_DTYPE)
    if "kv_policy" in facts and (facts["kv_policy"], facts.get("kv_dtype")) != own:
        raise UserError(
            f"{model}: its config sets its own KV ({facts['kv_policy']}, {facts.get('kv_dtype')}), so a KV policy "
            "or dtype cannot be swept or overridden on it: set kv_policy and kv_dtype in its config.json back to "
            "none and auto, and name them with --kv-policy and --kv-dtype"
        )


def _planned(spec: RunSpec, plan: SweepPlan, model: str) -> PlannedRun:
    """`model`'s run on the spec's set and seed, off every axis: what each of its runs varies. Its stored spec keeps
    the models' overrides without their KV setting, which its runs' columns hold, resolved (`_kv_settings`)."""
    stored = spec.to_dict()
    kept = {
        name: {k: v for k, v in values.items() if k not in KV_AXIS} for name, values in spec.model_overrides.items()
    }
    stored["model_overrides"] = {name: values for name, values in kept.items() if values}
    return PlannedRun(
        model,
        None,
        spec.suite,
        tuple(t.name for t in plan.task_configs),
        dataclasses.asdict(spec.sampling),
        spec.seed,
        spec.limit,
        plan.fingerprint,
        spec=stored,
    )


def _check_fits(spec: RunSpec, run: PlannedRun) -> None:
    """Refuse a run whose weights and KV cache cannot fit the machine (new tokens only: a lower bound); the
    adapter checks the run's overrides (its exit threshold and KV policy and dtype among them) on the way, before
    anything is stored."""
    import adapters

    facts = adapters.inspect(
        run.model, **spec.run_overrides(run), **({} if run.loops is None else {"loops": run.loops})
    )
    if facts is None:
        return
    tokens = min(spec.sampling.max_new_tokens, facts.get("max_context", spec.sampling.max_new_tokens))
    sequences = min(spec.batch_size * spec.sampling.n, facts.get("max_batch", spec.batch_size * spec.sampling.n))
    what = run.model + ("" if run.loops is None else f" at loops={run.loops}")
    check_fits(what, facts, tokens, sequences, "--loops, --samples, --batch-size or --max-new-tokens")


def largest_model(params: Sequence[int | None]) -> int | None:
    """The parameters of the largest of these models; None when one of them has no known size (so treated as large)."""
    return None if not params or None in params else max(params)  # type: ignore[type-var]


def stored_params(store: Store, run_id: int) -> list[int | None]:
    """The parameters of every model of run `run_id`'s sweep, from their configs (what `--resume` runs)."""
    import adapters

    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"--resume {run_id}: no such run in {store.url}")
    spec = stored_spec(run, None, store.url)
    models = {r.model_spec for r in store.sweep_runs(run.sweep_id)}
    facts = [adapters.inspect(model, **spec.load_overrides(model)) for model in models]
    return [None if f is None else f.get("params") for f in facts]


def stored_spec(run: Any, db_url: str | None, where: str | None = None) -> RunSpec:
    """The RunSpec an eval run was stored with: `runs.spec`, and its sampling from `runs.sampling`.

    Both are JSON objects (`db.stored` checked them as the run was read); fields a RunSpec does not take, or
    values it refuses, make the run a `DamagedRun` too, named in one line with `where` (default: `db_url`).
    """
    column = "runs.sampling"
    try:
        Sampling(**run.sampling)
        column = "runs.spec"
        return RunSpec.from_dict(run.spec, run.sampling, db_url)
    except (TypeError, ValueError) as exc:  # UserError is a ValueError
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DamagedRun(
            run.id,
            column,
            f"does not hold what this loopeval stores there ({reason})",
            where or display_url(resolve_db_url(db_url)),
        ) from None
