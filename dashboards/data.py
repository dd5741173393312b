"""What the accuracy-against-memory and accuracy-against-compute figures plot: the stored peaks and timings plus
the derived measures.

Two measures are not stored but computed here: `weights_bytes + kv_bytes_allocated` (what the model
itself holds, without allocator slack or CUDA context) and `analytic` (the bytes the model's config
implies at a chosen context length: the same formula `loopeval estimate` prints, evaluated from the
coefficients engine adapters store with each run, `adapters.engine.memory.analytic_terms`, through
`measures.analytic_bytes`). Either is NULL
where an input is unavailable.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from dashboards import figures
from dashboards.figures import config_labels, pareto_mask, series_name
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
    reported = points["looped_tokens"] > 0
    ran_r = points["loops"].astype("float64").where(points["generated_tokens"] > 0)  # NaN where no token is stored
    points["loops_per_token"] = np.where(reported, points["loop_tokens"] / points["looped_tokens"].where(reported), ran_r)
    points["layer_passes_per_token"] = [layer_passes(config, loops)
                                        for config, loops in zip(points.get("model_config", [None] * len(points)), points["loops_per_token"])]
    points["layer_passes_per_token"] = points["layer_passes_per_token"].astype("float64")
    timed = points["generate_seconds"] > 0
    points["tokens_per_second"] = (points["generated_tokens"] / points["generate_seconds"]).where(timed)
    points["seconds_per_token"] = (points["generate_seconds"] / points["generated_tokens"]).where(points["generated_tokens"] > 0)
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


def accuracy_points(
    engine: Engine, set_id: str | None, task: str = "all", context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    run_ids: Iterable[int] | None = None,
) -> pd.DataFrame:
    """One row per point (`queries.POINT`) of one evaluation set (None: the latest), optionally of `run_ids` only,
    with accuracy, every selectable measure and `config_label`, what of its configuration tells it apart
    (`figures.config_labels`)."""
    points = queries.accuracy_memory(engine, set_id=set_id, task=task, run_ids=run_ids)
    return with_derived_measures(points, context_tokens).assign(config_label=config_labels(points))


# How `ranked` can order the points (`loopeval results --rank`): name -> (column, what it means). Best first.
RANKINGS: dict[str, tuple[str, str]] = {
    "per-gb": ("per_gb", "pass@1 per GB of memory"),
    "accuracy": ("accuracy", "pass@1"),
    "per-layer-pass": ("per_layer_pass", "pass@1 per layer pass per generated token"),
    "speed": ("tokens_per_second", "generated tokens per second"),
}
DEFAULT_RANKING = "per-gb"


def ranked(points: pd.DataFrame, measure: str, rank: str = DEFAULT_RANKING) -> pd.DataFrame:
    """`accuracy_points` rows with `memory` (bytes of `measure`), `per_gb` (accuracy per decimal GB), `per_layer_pass`
    (accuracy per layer pass per generated token) and `frontier` (on the Pareto frontier of memory against accuracy,
    as the figure rings it), best first by `rank` (`RANKINGS`; accuracy breaks ties).

    Points without the ranking's value or without accuracy have NaN there, are never on the frontier, and come last.
    """
    table = points.copy()
    table["memory"] = table[measure].astype("float64") if measure in table else np.nan
    table["per_gb"] = table["accuracy"].astype("float64") / (table["memory"] / measures.GB)
    passes = table["layer_passes_per_token"] if "layer_passes_per_token" in table else np.nan
    table["per_layer_pass"] = table["accuracy"].astype("float64") / passes
    table["frontier"] = False
    known = table["memory"].notna() & table["accuracy"].notna()
    table.loc[known, "frontier"] = pareto_mask(table.loc[known, "memory"], table.loc[known, "accuracy"])
    column = RANKINGS[rank][0]
    order = [column] if column == "accuracy" else [column, "accuracy"]
    return table.sort_values(order, ascending=False, na_position="last").reset_index(drop=True)


FRONTIER_NAMED = 6  # points of the frontier the answer names; more are counted


def answer(points: pd.DataFrame, measure: str, rank: str = DEFAULT_RANKING, context_tokens: int | None = None) -> str:
    """The answer in one sentence, the same at the end of `loopeval run` and `results` and atop the report: the best
    point by `rank` (`ranked`) with its accuracy, memory and accuracy per GB, the Pareto frontier from least memory to
    most accuracy, the measure named in words with whether it counts the weights (`figures.measure_words`), and,
    where the ranking reads memory, which point another measure would rank first.

    `points` are `accuracy_points` rows (a point's name carries its exit threshold and configuration). Plain text:
    the report escapes it, Dash and the terminal show it as text.
    """
    words = figures.measure_words(measure, context_tokens)
    column, what = RANKINGS[rank]
    table = ranked(_named(points, measure, column), measure, rank)
    if table.empty:
        return f"{words[0].upper()}{words[1:]} is unavailable for every point here; pick another memory measure."
    unit, scale = figures.byte_unit(table["memory"])
    metric = table["metric"].iloc[0]

    def named(row: Any) -> str:
        seeds = f", {row.seeds} seeds pooled" if getattr(row, "seeds", 1) > 1 else ""
        return f"{figures.point_name(row)} ({row.accuracy:.3f} at {row.memory / scale:.3g} {unit}{seeds})"

    best = next(table.itertuples())
    value = getattr(best, column)
    if value != value or value <= 0:  # unknown (no timings) or nothing scored: no winner to name
        lead = f"No point has {what} above 0 yet (memory as {words})"
    else:
        by = f"{metric} per GB of {words}" if rank == DEFAULT_RANKING else f"{what}, memory as {words}"
        lead = f"Best by {by}: {named(best)}, {best.per_gb:.3g} {metric} per GB"
    front = table[table["frontier"]].sort_values(["memory", "accuracy"])
    more = f" and {len(front) - FRONTIER_NAMED} more" if len(front) > FRONTIER_NAMED else ""
    frontier = " → ".join(named(row) for row in front.head(FRONTIER_NAMED).itertuples())
    return f"{lead}; the frontier: {frontier}{more}{_other_winners(points, measure, rank, best, context_tokens)}."


def _other_winners(points: pd.DataFrame, measure: str, rank: str, best: Any, context_tokens: int | None) -> str:
    """'; by KV cache peak alone, zoo:melt-tiny r=4 would rank first': each other measure users quote
    (`figures.QUOTED_MEASURES`) that the points have and that ranks another point first (only where `rank` reads
    memory, pass@1 per GB), measures with one winner named together."""
    others = [name for name in figures.available_measures(points) if name in figures.QUOTED_MEASURES and name != measure]
    if rank != DEFAULT_RANKING or not others:
        return ""
    # as plain records: the report asks this of every set, task and measure, and a pandas sort per measure cost more
    columns = [name for name in (*_NAMING, "accuracy", *others) if name in points]
    rows = [SimpleNamespace(**row) for row in points[columns].to_dict("records")]
    winners: dict[str, list[str]] = {}
    for other in others:
        scored = [row for row in rows if getattr(row, other) > 0 and row.accuracy > 0]  # NaN compares False
        if not scored:
            continue
        # `ranked`'s order: pass@1 per GB, accuracy breaking ties
        first = max(scored, key=lambda row: (row.accuracy / getattr(row, other), row.accuracy))
        if _point_key(first) != _point_key(best):
            alone = " alone" if other in figures.KV_ONLY else ""
            winners.setdefault(figures.point_name(first), []).append(figures.measure_label(other, context_tokens) + alone)
    return "".join(f"; by {' or by '.join(labels)}, {name} would rank first" for name, labels in winners.items())


def _named(points: pd.DataFrame, measure: str, column: str) -> pd.DataFrame:
    """The points with a score and more than 0 bytes of `measure`, narrowed to what the answer reads of them (the
    point, its name, accuracy, `measure`, the ranking's `column` where stored): `ranked` copies and sorts them."""
    if measure not in points:
        return points.iloc[0:0]
    narrow = points[[name for name in dict.fromkeys([*_NAMING, "seeds", "metric", "accuracy", measure, column]) if name in points]]
    return narrow[(narrow[measure] > 0) & narrow["accuracy"].notna()]


_NAMING = [*queries.POINT, "config_label"]  # what names a point (`figures.point_name`) and tells it from another


def _point_key(row: Any) -> tuple:
    """A point's identity (`queries.POINT`), NaN read as None so that equal points compare equal."""
    return tuple(None if pd.isna(value) else value for value in (getattr(row, column) for column in queries.POINT))


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
# The sample browsers' columns, in order: the `browse_samples` column -> its heading, in the report and the app.
SAMPLE_COLUMNS = {
    "run_id": "run", "model": "model", "loops": "loops", "task": "task", "doc_id": "doc", "sample_index": "sample",
    "prompt": "prompt", "output": "output", "gold": "gold", "score": "score", "prompt_tokens": "prompt tokens",
    "generated_tokens": "generated tokens", "verdict": "verdict",
}


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
    """Depth extrapolation: one row per (model, loops r, task group) of one evaluation set (a model at each exit
    threshold and in each configuration a line of its own, `figures.series_name`) with the group's
    mean pass@1 and the model's trained loop count T ("all" is the suite mean; groups from
    `db.headline.TASK_GROUPS` and `GROUP_PATTERNS`).

    A (model, r) pools its seeds, as the accuracy figures do (`queries.pooled_metrics`): `seeds` and `runs`
    say which. T comes from what the adapter described (`trained_loops`); NaN where it did not say, and the
    figure then marks no T.
    """
    table = queries.pooled_metrics(engine, set_id)
    info = queries.runs(engine).set_index("run_id")
    configs = table.drop_duplicates(["model", "config"])
    named = dict(zip(zip(configs["model"], configs["config"]), config_labels(configs)))
    rows = []
    for (model, loops, threshold, criterion, config), point in table[table["task"] != SUITE].groupby(
            queries.POINT, sort=True, dropna=False):
        by_task: dict[str, dict[str, float | None]] = {}
        for row in point.itertuples():
            by_task.setdefault(row.task, {})[row.metric] = None if pd.isna(row.value) else row.value
        suite = point["suite"].iloc[0]
        result = headline(by_task, suite)
        newest = int(point["run_id"].max())
        described = info.at[newest, "model_config"]
        trained = described.get("trained_loops") if isinstance(described, dict) else None
        runs = id_ranges({i for ids in point["run_ids"] for i in ids})
        for group, value in {SUITE: result.mean, **group_means(result.benchmarks, suite)}.items():
            rows.append({"runs": runs, "seeds": int(point["seeds"].max()),
                         "model": series_name(model, threshold, criterion, named[model, config]),
                         "loops": int(loops), "group": group,
                         "accuracy": value, "trained_loops": np.nan if trained is None else float(trained),
                         "set_label": info.at[newest, "set_label"]})
    columns = ["runs", "seeds", "model", "loops", "group", "accuracy", "trained_loops", "set_label"]
    return pd.DataFrame(rows, columns=columns).sort_values(["model", "group", "loops"]).reset_index(drop=True)


def probe_title(values: pd.DataFrame) -> str:
    """How figures and selectors name a probe run: its id, model, what was probed and the loops r."""
    first = values.iloc[0]
    return f"probe run {first['run_id']}: {first['model']} on {first['suite']}, r = 1..{int(values['loop'].max())}"
