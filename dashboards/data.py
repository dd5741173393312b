"""What the accuracy-against-memory figures plot: the stored peaks plus the derived measures.

Two measures are not stored but computed here: `weights_bytes + kv_bytes_peak` (what the model
itself holds, without allocator slack or CUDA context) and `analytic` (the bytes the model's config
implies at a chosen context length: the same formula `loopeval estimate` prints, evaluated from the
coefficients engine adapters store with each run, `adapters.engine.memory.analytic_terms`). Either is NULL
where an input is unavailable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from dashboards.figures import ANALYTIC, WEIGHTS_PLUS_KV, pareto_mask
from db import queries

DEFAULT_CONTEXT_TOKENS = 32768  # the MELT paper's "memory at 32k tokens"
GB = 1e9  # decimal, as the MELT paper counts


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
        return float(
            terms["weights_bytes"] + terms["kv_bytes_per_token"] * context_tokens
            + terms["latent_bytes_per_token"] * min(terms["latent_tokens"], context_tokens)
        )
    except (KeyError, TypeError):  # written by another version: unavailable, not guessed
        return float("nan")


def with_derived_measures(points: pd.DataFrame, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> pd.DataFrame:
    """Add the `weights_bytes + kv_bytes_peak` and `analytic` columns to `queries.accuracy_memory` rows."""
    points = points.copy()
    for column in ("weights_bytes", "kv_bytes_peak"):
        if column not in points:
            points[column] = np.nan
    points[WEIGHTS_PLUS_KV] = points["weights_bytes"] + points["kv_bytes_peak"]
    points[ANALYTIC] = [analytic_bytes(config, context_tokens) for config in points.get("model_config", [])]
    points[ANALYTIC] = points[ANALYTIC].astype("float64")
    return points


def accuracy_points(
    engine: Engine, set_id: str | None, task: str = "all", context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    run_ids: Iterable[int] | None = None,
) -> pd.DataFrame:
    """One row per (model, loops) of one evaluation set (None: the latest), optionally of `run_ids` only,
    with accuracy and every selectable measure."""
    points = queries.accuracy_memory(engine, set_id=set_id, task=task, run_ids=run_ids)
    return with_derived_measures(points, context_tokens)


def ranked(points: pd.DataFrame, measure: str) -> pd.DataFrame:
    """`accuracy_points` rows with `memory` (bytes of `measure`), `per_gb` (accuracy per decimal GB) and
    `frontier` (on the Pareto frontier of memory against accuracy, as the figure rings it), best per GB first.

    Points without the measure or without accuracy have NaN there, are never on the frontier, and come last.
    """
    table = points.copy()
    table["memory"] = table[measure].astype("float64") if measure in table else np.nan
    table["per_gb"] = table["accuracy"].astype("float64") / (table["memory"] / GB)
    table["frontier"] = False
    known = table["memory"].notna() & table["accuracy"].notna()
    table.loc[known, "frontier"] = pareto_mask(table.loc[known, "memory"], table.loc[known, "accuracy"])
    return table.sort_values(["per_gb", "accuracy"], ascending=False, na_position="last").reset_index(drop=True)
