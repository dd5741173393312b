"""What `loopeval run` is asked to do, from its flags or a sweep file (`--config sweep.toml`).

A sweep file is the long form of the flags: TOML with one key per flag of `loopeval run` (the flag's
name with underscores, `--max-new-tokens` is `max_new_tokens`), a list where the flag takes several
values, plus what flags cannot say: a model entry may be `{spec = "zoo:ouro-tiny", overrides =
{max_batch = 8}}`. The file's values are checked here (one line naming the key), merged with the
flags (a flag given beside `--config` overrides that key) and passed to the same `RunSpec.build`
call the flags use, so the stored RunSpec is identical either way and `harness.planning.spec` stays the one
home of the defaults. Several seeds make one RunSpec each, run as one sweep.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.base import AdapterError
from adapters.files import MIB, read_text
from harness.errors import UserError
from harness.planning.spec import DEFAULTS, EXITS, LAB, LEVERS, SUITE_SAMPLING, SWEEP_WIDE_OVERRIDES, RunSpec, check_sampling_given

EXECUTORS = ("local", "ray")
RAY_ONLY = ("ray_address", "gpus_per_run")  # settings that mean nothing to the local executor
MAX_WORKERS = 256  # the local executor's worker processes (`harness.execution.pool`)


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


# --- checks of single values: (name, value) -> value, UserError naming the key ----------------------


def _bad(name: str, what: str, value: Any) -> UserError:
    return UserError(f"{name} must be {what}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite int or float (TOML has inf and nan; no setting takes them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise _bad(name, "a positive integer", value)
    return value


def _int_list(name: str, value: Any, minimum: int, words: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(_is_int(v) and v >= minimum for v in value):
        raise _bad(name, f"a non-empty list of {words}", value)
    return value


def _positive_ints(name: str, value: Any) -> list[int]:
    return _int_list(name, value, 1, "positive integers")


MAX_RANGE = 1024  # values one range may expand to (no loop count or seed list is longer)


def int_ranges(value: str, name: str, minimum: int = 1) -> list[int]:
    """'1,2,4' or '1-12' or '1-4,8,16' -> the integers in order (a range includes both ends), duplicates dropped.

    Depth extrapolation sweeps every r from 1 past the trained T, so `--loops 1-12` is the short form.
    UserError naming `name` on anything else, on an item below `minimum` and on a reversed range.
    """
    words = "positive integers" if minimum == 1 else f"integers >= {minimum}"
    bad = UserError(f"{name} must be comma-separated {words} or ranges such as 1-12, got {value!r}")
    items: list[int] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        first, dash, last = part.partition("-") if not part.startswith("-") else (part, "", "")
        try:
            low, high = int(first), int(last) if dash else int(first)
        except ValueError:
            raise bad from None
        if low < minimum or high < low or high - low >= MAX_RANGE:
            raise bad
        items.extend(range(low, high + 1))
    if not items:
        raise bad
    return list(dict.fromkeys(items))


def float_list(value: str, name: str) -> list[float]:
    """'0.5,0.8,1' -> [0.5, 0.8, 1.0], duplicates dropped; UserError naming `name` on anything else (the values'
    ranges are `harness.planning.spec.check_exit`'s)."""
    try:
        items = [float(part) for part in (p.strip() for p in value.split(",")) if part]
    except ValueError:
        items = []
    if not items:
        raise UserError(f"{name} must be comma-separated numbers such as 0.5,0.8,1.0, got {value!r}")
    return list(dict.fromkeys(items))


def _thresholds(name: str, value: Any) -> list[float]:
    """A sweep file's exit thresholds: a list of finite numbers, or a string of them ("0.5,0.8,1.0")."""
    if isinstance(value, str):
        return float_list(value, name)
    if not isinstance(value, list) or not value or not all(_is_number(v) for v in value):
        raise _bad(name, "a non-empty list of finite numbers", value)
    return value


def string_list(value: str, name: str) -> list[str]:
    """'per-loop, shared-last' -> ['per-loop', 'shared-last']; UserError naming `name` when nothing is left (the values
    themselves are `harness.planning.spec`'s to check)."""
    items = [part for part in (p.strip() for p in value.split(",")) if part]
    if not items:
        raise UserError(f"{name} must be comma-separated names, got {value!r}")
    return items


def _names(name: str, value: Any) -> list[str]:
    """A sweep file's list of names (KV policies, KV dtypes), or a string of them ("per-loop,shared-last")."""
    return string_list(value, name) if isinstance(value, str) else _strings(name, value)


def _loops(name: str, value: Any) -> list[int]:
    """A sweep file's loops: a list of positive integers, or a string of them and ranges ("1-12")."""
    return int_ranges(value, name) if isinstance(value, str) else _positive_ints(name, value)


def _seeds(name: str, value: Any) -> list[int]:
    return _int_list(name, value, 0, "non-negative integers")


def _seed(name: str, value: Any) -> list[int]:
    if not _is_int(value) or value < 0:
        raise _bad(name, "a non-negative integer", value)
    return [value]


def _sampling(field: str) -> Callable[[str, Any], Any]:
    """The check of a sweep-file key that is `Sampling.field`: sampling's own rule, naming the key."""
    def check(name: str, value: Any) -> Any:
        check_sampling_given(field, value, name)
        return value
    return check


def _gpus(name: str, value: Any) -> float:
    if not _is_number(value) or value < 0:
        raise _bad(name, "a finite number >= 0", value)
    return float(value)


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(name, "a non-empty string", value)
    return value


def _suite(name: str, value: Any) -> str:
    if value not in SUITE_SAMPLING:
        raise _bad(name, f"one of {', '.join(SUITE_SAMPLING)}", value)
    return value


def _directory(name: str, value: Any) -> str:
    if not Path(_string(name, value)).expanduser().is_dir():
        raise UserError(f"{name}: {value} is not a directory")
    return value


def _strings(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise _bad(name, "a non-empty list of strings", value)
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, "true or false", value)
    return value


def _workers(name: str, value: Any) -> int:
    if not _is_int(value) or not 1 <= value <= MAX_WORKERS:
        raise _bad(name, f"a whole number of worker processes from 1 to {MAX_WORKERS}", value)
    return value


def _executor(name: str, value: Any) -> str:
    if value not in EXECUTORS:
        raise _bad(name, " or ".join(EXECUTORS), value)
    return value


def _models(name: str, value: Any) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """`models`: specs, or `{spec, overrides}` tables; returns the specs and their overrides."""
    if not isinstance(value, list) or not value:
        raise _bad(name, "a non-empty list of model specs or {spec, overrides} tables", value)
    specs: list[str] = []
    seen: set[str] = set()
    overrides: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(value):
        where = f"{name}[{i}]"
        if isinstance(entry, dict):
            unknown = sorted(set(entry) - {"spec", "overrides"})
            if unknown:
                raise UserError(f"{where}: unknown key {unknown[0]!r} (a model entry has spec and overrides)")
            spec = _string(f"{where}.spec", entry.get("spec"))
            overrides[spec] = _overrides(f"{where}.overrides", entry.get("overrides", {}))
        else:
            spec = _string(where, entry)
        if spec in seen:
            raise UserError(f"{where}: {spec} is listed twice")
        seen.add(spec)
        specs.append(spec)
    return specs, overrides


def _overrides(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(name, "a table of load overrides", value)
    for key, item in value.items():
        if key in SWEEP_WIDE_OVERRIDES:
            raise UserError(f"{name}.{key}: {key} is set for the whole sweep (the top-level {key} key), not per model")
        if not isinstance(item, (str, bool)) and not _is_number(item):
            raise _bad(f"{name}.{key}", "a string, finite number or boolean", item)
    return dict(value)


# Sweep-file key -> (check, keyword it becomes). `models` is special: it also gives `model_overrides`.
KEYS: dict[str, tuple[Callable[[str, Any], Any], str]] = {
    "models": (_models, "models"),
    "suite": (_suite, "suite"),
    "tasks": (_strings, "tasks"),
    "loops": (_loops, "loops"),
    "exit_threshold": (_thresholds, "exit_thresholds"),
    "exit_criterion": (_string, "exit_criterion"),
    "kv_policy": (_names, "kv_policies"),
    "kv_dtype": (_names, "kv_dtypes"),
    "samples": (_sampling("n"), "samples"),
    "temperature": (_sampling("temperature"), "temperature"),
    "top_p": (_sampling("top_p"), "top_p"),
    "max_new_tokens": (_sampling("max_new_tokens"), "max_new_tokens"),
    "limit": (_positive_int, "limit"),
    "batch_size": (_positive_int, "batch_size"),
    "seed": (_seed, "seeds"),
    "seeds": (_seeds, "seeds"),
    "data_dir": (_directory, "data_dir"),
    "trust_remote_code": (_flag, "trust_remote_code"),
    "db": (_string, "db_url"),
    "executor": (_executor, "executor"),
    "ray_address": (_string, "ray_address"),
    "gpus_per_run": (_gpus, "gpus_per_run"),
    "workers": (_workers, "workers"),
}


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
        if key not in KEYS:
            raise UserError(f"{path}: unknown key {key!r} (keys: {', '.join(KEYS)})")
        check, keyword = KEYS[key]
        try:
            checked = check(key, value)
        except UserError as exc:
            raise UserError(f"{path}: {exc}") from None
        if key == "models":
            values["models"], values["model_overrides"] = checked
        else:
            values[keyword] = checked
    return values


# What a sweep runs. Without any of these and without a sweep file, `loopeval run` is the default benchmark:
# the recurrence lab's sweep (harness.planning.spec.LAB), then the headline sweep, whose set the views open on, then the exit
# sweep (harness.planning.spec.EXITS) and the memory levers (harness.planning.spec.LEVERS), in the headline's set.
SWEEP_CHOICES = ("models", "suite", "tasks", "loops", "exit_thresholds", "kv_policies", "kv_dtypes", "samples", "temperature", "top_p", "max_new_tokens", "limit", "seeds")


def _check_grid(values: Mapping[str, Any], seeds: list[int]) -> None:
    """Refuse a sweep over MAX_RUNS runs before it is planned (planning one run reads its model's config)."""
    models = len(values.get("models") or DEFAULTS.models)
    loops = len(set(values.get("loops") or DEFAULTS.loops))
    thresholds = len(set(values.get("exit_thresholds") or [None]))
    kv = len(set(values.get("kv_policies") or [None])) * len(set(values.get("kv_dtypes") or [None]))
    runs = models * loops * thresholds * kv * len(set(seeds))
    if runs > MAX_RUNS:
        swept = (f" x {thresholds} exit thresholds" if thresholds > 1 else "") + (f" x {kv} KV settings" if kv > 1 else "")
        raise UserError(f"the sweep asks for up to {runs:,} runs ({models} models x {loops} loop counts{swept} x {len(set(seeds))} seeds), "
                        f"over the limit of {MAX_RUNS:,}: split it into several sweeps")


def build_request(flags: Mapping[str, Any], config: str | None = None) -> SweepRequest:
    """Flags (None = not given) over the sweep file's values, validated into one RunSpec per seed
    (between the lab's RunSpec and the exit and memory-lever sweeps' when nothing chose what runs)."""
    default_benchmark = config is None and all(flags.get(key) is None for key in SWEEP_CHOICES)
    values = read_sweep_file(config) if config else {}
    values.update({key: value for key, value in flags.items() if value is not None})
    if "model_overrides" in values:  # --model replaces the file's models: keep the overrides of those still run
        values["model_overrides"] = {m: o for m, o in values["model_overrides"].items() if m in values["models"]}
    executor = _executor("--executor", values.pop("executor", "local"))
    ray = {key: values.pop(key, None) for key in RAY_ONLY}
    if executor != "ray":
        for key, value in ray.items():
            if value is not None:
                raise UserError(f"--{key.replace('_', '-')} ({key} in a sweep file) applies only to --executor ray")
    if ray["gpus_per_run"] is not None:
        _gpus("--gpus-per-run", ray["gpus_per_run"])
    workers = values.pop("workers", None)
    if workers is not None:
        _workers("--workers", workers)
        if executor != "local":
            raise UserError("--workers (workers in a sweep file) applies only to --executor local: Ray places each run itself")
    seeds = values.pop("seeds", None) or [0]
    _check_grid(values, seeds)
    specs = tuple(RunSpec.build(**values, seed=seed) for seed in dict.fromkeys(seeds))
    if default_benchmark:
        specs = (RunSpec.build(**values, **LAB.options()), *specs, RunSpec.build(**values, **EXITS.options()),
                 *(RunSpec.build(**values, **options) for options in LEVERS.options()))
    return SweepRequest(specs, executor, ray["ray_address"], ray["gpus_per_run"], workers)
