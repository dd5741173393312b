"""What the accuracy-against-memory figures plot: the stored peaks plus the derived measures.

Two measures are not stored but computed here: `weights_bytes + kv_bytes_allocated` (what the model
itself holds, without allocator slack or CUDA context) and `analytic` (the bytes the model's config
implies at a chosen context length: the same formula `loopeval estimate` prints, evaluated from the
coefficients engine adapters store with each run, `adapters.engine.memory.analytic_terms`, through
`measures.analytic_bytes`). Either is NULL
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
from db.headline import SUITE, group_means, headline
from db.sets import id_ranges
import measures

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
        return float(measures.analytic_bytes(terms, context_tokens))
    except (KeyError, TypeError):  # written by another version: unavailable, not guessed
        return float("nan")


def with_derived_measures(points: pd.DataFrame, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> pd.DataFrame:
    """Add the `weights_bytes + kv_bytes_allocated` and `analytic` columns to `queries.accuracy_memory` rows."""
    points = points.copy()
    for column in ("weights_bytes", "kv_bytes_allocated"):
        if column not in points:
            points[column] = np.nan
    points[WEIGHTS_PLUS_KV] = points["weights_bytes"] + points["kv_bytes_allocated"]
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
    table["per_gb"] = table["accuracy"].astype("float64") / (table["memory"] / measures.GB)
    table["frontier"] = False
    known = table["memory"].notna() & table["accuracy"].notna()
    table.loc[known, "frontier"] = pareto_mask(table.loc[known, "memory"], table.loc[known, "accuracy"])
    return table.sort_values(["per_gb", "accuracy"], ascending=False, na_position="last").reset_index(drop=True)


def set_choice(row: Any) -> str:
    """How the report's and the app's set selectors name an `queries.eval_sets` row: its label, its runs and,
    where several seeds were run, that each point pools them (so "16 runs" beside 4 points says why)."""
    runs = f"{row.runs} run{'s' * (row.runs != 1)}"
    return f"{row.set_label} ({runs}" + (f"; seeds {row.seeds} pooled in each point)" if row.seed_count > 1 else ")")


def profile_points(engine: Engine) -> pd.DataFrame:
    """`queries.profile_points` with each point's loop count known: a profile run at the model's own loops stores
    none per point, so it is read from the run's stored config (the r it ran at; 1 for a plain transformer)."""
    points = queries.profile_points(engine)
    configs = queries.runs(engine, kind="profile").set_index("run_id")["model_config"]
    ran_at = pd.to_numeric(points["run_id"].map(
        lambda run_id: configs[run_id].get("loops") if isinstance(configs.get(run_id), dict) else None))
    return points.assign(loops=points["loops"].astype("float64").fillna(ran_at))


SAMPLE_BUDGET = 600  # samples the browsers hold, spread over runs, tasks and verdicts (queries.sample_spread)
SAMPLE_TEXT_CHARS = 1500  # of each prompt, output and gold: a 32k-token answer must not weigh down the page


def clip(text: object, limit: int = SAMPLE_TEXT_CHARS) -> str | None:
    """The text, cut at `limit` characters with a note of how many more there were."""
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return None
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def browse_samples(
    engine: Engine, task: str | None = None, model: str | None = None, correct: bool | None = None
) -> pd.DataFrame:
    """What the report's and the app's sample browsers list: `queries.sample_spread`, texts clipped."""
    rows = queries.sample_spread(engine, SAMPLE_BUDGET, task=task, model=model, correct=correct)
    return rows.assign(**{column: rows[column].map(clip) for column in ("prompt", "output", "gold")})
def depth_points(engine: Engine, set_id: str) -> pd.DataFrame:
    """Depth extrapolation: one row per (model, loops r, task group) of one evaluation set with the group's
    mean pass@1 and the model's trained loop count T ("all" is the suite mean; groups from
    `db.headline.TASK_GROUPS` and `GROUP_PATTERNS`).

    A (model, r) pools its seeds, as the accuracy figures do (`queries.pooled_metrics`): `seeds` and `runs`
    say which. T comes from what the adapter described (`trained_loops`); NaN where it did not say, and the
    figure then marks no T.
    """
    table = queries.pooled_metrics(engine, set_id)
    info = queries.runs(engine).set_index("run_id")
    rows = []
    for (model, loops), point in table[table["task"] != SUITE].groupby(queries.POINT, sort=True):
        by_task: dict[str, dict[str, float | None]] = {}
        for row in point.itertuples():
            by_task.setdefault(row.task, {})[row.metric] = None if pd.isna(row.value) else row.value
        suite = point["suite"].iloc[0]
        result = headline(by_task, suite)
        newest = int(point["run_id"].max())
        config = info.at[newest, "model_config"]
        trained = config.get("trained_loops") if isinstance(config, dict) else None
        runs = id_ranges({i for ids in point["run_ids"] for i in ids})
        for group, value in {SUITE: result.mean, **group_means(result.benchmarks, suite)}.items():
            rows.append({"runs": runs, "seeds": int(point["seeds"].max()), "model": model, "loops": int(loops), "group": group,
                         "accuracy": value, "trained_loops": np.nan if trained is None else float(trained),
                         "set_label": info.at[newest, "set_label"]})
    columns = ["runs", "seeds", "model", "loops", "group", "accuracy", "trained_loops", "set_label"]
    return pd.DataFrame(rows, columns=columns).sort_values(["model", "group", "loops"]).reset_index(drop=True)


def probe_title(values: pd.DataFrame) -> str:
    """How figures and selectors name a probe run: its id, model, what was probed and the loops r."""
    first = values.iloc[0]
    return f"probe run {first['run_id']}: {first['model']} on {first['suite']}, r = 1..{int(values['loop'].max())}"
