"""The plotted point: one configuration of one evaluation set, its seeds pooled, as `loopeval results`, the report
and the app all read it (`accuracy_points`).

A point is `db.queries.POINT` (model, loops r, exit threshold and criterion, and `config`, the run's configuration
key: its overrides with its KV policy and dtype, `db.sets.config_key`) within one evaluation set (`set_id`,
`set_label`), with pass@1 on a task (`accuracy`, `stderr`, `metric`; the suite mean for "all", computed once, in
`db.queries.accuracy_memory`), every memory measure (each stored peak and the two derived ones), what a generated
token cost (`measures.COMPUTE_MEASURES`), the GPU energy one of its runs drew (`energy_joules`, NaN where NVML had
no counter or it read 0 J), its KV policy and dtype in words (`kv_policy`, `kv_dtype`) and what tells it apart in words
(`config_label`). Ranking it (`analysis.ranking`) adds the memory at a chosen measure and the ratios.

Two measures are not stored but computed here: `weights_bytes + kv_bytes_allocated` (what the model itself holds,
without allocator slack or CUDA context) and `analytic` (the bytes the model's config implies at a chosen context
length: the same formula `loopeval estimate` prints, evaluated from the coefficients engine adapters store with each
run, `adapters.engine.memory.analytic_terms`, through `measures.analytic_bytes`). Either is NULL where an input is
unavailable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

import measures
from analysis.names import config_labels
from db import queries
from db.sets import KV_AXIS, config_fields

DEFAULT_CONTEXT_TOKENS = 32768  # the MELT paper's "memory at 32k tokens"
POINT = queries.POINT  # the columns that make a point's identity within its set
Key = tuple[Any, ...]  # a point's identity: its `POINT` values, None where unset


def point_key(row: Any) -> Key:
    """A point's (or a run's) identity, `POINT` read off a row (a named tuple or a dict), NaN read as None and the loop
    count as an int: the one key by which a run finds its point, so equal points compare equal."""
    values = [row[column] if isinstance(row, dict | pd.Series) else getattr(row, column) for column in POINT]
    return tuple(
        None if _missing(value) else int(value) if column == "loops" else value for column, value in zip(POINT, values)
    )


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _known(value: Any) -> Any:
    """A stored value, None for NaN (pandas reads a NULL number as NaN)."""
    return None if _missing(value) else value


Z95 = 1.96  # a point's interval is the normal 95% interval: pass@1 ± 1.96 standard errors


@dataclass(frozen=True)
class Point:
    """One plotted point as `loopeval results` lists it and the answer names it: a row of `analysis.ranking.ranked`,
    unknown values None (never 0): its identity (`POINT`: model, r, exit threshold and criterion, the configuration
    key) and what tells it apart in words, its KV setting, its set and pooled runs, pass@1 on the task with its
    standard error, the memory of the ranked measure, what a generated token cost, one run's GPU energy, the ratios,
    and whether it is on the Pareto frontier."""

    model: str
    loops: int
    exit_threshold: float | None
    exit_criterion: str | None
    config: str
    config_label: str
    kv_policy: str
    kv_dtype: str
    set_id: str
    suite: str
    seeds: int
    run_ids: tuple[int, ...]
    metric: str
    accuracy: float | None
    stderr: float | None
    memory: float | None
    per_gb: float | None
    per_layer_pass: float | None
    per_kj: float | None
    loops_per_token: float | None
    layer_passes_per_token: float | None
    tokens_per_second: float | None
    energy_joules: float | None
    frontier: bool
    cut: float | None = None  # the share of its samples the token budget cut off (`analysis.claims.with_samples`)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Point:
        """The point of a `ranked` row (a record of its table)."""
        values = {name: _known(row.get(name)) for name in cls.__dataclass_fields__}
        counts = {"loops": int(row["loops"]), "seeds": int(row["seeds"]), "frontier": bool(row["frontier"])}
        return cls(**values | counts | {"run_ids": tuple(int(i) for i in row["run_ids"])})

    @property
    def key(self) -> Key:
        return point_key(self)

    @property
    def interval(self) -> float | None:
        """The half-width of the 95% interval of pass@1 (None where the standard error is unknown)."""
        return None if self.stderr is None else Z95 * self.stderr


def analytic_bytes(model_config: Any, context_tokens: int) -> float:
    """Weights + KV bytes the stored `Adapter.describe()` implies at `context_tokens`, batch 1; NaN if unknown.

    Engine adapters store the formula's coefficients under "analytic", for the run's loops and
    dtype; for others (a transformers checkpoint) the formula does not
    apply and the measure is unavailable rather than guessed.
    """
    terms = model_config.get("analytic") if isinstance(model_config, dict) else None
    if not isinstance(terms, dict):
        return float("nan")
    try:
        return float(measures.analytic_bytes(terms, context_tokens))
    except (KeyError, TypeError):  # written by another version: unavailable, not guessed
        return float("nan")


def layer_passes(model_config: Any, loops_per_token: float) -> float:
    """Layer passes per generated token from the layer counts the stored `describe()` holds (an engine model's
    "config"); NaN where it holds none (another adapter), unavailable rather than guessed."""
    config = model_config.get("config") if isinstance(model_config, dict) else None
    if not isinstance(config, dict) or not all(isinstance(config.get(f), int) for f in measures.LAYER_FIELDS):
        return float("nan")
    return float(measures.layer_passes(config, loops_per_token))


def with_compute_measures(points: pd.DataFrame) -> pd.DataFrame:
    """Add the `measures.COMPUTE_MEASURES` columns to `queries.accuracy_memory` rows, from the pooled runs' sums
    (`queries.run_compute`). Mean loops per token weighs each sample by its tokens; a point whose samples report no
    loops (a plain model, or an adapter that does not say) ran its r for every token; one without generated tokens
    has none (NaN)."""
    points = points.copy()
    for column in ("generated_tokens", "loop_tokens", "looped_tokens", "generate_seconds", "energy_joules"):
        points[column] = points[column].astype("float64") if column in points else np.nan
    # A counter that did not advance over a run (0 J) measured nothing: per kJ it would be infinite and rank first.
    points["energy_joules"] = points["energy_joules"].where(points["energy_joules"] > 0)
    reported = points["looped_tokens"] > 0
    ran_r = points["loops"].astype("float64").where(points["generated_tokens"] > 0)  # NaN where no token is stored
    mean_loops = points["loop_tokens"] / points["looped_tokens"].where(reported)
    points["loops_per_token"] = np.where(reported, mean_loops, ran_r)
    configs = points.get("model_config", pd.Series([None] * len(points), index=points.index))
    points["layer_passes_per_token"] = [
        layer_passes(config, loops) for config, loops in zip(configs, points["loops_per_token"])
    ]
    points["layer_passes_per_token"] = points["layer_passes_per_token"].astype("float64")
    timed = points["generate_seconds"] > 0
    tokens = points["generated_tokens"]
    points["tokens_per_second"] = (tokens / points["generate_seconds"]).where(timed)
    points["seconds_per_token"] = (points["generate_seconds"] / tokens).where(tokens > 0)
    return points


def with_derived_measures(points: pd.DataFrame, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> pd.DataFrame:
    """Add the `weights_bytes + kv_bytes_allocated` and `analytic` columns to `queries.accuracy_memory` rows, and
    the compute measures (`with_compute_measures`)."""
    points = points.copy()
    for column in ("weights_bytes", "kv_bytes_allocated"):
        if column not in points:
            points[column] = np.nan
    points[measures.WEIGHTS_PLUS_KV] = points["weights_bytes"] + points["kv_bytes_allocated"]
    points[measures.ANALYTIC] = [analytic_bytes(config, context_tokens) for config in points.get("model_config", [])]
    points[measures.ANALYTIC] = points[measures.ANALYTIC].astype("float64")
    return with_compute_measures(points)


def kv_setting(config: str, described: Any) -> tuple[str, str]:
    """A point's (KV policy, KV dtype): as swept (its configuration), else as its adapter described itself."""
    swept, described = config_fields(config), described if isinstance(described, dict) else {}
    return (
        str(swept.get("kv_policy") or described.get("kv_policy") or "?"),
        str(swept.get("kv_dtype") or described.get("kv_dtype") or "auto"),
    )


def accuracy_points(
    engine: Engine,
    set_id: str | None,
    task: str = "all",
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    run_ids: Iterable[int] | None = None,
) -> pd.DataFrame:
    """One row per point (`POINT`) of one evaluation set (None: the latest), optionally of `run_ids` only, with
    accuracy, every selectable measure, the compute measures, the KV setting and `config_label`, what of its
    configuration tells it apart (`names.config_labels`)."""
    points = queries.accuracy_memory(engine, set_id=set_id, task=task, run_ids=run_ids)
    settings = [kv_setting(c, d) for c, d in zip(points["config"], points.get("model_config", [None] * len(points)))]
    return with_derived_measures(points, context_tokens).assign(
        config_label=config_labels(points), kv_policy=[p for p, _ in settings], kv_dtype=[d for _, d in settings]
    )


def lever_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points the memory-levers figure compares: those a sweep set a KV policy or dtype on (`db.sets.KV_AXIS`),
    and, as the reference each lever saves against, the same model's point at that r without any setting (its own
    policy in its own dtype) where no swept point is that already. Off the exit axis only: an exit changes accuracy
    too, so it would not compare like with like."""
    frame = points[points["exit_threshold"].isna()] if not points.empty else points
    swept = frame["config"].map(lambda key: bool(set(config_fields(key)) & set(KV_AXIS))) if not frame.empty else None
    if swept is None or not swept.any():
        return frame.iloc[0:0].assign(kv_policy=[], kv_dtype=[])
    levers = set(zip(frame.loc[swept, "model"], frame.loc[swept, "loops"]))
    keep = np.array(
        [
            (model, loops) in levers and (on or config == "")
            for model, loops, on, config in zip(frame["model"], frame["loops"], swept, frame["config"])
        ]
    )
    frame = frame[keep].assign(swept=swept[keep])
    frame = frame.sort_values("swept", ascending=False, kind="stable")  # a swept point stands for its setting
    return frame.drop_duplicates(["model", "loops", "kv_policy", "kv_dtype"]).drop(columns="swept").sort_index()
