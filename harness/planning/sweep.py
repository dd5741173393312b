"""What `loopeval run` is asked to do, from its flags or a sweep file (`--config sweep.toml`).

A sweep file is the long form of the flags: TOML with one key per flag of `loopeval run` (the flag's
name with underscores, `--max-new-tokens` is `max_new_tokens`; both declared in `harness.planning.options`), a list
where the flag takes several values, plus what flags cannot say: a model entry may be `{spec = "zoo:ouro-tiny", overrides =
{max_batch = 8}}`. The file's values are checked key by key (one line naming the key), merged with the
flags (a flag given beside `--config` overrides that key) and passed to the same `RunSpec.build`
call the flags use, so the stored RunSpec is identical either way and `harness.planning.defaults` stays the one
home of the defaults. Several seeds make one RunSpec each, run as one sweep.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adapters
from adapters.base import AdapterError
from adapters.files import MIB, read_text
from harness.errors import UserError
from harness.planning.defaults import DEFAULTS, EXITS, LAB, LEVERS
from harness.planning.options import BY_KEY, RAY_ONLY, SWEEP_CHOICES
from harness.planning.spec import RunSpec


@dataclass(frozen=True)
class SweepRequest:
    """One validated `loopeval run`: a RunSpec per seed, and where the runs execute."""

    specs: tuple[RunSpec, ...]
    executor: str = "local"
    ray_address: str | None = None
    gpus_per_run: float | None = None
    workers: int | None = None  # the local executor's worker processes (None: `harness.execution.pool.default_workers`)

    @property
    def db(self) -> str | None:
        return self.specs[0].db_url


SWEEP_FILE_LIMIT = MIB  # bytes: a sweep file of the paper's whole table is a few KB
MAX_RUNS = 10_000  # runs one sweep may plan (models x loop counts x seeds): the paper's table is under 100


def read_sweep_file(path: str | Path) -> dict[str, Any]:
    """The sweep file's settings as keyword values of `build_request`; UserError names the file and the key."""
    path = Path(path)
    try:
        data = tomllib.loads(read_text(path, "--config", SWEEP_FILE_LIMIT))
    except AdapterError as exc:
        raise UserError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    if "seed" in data and "seeds" in data:
        raise UserError(f"{path}: give seed or seeds, not both")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in BY_KEY:
            raise UserError(f"{path}: unknown key {key!r} (keys: {', '.join(BY_KEY)})")
        option = BY_KEY[key]
        try:
            checked = option.check(key, value)
        except UserError as exc:
            raise UserError(f"{path}: {exc}") from None
        if key == "models":
            values["models"], values["model_overrides"] = checked
        else:
            values[option.keyword] = checked
    return values


def _check_grid(spec: RunSpec, seeds: int) -> None:
    """Refuse a sweep over MAX_RUNS runs before it is planned (planning one run reads its model's config). Counted
    on the built spec, so each model, loop count and KV setting counts once however it was spelled (a bare name and
    its prefixed spec, `shared-ema` and `shared-ema:0.5`)."""
    models, loops = len(spec.models), len(spec.loops)
    thresholds = len(spec.exit_thresholds) or 1
    kv = (len(spec.kv_policies) or 1) * (len(spec.kv_dtypes) or 1)
    runs = models * loops * thresholds * kv * seeds
    if runs > MAX_RUNS:
        swept = (f" x {thresholds} exit thresholds" if thresholds > 1 else "") + (
            f" x {kv} KV settings" if kv > 1 else ""
        )
        raise UserError(
            f"the sweep asks for up to {runs:,} runs ({models} models x {loops} loop counts{swept} x {seeds} seeds), "
            f"over the limit of {MAX_RUNS:,}: split it into several sweeps"
        )


def _model(name: str) -> str:
    """The full spec `name` stands for (a bare name and its prefixed spec are one model); a name that stands for
    none as it is, for `RunSpec.build` to refuse."""
    try:
        return adapters.resolve(name)
    except AdapterError:
        return name


def is_default_benchmark(flags: Mapping[str, Any], config: str | None) -> bool:
    """Whether nothing chose what runs: no sweep file and none of the flags that pick models, suite or axes."""
    return config is None and all(flags.get(key) is None for key in SWEEP_CHOICES)


def planning_line(flags: Mapping[str, Any], config: str | None, resume: int | None) -> str:
    """The job's first line, said before anything slow (importing torch, reading the models' configs): what it
    plans, so a log (`loopeval run > run.log`) shows within a second that the job has started and what it is."""
    if resume is not None:
        what = f"continuing the sweep of run {resume}"
    elif config is not None:
        what = f"the sweep file {config}"
    elif is_default_benchmark(flags, config):
        what = "the default benchmark: the lab's depth sweep, the headline sweep, the exit sweep and the memory levers"
    else:
        models = flags.get("models") or DEFAULTS.models
        what = f"{', '.join(models)} on the {flags.get('suite') or DEFAULTS.suite} suite"
    return f"job: {what}; planning"


def build_request(flags: Mapping[str, Any], config: str | None = None) -> SweepRequest:
    """Flags (None = not given) over the sweep file's values, validated into one RunSpec per seed
    (between the lab's RunSpec and the exit and memory-lever sweeps' when nothing chose what runs)."""
    default_benchmark = is_default_benchmark(flags, config)
    values = read_sweep_file(config) if config else {}
    values.update({key: value for key, value in flags.items() if value is not None})
    if "model_overrides" in values:  # --model replaces the file's models: keep the overrides of those still run
        run = {_model(m) for m in values["models"]}
        values["model_overrides"] = {m: o for m, o in values["model_overrides"].items() if _model(m) in run}
    executor = BY_KEY["executor"].check("--executor", values.pop("executor", "local"))
    ray = {key: values.pop(key, None) for key in RAY_ONLY}
    if executor != "ray":
        for key, value in ray.items():
            if value is not None:
                raise UserError(f"--{key.replace('_', '-')} ({key} in a sweep file) applies only to --executor ray")
    if ray["gpus_per_run"] is not None:
        BY_KEY["gpus_per_run"].check("--gpus-per-run", ray["gpus_per_run"])
    workers = values.pop("workers", None)
    if workers is not None:
        BY_KEY["workers"].check("--workers", workers)
        if executor != "local":
            raise UserError(
                "--workers (workers in a sweep file) applies only to --executor local: Ray places each run itself"
            )
    first, *others = dict.fromkeys(values.pop("seeds", None) or [0])
    specs: tuple[RunSpec, ...] = (RunSpec.build(**values, seed=first),)
    _check_grid(specs[0], 1 + len(others))
    specs += tuple(RunSpec.build(**values, seed=seed) for seed in others)
    if default_benchmark:
        specs = (
            RunSpec.build(**values, **LAB.options()),
            *specs,
            RunSpec.build(**values, **EXITS.options()),
            *(RunSpec.build(**values, **options) for options in LEVERS.options()),
        )
    return SweepRequest(specs, executor, ray["ray_address"], ray["gpus_per_run"], workers)
