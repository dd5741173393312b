"""What the accuracy-against-memory figures plot: the stored peaks plus the derived measures.

Two measures are not stored but computed here: `weights_bytes + kv_bytes_peak` (what the model
itself holds, without allocator slack or CUDA context) and `analytic` (the bytes the model's config
implies at a chosen context length, from `adapters.memory.estimate`, the same formula `loopeval
estimate` prints). Either is NULL where an input is unavailable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from dashboards.figures import ANALYTIC, WEIGHTS_PLUS_KV
from db import queries

DEFAULT_CONTEXT_TOKENS = 32768  # the MELT paper's "memory at 32k tokens"


def analytic_bytes(model_config: Any, context_tokens: int, loops: int | None) -> float:
    """Weights + KV bytes the stored `Adapter.describe()` implies at `context_tokens`, batch 1; NaN if unknown."""
    if not isinstance(model_config, dict) or not model_config:
        return float("nan")
    from adapters.memory import estimate  # lazy: only the analytic measure needs the engine's formula

    try:
        estimated = estimate(model_config, tokens=context_tokens, batch=1, loops=loops,
                             dtype=model_config.get("dtype"))
    except (ValueError, KeyError, TypeError):  # configs of adapters the formula does not cover
        return float("nan")
    return float(estimated.total_bytes)


def with_derived_measures(points: pd.DataFrame, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> pd.DataFrame:
    """Add the `weights_bytes + kv_bytes_peak` and `analytic` columns to `queries.accuracy_memory` rows."""
    points = points.copy()
    for column in ("weights_bytes", "kv_bytes_peak"):
        if column not in points:
            points[column] = np.nan
    points[WEIGHTS_PLUS_KV] = points["weights_bytes"] + points["kv_bytes_peak"]
    points[ANALYTIC] = [
        analytic_bytes(config, context_tokens, None if pd.isna(loops) else int(loops))
        for config, loops in zip(points.get("model_config", []), points["loops"])
    ]
    points[ANALYTIC] = points[ANALYTIC].astype("float64")
    return points


def accuracy_points(
    engine: Engine, suite: str | None, task: str = "all", context_tokens: int = DEFAULT_CONTEXT_TOKENS
) -> pd.DataFrame:
    """One row per (model, loops) with accuracy and every selectable memory measure."""
    return with_derived_measures(queries.accuracy_memory(engine, suite=suite, task=task), context_tokens)
