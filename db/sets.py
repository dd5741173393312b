"""Evaluation sets: which runs may be compared, and the one label every view gives them.

Two accuracies are comparable only when they were measured on the same items in the same way: the
same suite, tasks, docs per task (`--limit`), sampling (temperature, top-p, top-k, new-token budget,
stop sequences, n) and data (the fingerprint of the task files, `suites.registry.data_fingerprint`,
stored per run). That tuple is a run's evaluation set. The seed is not part of it: seeds are
repeats of one measurement. Figures, reports and `loopeval results` show one set at a time, never a
point merged from two. Runs stored before fingerprints existed still get a set, labelled as such.

`run_key` adds what makes two runs the same experiment (model, loops, exit threshold, per-model overrides and KV
policy and dtype, seed),
which is how `loopeval run` recognises a run already stored. `configuration` is the part of it, beyond the model,
loops and exit point, that changes the model run: what keeps two plotted points apart (`db.queries.POINT`).
Pure functions of stored values (no sqlalchemy), so the store, the queries and the harness compute them alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from db.headline import benchmark_of

_NOT_OF_THE_SET = ("seed",)  # sampling fields that vary between repeats of one set
# Sampling fields that are floats (`adapters.base.Sampling`): a sweep file's `temperature = 1` is the 1.0 of
# `--temperature 1`, one set (runs stored before `Sampling` made them floats may hold the integer).
FLOAT_SAMPLING = ("temperature", "top_p")


def _sampling_value(name: str, value: Any) -> Any:
    """A stored sampling value as the set holds it: lists as tuples, a float field's integer as its float."""
    if isinstance(value, list):
        return tuple(value)
    if name in FLOAT_SAMPLING and type(value) is int:
        return float(value)
    return value


def _digest(value: Any, length: int) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class EvalSet:
    """The evaluation set of a run, from its stored columns (`runs.suite`, `tasks`, `limit`, `sampling`, `data_fingerprint`)."""

    suite: str
    tasks: tuple[str, ...]
    limit: int | None
    sampling: tuple[tuple[str, Any], ...]  # without the seed
    fingerprint: str | None

    @classmethod
    def of(
        cls,
        suite: str,
        tasks: Sequence[str] | None,
        limit: int | None,
        sampling: Mapping[str, Any] | None,
        fingerprint: str | None,
    ) -> EvalSet:
        kept = tuple(
            sorted((k, _sampling_value(k, v)) for k, v in (sampling or {}).items() if k not in _NOT_OF_THE_SET)
        )
        return cls(suite, tuple(sorted(tasks or ())), None if limit is None else int(limit), kept, fingerprint)

    @property
    def id(self) -> str:
        """A short stable id (8 hex digits, the same in every database): what `--set` and the selectors take.

        Hashed once, when an eval run is stored (`runs.set_id`, migration 0011 for older runs; 0013 for those whose
        sampling holds an integer for a float); readers take the stored id. So a change to what is hashed here
        needs a migration rewriting the stored ids too, or runs of one set stored before and after it would read as
        two sets."""
        return _digest([self.suite, self.tasks, self.limit, self.sampling, self.fingerprint], 8)

    @property
    def description(self) -> str:
        """What the set is, in one line: 'synthetic · chain3, chain4 · first 50 per task · n=4 temperature 1 ...'."""
        items = "all items" if self.limit is None else f"first {self.limit} per task"
        data = f"data {self.fingerprint[:8]}" if self.fingerprint else "data not fingerprinted"
        return " · ".join([self.suite, self._tasks_text(), items, self._sampling_text(), data])

    def _tasks_text(self) -> str:
        """Benchmark names, a family's subtasks counted once (`db.headline.benchmark_of`); many become a count."""
        names = sorted({benchmark_of(task) for task in self.tasks})
        if not names:
            return "tasks unknown"
        return ", ".join(names) if len(names) <= 4 else f"{len(names)} tasks"

    def _sampling_text(self) -> str:
        sampling = dict(self.sampling)
        if not sampling:
            return "sampling unknown"
        numbers = {key for key, value in sampling.items() if isinstance(value, (int, float))}
        # "temperature", never "T": figures use T for a looped model's trained depth
        temperature = f"temperature {sampling['temperature']:g}" if "temperature" in numbers else "temperature ?"
        parts = [f"n={sampling.get('n', '?')}", temperature]
        if "top_p" in numbers and sampling["top_p"] != 1:
            parts.append(f"top-p {sampling['top_p']:g}")
        if sampling.get("top_k") is not None:
            parts.append(f"top-k {sampling['top_k']}")
        if sampling.get("max_new_tokens") is not None:
            parts.append(f"{sampling['max_new_tokens']} new tokens")
        return " ".join(parts)


SET_COLUMNS = ("suite", "tasks", "limit", "sampling", "data_fingerprint")  # the `runs` columns a set is made of


class Columns(Protocol):
    """A run's `runs` columns by name: a dict, or a row's `_mapping`."""

    def __getitem__(self, name: str, /) -> Any: ...

    def get(self, name: str, /) -> Any: ...


def run_set(run: Columns) -> EvalSet:
    """The set of a run given as its `runs` columns; a column other than the suite left out reads as NULL (a new
    run's row may leave out what has a default)."""
    return EvalSet.of(
        run["suite"], run.get("tasks"), run.get("limit"), run.get("sampling"), run.get("data_fingerprint")
    )


def set_label(set_id: str, evaluation: EvalSet) -> str:
    """The one label every view gives a set: 'set 1a2b3c4d: synthetic · chain3, chain4 · first 50 per task ...'.
    `set_id` is the id stored with its runs (`EvalSet.id` when they were written)."""
    return f"set {set_id}: {evaluation.description}"


KV_AXIS = ("kv_policy", "kv_dtype")  # the `runs` columns of the KV memory axis, NULL off it
# What a model keeps its K/V in when no run names a KV setting: its KV strategy's own policy, as an engine run's stored
# description names the strategy (`adapters.engine.config.KV_POLICIES` lists each strategy's policies, its own
# first), in its own dtype. A checkpoint never carries a run's KV setting (`save_checkpoint`), so these are every
# model's own, and naming them is naming nothing.
OWN_KV_POLICY = {"standard": "standard", "per_loop": "per-loop", "gated": "gated"}
OWN_KV_POLICY_OF_FAMILY = {"ifm": "shared-last"}  # a family trained for another layout (`kv.layouts.FAMILY_NATIVE`)
OWN_KV_DTYPE = "auto"
EMA, EMA_ALPHA = "shared-ema", 0.5  # the one policy with a number (`adapters.engine.kv.policies`) and its default
KV_POLICY_LENGTH = 32  # characters `runs.kv_policy` holds (`db.models.Run`)


def kv_policy_text(policy: str) -> str:
    """A KV policy in its one text: shared-ema's ALPHA always written, as the shortest text of the number given
    (`shared-ema` and `shared-ema:.50` -> `shared-ema:0.5`, `shared-ema:0.1234567` kept whole); other policies and
    text that is not a number as they are (the adapter's to refuse)."""
    name, _, alpha = policy.partition(":")
    if name != EMA:
        return policy
    try:
        value = float(alpha) if alpha else EMA_ALPHA
    except ValueError:
        return policy
    return f"{EMA}:{value!r}"


def own_kv_policy(kv_strategy: Any, family: Any = None) -> str | None:
    """The KV policy a model runs when none is named: its family's where it has one, else its KV strategy's."""
    if isinstance(family, str) and family in OWN_KV_POLICY_OF_FAMILY:
        return OWN_KV_POLICY_OF_FAMILY[family]
    return OWN_KV_POLICY.get(kv_strategy) if isinstance(kv_strategy, str) else None


def resolved_kv(config: Mapping[str, Any], kv_strategy: Any = None, family: Any = None) -> dict[str, Any]:
    """`config` with its KV setting resolved: the policy in its one text (`kv_policy_text`), and the policy and dtype
    left out where they are the model's own (`OWN_KV_POLICY` of its `kv_strategy`, where known; `OWN_KV_DTYPE`), so
    that naming the model's own setting is the configuration of naming none."""
    resolved = dict(config)
    if isinstance(resolved.get("kv_policy"), str):
        resolved["kv_policy"] = kv_policy_text(resolved["kv_policy"])
        if resolved["kv_policy"] == own_kv_policy(kv_strategy, family):
            del resolved["kv_policy"]
    if resolved.get("kv_dtype") == OWN_KV_DTYPE:
        del resolved["kv_dtype"]
    return resolved


def configuration(run: Columns) -> dict[str, Any]:
    """What in a run's identity, beyond its model, loops and exit point, changes the model it runs: that model's
    per-model overrides (`exit_policy`, `dtype`, conditioning fields, ...) and its KV policy and KV dtype where the
    sweep set them (`KV_AXIS`; absent otherwise, so runs stored before the axis keep their configurations). Runs of
    one model that differ here are two configurations, never pooled as seeds of one point. `run` holds the `runs`
    columns, `spec` included.

    The KV setting is the resolved one (`resolved_kv`), however it was named (an override or the axis, the model's
    own or nothing): the planner stores it resolved, and a run stored before that (`kv_dtype` auto, its own policy
    named, `shared-ema` without its ALPHA) reads as the configuration it ran, through the KV strategy its stored
    description (`model_config`) names."""
    model = run["model_spec"]
    config = dict(((run.get("spec") or {}).get("model_overrides") or {}).get(model, {}))
    config |= {key: run[key] for key in KV_AXIS if run.get(key) is not None}
    described = run.get("model_config")
    if not isinstance(described, dict):
        return resolved_kv(config)
    return resolved_kv(config, described.get("kv_strategy"), described.get("family"))


def config_key(config: Mapping[str, Any]) -> str:
    """A configuration in one canonical text (sorted keys, compact JSON; '' for none): equal configurations give
    equal keys whatever order their keys were written in, in every database."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=str) if config else ""


def config_fields(key: str) -> dict[str, Any]:
    """The configuration a `config_key` holds."""
    return json.loads(key) if key else {}


def run_key(run: Columns) -> str:
    """Two runs with the same key are the same experiment (model, loops, exit threshold and criterion, that model's
    overrides and its KV policy and dtype where set (`configuration`), set, seed):
    `loopeval run` skips the second unless `--rerun`. `run` holds the `runs` columns, `spec` included."""
    key = {
        "model": run["model_spec"],
        "loops": run["loops"],
        "overrides": configuration(run),
        "set": run_set(run).id,
        "seed": run["seed"],
    }
    if run.get("exit_threshold") is not None:  # only where set, so runs stored before the exit axis keep their keys
        key["exit"] = [run["exit_threshold"], run.get("exit_criterion")]
    return _digest(key, 16)


def id_ranges(ids: Iterable[int]) -> str:
    """Run ids (or seeds) as people read them: [13, 14, 15, 18] -> '13-15, 18'."""
    spans: list[list[int]] = []
    for value in sorted(ids):
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
