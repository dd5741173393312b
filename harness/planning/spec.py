"""What a run is: `RunSpec`, the validated request for one sweep, and the checks of what its settings mean.

`RunSpec.build` fills what the user left unset from `harness.planning.defaults` (each suite's sampling, the default
job) and validates everything before anything is loaded or written; how each setting is given (flag, sweep-file key)
is `harness.planning.options`'. `at_loops` is the one way a loaded adapter is set to a run's loops (and a profile's
batching).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import adapters
from adapters.base import EXIT_CRITERIA, MAX_STORED_INT, AdapterError, Sampling, check_exit_threshold, hook
from adapters.engine.config import MAX_LOOPS
from adapters.engine.kv.policies import KV_DTYPES, parse_kv_policy
from db.sets import KV_POLICY_LENGTH, kv_policy_text
from harness.errors import UserError
from harness.planning.defaults import DEFAULT_EXIT_CRITERION, DEFAULTS, SUITE_SAMPLING
from harness.planning.options import SAMPLING_FLAGS, SWEEP_WIDE_OVERRIDES, check_sampling_given
from harness.measurement.sampler import DEFAULT_INTERVAL

if TYPE_CHECKING:
    from db.record import PlannedRun

# Bounds that catch typos before anything is loaded or written (sampling's are `adapters.base.SAMPLING_RULES`).
# Stored integers end in signed 64-bit columns; the others are far beyond any real run (r <= 8 in the paper).
BOUNDS: dict[str, tuple[int, int]] = {
    "--loops": (1, MAX_LOOPS),
    "--limit": (1, MAX_STORED_INT),
    "--batch-size": (1, 1 << 16),
    "--seed": (0, MAX_STORED_INT),
    "--batch": (1, 1 << 16),  # profile: sequences per point
    "--lengths": (1, 1 << 24),  # profile: context lengths
    "--decode-steps": (1, 1 << 16),
}


def check_int(option: str, value: int | None) -> None:
    """UserError naming the option when `value` is outside its BOUNDS (None: not given)."""
    low, high = BOUNDS[option]
    if value is not None and not low <= value <= high:
        raise UserError(f"{option} must be an integer from {low} to {high}, got {value}")


def suite_sampling(suite: str) -> Sampling:
    """`suite`'s sampling where the user gave none."""
    if suite not in SUITE_SAMPLING:
        raise UserError(f"unknown suite {suite!r} (suites: {', '.join(SUITE_SAMPLING)})")
    return SUITE_SAMPLING[suite]


def check_exit(thresholds: Sequence[float], criterion: str | None) -> None:
    """UserError naming the option on a bad exit axis: the criterion one of EXIT_CRITERIA, each threshold in the
    criterion's range (`adapters.base.check_exit_threshold`, the engine's rule: a gate's cumulative exit probability in
    [0, 1], 0 = one loop; a KL divergence or entropy change >= 0). A criterion without thresholds sweeps nothing, so it
    is refused rather than ignored."""
    if criterion is not None and criterion not in EXIT_CRITERIA:
        raise UserError(f"--exit-criterion must be one of {', '.join(EXIT_CRITERIA)}, got {criterion!r}")
    if criterion is not None and not thresholds:
        raise UserError("--exit-criterion applies only with --exit-threshold (the thresholds it sweeps)")
    for value in thresholds:
        try:
            check_exit_threshold(value, criterion or DEFAULT_EXIT_CRITERION, "--exit-threshold")
        except AdapterError as error:
            raise UserError(str(error)) from None


def checked_kv_policy(value: str, option: str = "--kv-policy") -> str:
    """`value` as a KV policy in its one text (`db.sets.kv_policy_text`: `shared-ema:.5` and `shared-ema` ->
    `shared-ema:0.5`, ALPHA kept as given, so one policy is one identity); the engine's check
    (`adapters.engine.kv.policies`) refuses an unknown policy or an ALPHA outside (0, 1), as a UserError naming
    `option`."""
    try:
        parse_kv_policy(value.strip(), option)
    except AdapterError as error:
        raise UserError(str(error)) from None
    text = kv_policy_text(value.strip())
    if len(text) > KV_POLICY_LENGTH:
        raise UserError(
            f"{option} {value!r} is {len(text)} characters as stored, over {KV_POLICY_LENGTH}: give ALPHA with fewer digits"
        )
    return text


def checked_kv_dtype(value: str, option: str = "--kv-dtype") -> str:
    """`value` as a KV dtype; UserError naming `option` on anything else."""
    if value not in KV_DTYPES:
        raise UserError(f"{option} must be one of {', '.join(KV_DTYPES)}, got {value!r}")
    return value


# Backends that can run code shipped inside a model directory, and so take trust_remote_code.
REMOTE_CODE_PREFIXES = ("transformers", "vllm")
DEVICES = ("cpu", "cuda")  # where a model computes: `--device` and the `device` load override


def checked_device(option: str, value: str) -> str:
    """`value` as a device this machine has; UserError naming `option` on another name, or on cuda without CUDA."""
    if value not in DEVICES:
        raise UserError(f"{option} must be {' or '.join(DEVICES)}, got {value!r}")
    import torch

    if value == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"{option} cuda: torch {torch.__version__} sees no CUDA device on this machine (use --device cpu)"
        )
    return value


# Load overrides the exit axis (`--exit-threshold`, `--exit-criterion`) and the KV axis (`--kv-policy`, `--kv-dtype`) set per run.
EXIT_OVERRIDES = ("exit_threshold", "exit_criterion")
KV_OVERRIDES = ("kv_policy", "kv_dtype")


@dataclass(frozen=True)
class RunSpec:
    """A validated request for one sweep. Construct it with `RunSpec.build()` from CLI values."""

    models: tuple[str, ...]
    suite: str
    tasks: tuple[str, ...] | None  # None: the suite's DEFAULT_TASKS
    loops: tuple[int, ...]
    sampling: Sampling
    limit: int | None
    batch_size: int
    seed: int
    db_url: str | None = None
    data_dir: str | None = None
    sampler_interval: float = DEFAULT_INTERVAL
    trust_remote_code: bool = False  # only for transformers:/vllm: specs; their loaders warn when used
    # model spec -> load overrides of that model only (a sweep file's `{spec = ..., overrides = {...}}`);
    # runs stored before this field existed have none, which from_dict keeps working.
    model_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The per-token early-exit axis: one run per threshold of each looped model (empty: not swept; the models'
    # own exit policy). The criterion is None when no threshold is swept. Specs stored before it have neither.
    exit_thresholds: tuple[float, ...] = ()
    exit_criterion: str | None = None
    # The KV memory axis: one run per policy of each looped model (a plain model keeps its standard cache) and per
    # dtype of every model (empty: not swept; the model's own). Specs stored before it have neither.
    kv_policies: tuple[str, ...] = ()
    kv_dtypes: tuple[str, ...] = ()

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
        model_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        exit_thresholds: Sequence[float] | None = None,
        exit_criterion: str | None = None,
        kv_policies: Sequence[str] | None = None,
        kv_dtypes: Sequence[str] | None = None,
        device: str | None = None,
    ) -> RunSpec:
        """Fill unset values and check every field; UserError names the bad option.

        Unset sampling values come from the suite's entry in SUITE_SAMPLING, the rest from DEFAULTS. `device`
        (`--device`) becomes every model's `device` override where its own overrides set none: stored with them,
        it is part of what the runs were (a run on cuda is not a run on cpu).
        """
        suite = suite or DEFAULTS.suite
        defaults = suite_sampling(suite)
        models, named = _named_models(models or DEFAULTS.models, model_overrides or {})  # by their full specs
        loops = tuple(loops or DEFAULTS.loops)
        batch_size = DEFAULTS.batch_size if batch_size is None else batch_size
        for option, value in (("--limit", limit), ("--batch-size", batch_size), *(("--loops", r) for r in loops)):
            check_int(option, value)
        given: dict[str, Any] = {
            "temperature": temperature,
            "top_p": top_p,
            "max_new_tokens": max_new_tokens,
            "n": samples,
            "seed": seed,
        }
        given = {name: value for name, value in given.items() if value is not None}
        for name, value in given.items():
            check_sampling_given(name, value, SAMPLING_FLAGS[name])
        if data_dir is not None and not os.path.isdir(data_dir):
            raise UserError(f"--data-dir {data_dir} is not a directory")
        sampling = dataclasses.replace(defaults, **given)
        limit = DEFAULTS.limit if limit is None else limit
        per_model = _checked_model_overrides(named)
        if device is not None:
            checked_device("--device", device)
            per_model = {model: {"device": device, **per_model.get(model, {})} for model in models}
        check_exit(tuple(exit_thresholds or ()), exit_criterion)
        thresholds = tuple(sorted(set(float(t) for t in exit_thresholds or ())))
        policies = tuple(dict.fromkeys(checked_kv_policy(str(p)) for p in kv_policies or ()))
        dtypes = tuple(dict.fromkeys(checked_kv_dtype(d) for d in kv_dtypes or ()))
        for model, values in per_model.items():
            if thresholds and set(EXIT_OVERRIDES) & set(values):
                raise UserError(
                    f"overrides of {model}: --exit-threshold sweeps the exit policy, so the model's own exit overrides cannot be kept"
                )
            for swept, key, option in ((policies, "kv_policy", "--kv-policy"), (dtypes, "kv_dtype", "--kv-dtype")):
                if swept and key in values:
                    raise UserError(
                        f"overrides of {model}: {option} sweeps {key}, so the model's own {key} override cannot be kept"
                    )
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
            model_overrides=per_model,
            exit_thresholds=thresholds,
            exit_criterion=(exit_criterion or DEFAULT_EXIT_CRITERION) if thresholds else None,
            kv_policies=policies,
            kv_dtypes=dtypes,
        )

    def load_overrides(self, model: str) -> dict[str, Any]:
        """Overrides `model` is loaded with: the sweep's seed, then its own (the adapter rejects unknown ones)."""
        overrides: dict[str, Any] = {"seed": self.seed, **self.model_overrides.get(model, {})}
        if self.trust_remote_code and model.partition(":")[0] in REMOTE_CODE_PREFIXES:
            overrides["trust_remote_code"] = True
        return overrides

    def run_overrides(self, run: PlannedRun) -> dict[str, Any]:
        """Overrides `run` is loaded with: its model's `load_overrides`, its point on the exit axis (the criterion only
        where it is not the gate, the engine's default) and on the KV axis (each only where swept)."""
        overrides = self.load_overrides(run.model)
        if run.exit_threshold is not None:
            overrides["exit_threshold"] = run.exit_threshold
            if run.exit_criterion not in (None, DEFAULT_EXIT_CRITERION):
                overrides["exit_criterion"] = run.exit_criterion
        overrides.update({k: v for k, v in zip(KV_OVERRIDES, (run.kv_policy, run.kv_dtype)) if v is not None})
        return overrides

    def to_dict(self) -> dict[str, Any]:
        """As `runs.spec` stores it: without the sampling, which `runs.sampling` holds (`from_dict` takes it back)."""
        data = dataclasses.asdict(self)
        data.pop("sampling")
        data.pop("db_url")  # where it was stored is not part of what was run
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], sampling: Mapping[str, Any], db_url: str | None) -> RunSpec:
        """The spec `to_dict` stored, with its `sampling` (as `runs.sampling` holds it) and the store it was read from."""
        fields = {**data, "sampling": Sampling(**sampling), "db_url": db_url}
        for name in ("models", "loops", "tasks", "exit_thresholds", "kv_policies", "kv_dtypes"):
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return cls(**fields)


def _named_models(
    names: Sequence[str], overrides: Mapping[str, Mapping[str, Any]]
) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
    """The sweep's models, each once by its full spec (a bare name and its prefixed spec are one model), and the
    overrides each was given (`overrides` keys a model by any of its names). A model named twice with different
    overrides is refused: which of them to run cannot be told, and keeping either would drop the other unseen."""
    chosen: dict[str, tuple[str, dict[str, Any]]] = {}
    given = [(name, overrides.get(name, {})) for name in names]
    for name, values in [*given, *((n, o) for n, o in overrides.items() if n not in names)]:
        model, values = adapters.resolve(name), _canonical_overrides(name, values)
        if model not in chosen and name not in names:
            raise UserError(f"overrides are given for {model}, which is not one of the sweep's models")
        first, kept = chosen.get(model, (name, values))
        if kept != values and (name in names or kept):
            raise UserError(f"{model} is named twice ({first!r} and {name!r}) with different overrides: name it once")
        chosen[model] = (first, kept or values)
    return tuple(chosen), {model: values for model, (_, values) in chosen.items()}


def _canonical_overrides(name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A model's overrides with its KV policy in its one text (`checked_kv_policy`) and its KV dtype checked, so
    that a policy given per model and on the axis are one setting."""
    canonical = dict(values)
    if isinstance(canonical.get("kv_policy"), str):
        canonical["kv_policy"] = checked_kv_policy(canonical["kv_policy"], f"overrides of {name}: kv_policy")
    if isinstance(canonical.get("kv_dtype"), str):
        checked_kv_dtype(canonical["kv_dtype"], f"overrides of {name}: kv_dtype")
    return canonical


def _checked_model_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-model overrides as stored: never a sweep-wide setting, empty ones dropped."""
    checked = {}
    for model, values in overrides.items():
        for key in SWEEP_WIDE_OVERRIDES:
            if key in values:
                raise UserError(f"overrides of {model}: {key} is set for the whole sweep, not per model")
        if "device" in values:  # what `--device` takes, checked the same way before anything loads
            checked_device(f"overrides of {model}: device", values["device"])
        if values:
            checked[model] = dict(values)
    return checked


def is_looped(description: dict[str, Any]) -> bool:
    """Whether loop counts mean anything for this model (per_loop / gated KV, or a trained T > 1)."""
    return description.get("kv_strategy", "standard") != "standard" or (description.get("loops") or 1) > 1


def at_loops(
    adapter: Any, model: str, loops: int | None, overrides: Mapping[str, Any], batching: str | None = None
) -> Any:
    """`model`'s adapter set to run `loops` (None: its own) and, where it batches, with `batching` (None: as it is).

    An adapter that has them (the engine) is changed in place through its `loops` and `batching`
    properties, which check the values as a load override is checked: a second full load would double
    load time on a GPU and can inflate NVML peaks. Its memory peak is reset, so the next measurement's
    peaks are its own. Any other adapter, or none yet (`adapter` None), is loaded with `overrides` and `loops`.
    Each property and hook goes through `adapters.base.hook`: a plugin's that raises is one line.
    """

    def has(name: str) -> bool:
        return hook(model, name, hasattr, adapter, name)

    if adapter is None or (loops is not None and not has("loops")):
        adapter = adapters.load(model, **{**overrides, **({} if loops is None else {"loops": loops})})
    else:
        if loops is not None:
            hook(model, "its loops setter", setattr, adapter, "loops", loops)
        if has("reset_memory_peak"):
            hook(model, "reset_memory_peak()", adapter.reset_memory_peak)
    if batching is not None and has("batching"):
        hook(model, "its batching setter", setattr, adapter, "batching", batching)
    return adapter
