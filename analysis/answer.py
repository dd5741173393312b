"""The answer in one sentence: the last line of `loopeval run` and `loopeval results`, and the report's headline."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd

from analysis.names import (
    KV_ONLY,
    QUOTED_MEASURES,
    available_measures,
    byte_unit,
    measure_label,
    measure_words,
    point_name,
)
from analysis.points import POINT, point_key
from analysis.ranking import DEFAULT_RANKING, RANKINGS, ranked

FRONTIER_NAMED = 6  # points of the frontier the answer names; more are counted
_NAMING = [*POINT, "config_label"]  # what names a point (`names.point_name`) and tells it from another


def answer(points: pd.DataFrame, measure: str, rank: str = DEFAULT_RANKING, context_tokens: int | None = None) -> str:
    """The answer in one sentence, the same at the end of `loopeval run` and `results` and atop the report: the best
    point by `rank` (`ranked`) with its accuracy, memory, accuracy per GB and, where a GPU counted it, per kJ, the
    Pareto frontier from least memory to most accuracy, the measure named in words with whether it counts the weights
    (`names.measure_words`), and, where the ranking reads memory, which point another measure would rank first.

    `points` are `accuracy_points` rows (a point's name carries its exit threshold and configuration). Plain text:
    the report escapes it, Dash and the terminal show it as text.
    """
    words = measure_words(measure, context_tokens)
    column, what = RANKINGS[rank]
    table = ranked(_named(points, measure, column), measure, rank)
    if table.empty:
        return f"{words[0].upper()}{words[1:]} is unavailable for every point here; pick another memory measure."
    unit, scale = byte_unit(table["memory"])
    metric = table["metric"].iloc[0]

    def named(row: Any) -> str:
        seeds = f", {row.seeds} seeds pooled" if getattr(row, "seeds", 1) > 1 else ""
        return f"{point_name(row)} ({row.accuracy:.3f} at {row.memory / scale:.3g} {unit}{seeds})"

    best = next(table.itertuples())
    value = getattr(best, column)
    if value != value or value <= 0:  # unknown (no timings) or nothing scored: no winner to name
        lead = f"No point has {what} above 0 yet (memory as {words})"
    else:
        by = f"{metric} per GB of {words}" if rank == DEFAULT_RANKING else f"{what}, memory as {words}"
        per_kj = f", {best.per_kj:.3g} per kJ" if best.per_kj == best.per_kj else ""  # where a GPU counted its energy
        lead = f"Best by {by}: {named(best)}, {best.per_gb:.3g} {metric} per GB{per_kj}"
    front = table[table["frontier"]].sort_values(["memory", "accuracy"])
    more = f" and {len(front) - FRONTIER_NAMED} more" if len(front) > FRONTIER_NAMED else ""
    frontier = " → ".join(named(row) for row in front.head(FRONTIER_NAMED).itertuples())
    return f"{lead}; the frontier: {frontier}{more}{_other_winners(points, measure, rank, best, context_tokens)}."


def _other_winners(points: pd.DataFrame, measure: str, rank: str, best: Any, context_tokens: int | None) -> str:
    """'; by KV cache peak alone, zoo:melt-tiny r=4 would rank first': each other measure users quote
    (`names.QUOTED_MEASURES`) that the points have and that ranks another point first (only where `rank` reads
    memory, pass@1 per GB), measures with one winner named together."""
    others = [name for name in available_measures(points) if name in QUOTED_MEASURES and name != measure]
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
        if point_key(first) != point_key(best):
            alone = " alone" if other in KV_ONLY else ""
            winners.setdefault(point_name(first), []).append(measure_label(other, context_tokens) + alone)
    return "".join(f"; by {' or by '.join(labels)}, {name} would rank first" for name, labels in winners.items())


def _named(points: pd.DataFrame, measure: str, column: str) -> pd.DataFrame:
    """The points with a score and more than 0 bytes of `measure`, narrowed to what the answer reads of them (the
    point, its name, accuracy, `measure`, what `ranked` derives the ratios from, the ranking's `column` where stored):
    `ranked` copies and sorts them."""
    if measure not in points:
        return points.iloc[0:0]
    ratios = ("layer_passes_per_token", "energy_joules")  # what `ranked` divides accuracy by, besides the memory
    wanted = dict.fromkeys([*_NAMING, "seeds", "metric", "accuracy", measure, *ratios, column])
    narrow = points[[name for name in wanted if name in points]]
    return narrow[(narrow[measure] > 0) & narrow["accuracy"].notna()]
