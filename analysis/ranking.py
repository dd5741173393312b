"""Ranking the points and their Pareto frontier: the order `loopeval results` lists them in, the ring the
accuracy-against-memory figure draws, and what the answer sentence names first."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

import measures
from analysis.points import Point

# How `ranked` can order the points (`loopeval results --rank`): name -> (column, what it means). Best first.
RANKINGS: dict[str, tuple[str, str]] = {
    "per-gb": ("per_gb", "pass@1 per GB of memory"),
    "accuracy": ("accuracy", "pass@1"),
    "per-layer-pass": ("per_layer_pass", "pass@1 per layer pass per generated token"),
    "speed": ("tokens_per_second", "generated tokens per second"),
    "per-kj": ("per_kj", "pass@1 per kJ of GPU energy a run drew (NVML)"),
}
DEFAULT_RANKING = "per-gb"


def pareto_mask(memory: Sequence[float] | pd.Series, accuracy: Sequence[float] | pd.Series) -> np.ndarray:
    """True for each point no other point dominates (no more memory and no less accuracy, one strictly better).

    Equal points do not dominate each other, so ties both stay on the frontier.
    """
    x = np.asarray(memory, dtype=float)
    y = np.asarray(accuracy, dtype=float)
    no_worse = (x[None, :] <= x[:, None]) & (y[None, :] >= y[:, None])  # [i, j]: j is no worse than i
    better = (x[None, :] < x[:, None]) | (y[None, :] > y[:, None])
    return np.asarray(~(no_worse & better).any(axis=1))


def ranked(points: pd.DataFrame, measure: str, rank: str = DEFAULT_RANKING) -> pd.DataFrame:
    """`analysis.points.accuracy_points` rows with `memory` (bytes of `measure`), `per_gb` (accuracy per decimal GB),
    `per_layer_pass` (accuracy per layer pass per generated token), `per_kj` (accuracy per kJ of the GPU energy one
    of the point's runs drew; NaN where none was measured) and `frontier` (on the Pareto frontier of memory against
    accuracy, as the figure rings it), best first by `rank` (`RANKINGS`; accuracy breaks ties).

    Points without the ranking's value or without accuracy have NaN there, are never on the frontier, and come last.
    """
    table = points.copy()
    accuracy = table["accuracy"].astype("float64")
    table["memory"] = table[measure].astype("float64") if measure in table else np.nan
    table["per_gb"] = accuracy / (table["memory"] / measures.GB)
    passes = table["layer_passes_per_token"] if "layer_passes_per_token" in table else np.nan
    table["per_layer_pass"] = accuracy / passes
    table["per_kj"] = accuracy / (table["energy_joules"] / measures.KB if "energy_joules" in table else np.nan)
    table["frontier"] = False
    known = table["memory"].notna() & table["accuracy"].notna()
    table.loc[known, "frontier"] = pareto_mask(table.loc[known, "memory"], table.loc[known, "accuracy"])
    column = RANKINGS[rank][0]
    order = [column] if column == "accuracy" else [column, "accuracy"]
    return table.sort_values(order, ascending=False, na_position="last").reset_index(drop=True)


def ranked_points(points: pd.DataFrame, measure: str, rank: str = DEFAULT_RANKING) -> list[Point]:
    """`ranked`'s rows as `Point`s, best first."""
    return [Point.of(row) for row in ranked(points, measure, rank).to_dict("records")]
