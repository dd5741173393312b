"""What the accuracy-against-memory figures plot: the stored peaks plus the derived measures.

Two measures are not stored but computed here: `weights_bytes + kv_bytes_peak` (what the model
itself holds, without allocator slack or CUDA context) and `analytic` (the bytes the model's config
implies at a chosen context length: the same formula `loopeval estimate` prints, evaluated from the
coefficients engine adapters store with each run, `adapters.engine.memory.analytic_terms`). Either is NULL
where an input is unavailable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from dashboards.figures import ANALYTIC, WEIGHTS_PLUS_KV
from db import queries

DEFAULT_CONTEXT_TOKENS = 32768  # the MELT paper's "memory at 32k tokens"


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
    engine: Engine, suite: str | None, task: str = "all", context_tokens: int = DEFAULT_CONTEXT_TOKENS
) -> pd.DataFrame:
    """One row per (model, loops) with accuracy and every selectable memory measure."""
    return with_derived_measures(queries.accuracy_memory(engine, suite=suite, task=task), context_tokens)
