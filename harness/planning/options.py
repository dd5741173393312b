"""Every setting of `loopeval run`, declared once: its flag, its sweep-file key, the keyword it becomes, how flag
text is read and how a sweep file's value is checked (`OPTIONS`).

`harness.cli.run` makes a typer option of each row, `harness.planning.sweep` reads a sweep file's keys and merges
the flags over them, and `RunSpec.build` (`harness.planning.spec`) takes the keywords and validates what they mean
together. A new setting is a row here plus its use: the RunSpec field (or the request's) and what reads it.
A flag is `--` and its key with dashes (`max_new_tokens`: `--max-new-tokens`) unless its row says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from adapters.base import EXIT_CRITERIA, PAPER_PROTOCOL, AdapterError, check_sampling
from adapters.engine.kv.policies import KV_DTYPES, POLICIES_TEXT
from harness.errors import UserError
from harness.planning.defaults import DEFAULT_EXIT_CRITERION, DEFAULTS, SUITE_SAMPLING

EXECUTORS = ("local", "ray")
RAY_ONLY = ("ray_address", "gpus_per_run")  # settings that mean nothing to the local executor
MAX_WORKERS = 256  # the local executor's worker processes (`harness.execution.pool`)
# Set for the whole sweep, never per model: loops are what a sweep varies, the seed what makes it repeatable.
SWEEP_WIDE_OVERRIDES = ("loops", "seed")


def check_sampling_given(field: str, value: Any, given_as: str) -> None:
    """`Sampling.field`'s rule (`adapters.base.check_sampling`) as a UserError naming the option or sweep-file key."""
    try:
        check_sampling(field, value, given_as)
    except AdapterError as exc:
        raise UserError(str(exc)) from None


# --- checks of single values: (name, value) -> value, UserError naming the key ----------------------


def _bad(name: str, what: str, value: Any) -> UserError:
    return UserError(f"{name} must be {what}, got {value!r}")


def _is_int(value: Any) -> TypeGuard[int]:
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


def _sampling(name: str, value: Any) -> Any:
    """A sweep-file key that sets a `Sampling` field (its row's `sampling`): sampling's own rule, naming the key."""
    check_sampling_given(BY_KEY[name].sampling or name, value, name)
    return value


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
    return str(value)


def _directory(name: str, value: Any) -> str:
    path = _string(name, value)
    if not Path(path).expanduser().is_dir():
        raise UserError(f"{name}: {value} is not a directory")
    return path


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
    return str(value)


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


def _task_names(value: str, flag: str) -> list[str] | None:
    """`--tasks a, b` -> ['a', 'b']; `--tasks ''`: not given."""
    return [t.strip() for t in value.split(",") if t.strip()] if value else None


def _seed_ranges(value: str, flag: str) -> list[int]:
    return int_ranges(value, flag, minimum=0)


def _given_flag(value: bool, flag: str) -> bool | None:
    """An on/off flag left off is not given, so a sweep file's `true` stands."""
    return value or None


Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class RunOption:
    """One setting of `loopeval run`. `key`: its sweep-file key; `keyword`: what `build_request` (and `RunSpec.build`,
    or the request) takes; `check`: a sweep file's value checked, (key, value) -> value, UserError naming the key;
    `help` and `type`: its flag as typer declares it (no help: a flag the CLI shares with other commands,
    `harness.cli.common`; no type: the sweep file's only); `read`: the flag's value as the keyword takes it (None: as
    typed), (value, flag) -> value; `chooses`: it chooses what runs (none given, and no sweep file: the default job);
    `sampling`: the `adapters.base.Sampling` field it sets, whose rule checks it."""

    key: str
    keyword: str
    check: Check
    help: str | None = None
    type: Any = None
    read: Callable[[Any, str], Any] | None = None
    flag_name: str | None = None
    chooses: bool = False
    sampling: str | None = None

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.key.replace("_", "-")

    def given(self, value: Any) -> Any:
        """The flag's value as `build_request` takes it (None: not given)."""
        return value if value is None or self.read is None else self.read(value, self.flag)


_SYNTHETIC = SUITE_SAMPLING[DEFAULTS.suite]

OPTIONS: tuple[RunOption, ...] = (
    RunOption(
        "models",
        "models",
        _models,
        type=list[str],
        flag_name="--model",
        chooses=True,
        help=f"Model spec, repeatable (see `loopeval models`). Default: {', '.join(DEFAULTS.models)}.",
    ),
    RunOption(
        "suite",
        "suite",
        _suite,
        type=str,
        chooses=True,
        help=f"Suite name (see `loopeval suites`). Default: {DEFAULTS.suite}.",
    ),
    RunOption(
        "tasks",
        "tasks",
        _strings,
        type=str,
        read=_task_names,
        chooses=True,
        help="Comma-separated task names of the suite. Default: the suite's default tasks (synthetic: the chains and "
        "c30k2-c30k8).",
    ),
    RunOption(
        "loops",
        "loops",
        _loops,
        type=str,
        read=int_ranges,
        chooses=True,
        help="Comma-separated loop counts for looped models; ranges too (1-12: depth extrapolation). "
        f"Default: {','.join(map(str, DEFAULTS.loops))}.",
    ),
    RunOption(
        "exit_threshold",
        "exit_thresholds",
        _thresholds,
        type=str,
        read=float_list,
        chooses=True,
        help="Comma-separated per-token early-exit thresholds: each looped engine model runs once per threshold (and "
        "loop count), a token stopping its loops once the exit criterion reaches it. Gate: in [0, 1] (0 = one "
        "loop, 1 = all r); kl, entropy: >= 0. Default: not swept (each model's own exit policy).",
    ),
    RunOption(
        "exit_criterion",
        "exit_criterion",
        _string,
        type=str,
        help=f"What --exit-threshold is compared with: {', '.join(EXIT_CRITERIA)}. Default: {DEFAULT_EXIT_CRITERION} "
        "(Ouro's learned exit gate).",
    ),
    RunOption(
        "kv_policy",
        "kv_policies",
        _names,
        type=str,
        read=string_list,
        chooses=True,
        help="Comma-separated KV policies: each looped engine model runs once per policy (a plain model keeps its "
        f"standard cache): {POLICIES_TEXT}. A policy a model's family "
        "cannot take is refused. Default: not swept (each model's own).",
    ),
    RunOption(
        "kv_dtype",
        "kv_dtypes",
        _names,
        type=str,
        read=string_list,
        chooses=True,
        help=f"Comma-separated KV cache dtypes, each model run once per dtype: {', '.join(KV_DTYPES)} (auto: the "
        "model's dtype; int8 and fp8 keep a scale per token and head). Default: not swept (auto).",
    ),
    RunOption(
        "samples",
        "samples",
        _sampling,
        type=int,
        chooses=True,
        sampling="n",
        help=f"Samples per problem (pass@1 is their mean). Default: the suite's ({_SYNTHETIC.n} on {DEFAULTS.suite}).",
    ),
    RunOption(
        "temperature",
        "temperature",
        _sampling,
        type=float,
        chooses=True,
        sampling="temperature",
        help=f"Sampling temperature, >= 0 (0 = greedy). Default: the suite's ({_SYNTHETIC.temperature} on "
        f"{DEFAULTS.suite}).",
    ),
    RunOption(
        "top_p",
        "top_p",
        _sampling,
        type=float,
        chooses=True,
        sampling="top_p",
        help=f"Nucleus top-p in (0, 1]. Default: the suite's ({_SYNTHETIC.top_p} on {DEFAULTS.suite}).",
    ),
    RunOption(
        "max_new_tokens",
        "max_new_tokens",
        _sampling,
        type=int,
        chooses=True,
        sampling="max_new_tokens",
        help=f"New tokens per sample. Default: the suite's ({_SYNTHETIC.max_new_tokens} on {DEFAULTS.suite}, "
        f"{PAPER_PROTOCOL.max_new_tokens} on paper).",
    ),
    RunOption("limit", "limit", _positive_int, type=int, chooses=True, help="Docs per task. Default: all."),
    RunOption(
        "batch_size",
        "batch_size",
        _positive_int,
        type=int,
        help="Prompts per generate call, and docs per log-likelihood forward. The engine schedules its own batches: "
        "it takes each task's docs at once and decodes its max_batch override's sequences together. "
        f"Default: {DEFAULTS.batch_size}.",
    ),
    RunOption(
        "seed",
        "seeds",
        _seed,
        type=str,
        read=_seed_ranges,
        chooses=True,
        sampling="seed",
        help="Seed for weights of random presets and for sampling; comma-separated seeds run the sweep once per seed. "
        "Default: 0.",
    ),
    RunOption("seeds", "seeds", _seeds),
    RunOption(
        "data_dir",
        "data_dir",
        _directory,
        type=str,
        help="Directory with local copies of suite datasets (JSONL or parquet).",
    ),
    RunOption("trust_remote_code", "trust_remote_code", _flag, type=bool, read=_given_flag),
    RunOption("db", "db_url", _string, type=str),
    RunOption(
        "executor",
        "executor",
        _executor,
        type=str,
        help="local: the runs one after another in this process (default). ray: each run a Ray task.",
    ),
    RunOption(
        "ray_address",
        "ray_address",
        _string,
        type=str,
        help="Ray cluster to submit to (--executor ray). Default: $RAY_ADDRESS, else a new local Ray instance.",
    ),
    RunOption(
        "gpus_per_run",
        "gpus_per_run",
        _gpus,
        type=float,
        help="GPUs each run requests (--executor ray; a fraction shares a GPU). Default: 1 on a cluster with GPUs, "
        "else one CPU per run.",
    ),
    RunOption(
        "device",
        "device",
        _string,
        type=str,
        help="Where every model computes: cpu or cuda (a model's own device override in a sweep file wins). "
        "Default: each model's own (the engine's: cuda where torch sees one, else cpu).",
    ),
    RunOption(
        "workers",
        "workers",
        _workers,
        type=int,
        help="Runs side by side in worker processes (--executor local). Default: the cores this process may use "
        "over each run's threads, 1 on a GPU.",
    ),
)
BY_KEY = {option.key: option for option in OPTIONS}
# The flag that gives each sampling field, as `RunSpec.build`'s errors name it.
SAMPLING_FLAGS = {option.sampling: option.flag for option in OPTIONS if option.sampling}
# What a sweep runs. Without any of these and without a sweep file, `loopeval run` is the default job: the recurrence
# lab's sweep (harness.planning.defaults.LAB), then the headline sweep, whose set the views open on, then the exit sweep
# (EXITS) and the memory levers (LEVERS), in the headline's set.
SWEEP_CHOICES = tuple(dict.fromkeys(option.keyword for option in OPTIONS if option.chooses))


def given(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The table's flags, by key as typer passes them (None: not given), as the keywords `build_request` takes."""
    return {option.keyword: option.given(flags[option.key]) for option in OPTIONS if option.key in flags}
