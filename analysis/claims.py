"""The claims a set's points support, with their uncertainty: a paired comparison of any two points (`loopeval
compare`), each lever point against its own reference configuration (the retained accuracy the report draws against
MLPerf's 99% line), metrics other than the stored pass@1 (`analysis.items`), and pass@1 by generation length.

A lever point's reference (`reference_key`) is the same model at the same r on the same evaluation set without the
lever: a KV policy or dtype point (`db.sets.KV_AXIS`) against the model's own cache in its own dtype (its other
overrides kept), an exit threshold against fixed depth (no threshold, same configuration).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from sqlalchemy import Engine

from analysis import items, paired
from analysis.names import point_name
from analysis.points import Key, accuracy_points, point_key
from db import sample_queries
from db.headline import HEADLINE
from db.sets import KV_AXIS, config_fields, config_key

MLPERF_RETAINED = 0.99  # MLPerf accepts an optimisation that keeps 99% of the reference accuracy (or 99.9%)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its name (a point's, as `loopeval results` names it, or 'run N') and its runs."""

    name: str
    run_ids: tuple[int, ...]


def point_names(points: pd.DataFrame) -> dict[str, tuple[int, ...]]:
    """Each point's name (`names.point_name`) -> its runs, for `accuracy_points` rows."""
    return {point_name(row): tuple(int(i) for i in row.run_ids) for row in points.itertuples()}


def resolve(text: str, points: pd.DataFrame, run_ids: Iterable[int]) -> Side:
    """A side as the user named it: a run id (of `run_ids`, the scored runs), or a point's name of `points`, whole or without its model's adapter
    prefix ('ouro-tiny r=4 int8' for 'zoo:ouro-tiny r=4 int8'); ValueError naming what exists otherwise."""
    text = " ".join(text.split())
    if text.isdigit():
        if int(text) not in set(run_ids):
            raise ValueError(f"{text}: no scored evaluation run has that id")
        return Side(f"run {text}", (int(text),))
    names = point_names(points)
    found = [name for name in names if text in (name, name.partition(":")[2])]
    if len(found) != 1:
        listed = "; ".join(list(names)[:8]) + ("; ..." if len(names) > 8 else "")
        why = "names several points" if found else "is no point of this evaluation set"
        raise ValueError(f"{text!r} {why} (points: {listed})")
    return Side(found[0], names[found[0]])


def reference_key(key: Key) -> tuple[Key, str] | None:
    """A lever point's reference (module docstring) and the lever's axis ('kv' or 'exit'); None for a point that
    pulls no lever. A point on both axes is compared along the exit axis (its KV setting kept)."""
    model, loops, threshold, criterion, config = key
    if threshold is not None:
        return (model, loops, None, None, config), "exit"
    fields = config_fields(config or "")
    if set(fields) & set(KV_AXIS):
        own = config_key({name: value for name, value in fields.items() if name not in KV_AXIS})
        return (model, loops, None, None, own), "kv"
    return None


def lever_pairs(points: pd.DataFrame) -> list[tuple[Any, Any, str]]:
    """(lever row, reference row, axis) for every lever point of `accuracy_points` rows whose reference is a point
    here, in the points' order."""
    by_key = {point_key(row._asdict()): row for row in points.itertuples()}
    pairs = []
    for key, row in by_key.items():
        found = reference_key(key)
        if found is not None and found[0] in by_key:
            pairs.append((row, by_key[found[0]], found[1]))
    return pairs


class SampleBook:
    """The samples of a set's runs, read once, by run: what every claim of a page is computed from."""

    def __init__(self, engine: Engine, run_ids: Iterable[int]):
        frame = sample_queries.run_samples(engine, sorted(set(run_ids)))
        self._by_run = {int(run_id): rows for run_id, rows in frame.groupby("run_id", sort=False)}
        self._empty = frame.iloc[0:0]

    def of(self, run_ids: Iterable[int]) -> pd.DataFrame:
        """The samples of `run_ids` together (a point's seeds pooled: an item holds every seed's samples)."""
        frames = [self._by_run[i] for i in run_ids if i in self._by_run]
        return pd.concat(frames, ignore_index=True) if frames else self._empty


def compare_sides(book: SampleBook, a: Side, b: Side, metric: str = "pass@1") -> paired.Comparison:
    """The paired comparison of two sides on `metric` (ValueError where they are not on the same items, or the
    metric asks for more samples than they have)."""
    samples_a, samples_b = book.of(a.run_ids), book.of(b.run_ids)
    if samples_a.empty or samples_b.empty:
        raise ValueError(f"{(a if samples_a.empty else b).name} has no stored samples to compare")
    values_a, values_b = items.item_values(samples_a, metric), items.item_values(samples_b, metric)
    comparison = paired.compare(values_a, values_b, (a.name, b.name), metric)
    return _with_cuts(comparison, samples_a, samples_b)


def _with_cuts(comparison: paired.Comparison, a: pd.DataFrame, b: pd.DataFrame) -> paired.Comparison:
    return replace(comparison, cut_a=items.cut_share(a), cut_b=items.cut_share(b))


def retained(
    engine: Engine, set_id: str | None, points: pd.DataFrame | None = None, book: SampleBook | None = None
) -> pd.DataFrame:
    """Every lever point of a set against its reference (`lever_pairs`), paired on pass@1: model, loops, axis, lever
    (its name), reference, the two pass@1, the difference with its interval and p-value, retained (lever / reference)
    with its interval, `holds` (retained at or above `MLPERF_RETAINED`), `surely_holds` (its interval's low end is),
    the items needed where the interval straddles 0, the shares cut off, and the sentence. `points` and `book`, where
    given, are the set's (read once for a page's several claims)."""
    points = accuracy_points(engine, set_id) if points is None else points
    pairs = lever_pairs(points)
    if book is None:
        book = SampleBook(engine, [i for lever, ref, _ in pairs for i in (*lever.run_ids, *ref.run_ids)])
    rows = []
    for lever, reference, axis in pairs:
        try:
            found = compare_sides(book, _side(lever), _side(reference))
        except ValueError:  # not on the same items (an interrupted run): no paired claim to make
            continue
        rows.append({"model": lever.model, "loops": lever.loops, "axis": axis, **_retained_row(found)})
    return pd.DataFrame(rows, columns=RETAINED_COLUMNS)


RETAINED_COLUMNS = [
    "model", "loops", "axis", "lever", "reference", "lever_pass_at_1", "reference_pass_at_1", "difference", "low",
    "high", "p_value", "retained", "retained_low", "retained_high", "holds", "surely_holds", "items_needed",
    "cut_lever", "cut_reference", "sentence",
]  # fmt: skip


def _side(row: Any) -> Side:
    return Side(point_name(row), tuple(int(i) for i in row.run_ids))


def _retained_row(found: paired.Comparison) -> dict[str, Any]:
    holds = found.ratio is not None and found.ratio >= MLPERF_RETAINED
    surely = found.ratio_low is not None and found.ratio_low >= MLPERF_RETAINED
    return {
        "lever": found.a,
        "reference": found.b,
        "lever_pass_at_1": found.value_a,
        "reference_pass_at_1": found.value_b,
        "difference": found.difference,
        "low": found.low,
        "high": found.high,
        "p_value": found.p_value,
        "retained": found.ratio,
        "retained_low": found.ratio_low,
        "retained_high": found.ratio_high,
        "holds": holds,
        "surely_holds": surely,
        "items_needed": found.items_needed,
        "cut_lever": found.cut_a,
        "cut_reference": found.cut_b,
        "sentence": found.sentence(),
    }


def metric_points(points: pd.DataFrame, book: SampleBook, metric: str) -> pd.DataFrame:
    """`accuracy_points` rows with `accuracy` and `stderr` read from the samples as `metric` (`analysis.items`), the
    suite mean over benchmarks, and `metric` named; ValueError where a point has fewer samples per item than the
    metric asks. A point without samples keeps no accuracy (NaN)."""
    values, errors = [], []
    for row in points.itertuples():
        samples = book.of(int(i) for i in row.run_ids)
        if samples.empty:
            values.append(float("nan"))
            errors.append(float("nan"))
            continue
        mean, stderr = items.estimate(items.item_values(samples, metric))
        values.append(mean)
        errors.append(float("nan") if stderr is None else stderr)
    return points.assign(accuracy=values, stderr=errors, metric=metric)


def with_samples(points: pd.DataFrame, book: SampleBook, metric: str | None = None) -> pd.DataFrame:
    """`accuracy_points` rows with `cut`, each point's share of samples the token budget cut off (`items.cut_share`),
    and, for a `metric` other than the stored pass@1, that metric in place of it (`metric_points`)."""
    cuts = [items.cut_share(book.of(row.run_ids)) for row in points.itertuples()]
    points = points.assign(cut=pd.Series(cuts, index=points.index, dtype="float64"))
    return points if metric in (None, HEADLINE) else metric_points(points, book, str(metric))


def length_table(points: pd.DataFrame, book: SampleBook, keys: Iterable[Key] | None = None) -> pd.DataFrame:
    """pass@1 by generated length (`items.by_length`) for each point (only `keys` when given): one row per (point,
    length bin) with the point's `name`, and for a lever point whose reference is here, `diverged`, the share of
    its samples in the bin whose output leaves the reference's under the same seed (`items.divergence`)."""
    wanted = None if keys is None else set(keys)
    by_key = {point_key(row._asdict()): row for row in points.itertuples()}
    frames = []
    for key, row in by_key.items():
        if wanted is not None and key not in wanted:
            continue
        samples = book.of(row.run_ids)
        table = items.by_length(samples).assign(name=point_name(row))
        reference = reference_key(key)
        if reference is not None and reference[0] in by_key:
            split = items.divergence(samples, book.of(by_key[reference[0]].run_ids))
            split = split.assign(bin=[items.length_bin(t) for t in split["generated_tokens"]])
            table["diverged"] = table["bin"].map(split.groupby("bin")["position"].apply(lambda p: p.notna().mean()))
        frames.append(table)
    columns = ["name", "bin", "low", "samples", "pass_at_1", "cut", "diverged"]
    return pd.concat(frames, ignore_index=True).reindex(columns=columns) if frames else pd.DataFrame(columns=columns)


def sample_metrics(points: pd.DataFrame, book: SampleBook) -> pd.DataFrame:
    """Every point's metrics from its samples (`analysis.items`): pass@k for each k up to its n, maj@n and avg@n,
    the suite mean with its standard error, a row per (point, metric): name, model, metric, value, stderr."""
    rows = []
    for row in points.itertuples():
        samples = book.of(row.run_ids)
        if samples.empty:
            continue
        for metric, values in _all_metrics(samples).items():
            value, stderr = items.estimate(values)
            rows.append(
                {"name": point_name(row), "model": row.model, "metric": metric, "value": value, "stderr": stderr}
            )
    return pd.DataFrame(rows, columns=["name", "model", "metric", "value", "stderr"])


def _all_metrics(samples: pd.DataFrame) -> dict[str, pd.Series]:
    """pass@1 to pass@n, maj@n and avg@n per item, the samples grouped once (`items.item_values` gives the same,
    one metric a call); an item with more samples than the fewest reads its first n, through `item_values`."""
    scores = samples["score"].fillna(0.0)
    grouped = samples.assign(score=scores, correct=scores >= 1.0).groupby(items.ITEM)
    table = grouped.agg(size=("correct", "size"), correct=("correct", "sum"), mean=("score", "mean"))
    n = int(table["size"].min())
    pairs = list(zip(table["size"], table["correct"]))
    values = {
        f"pass@{k}": pd.Series([items.pass_at_k(int(a), int(c), k) for a, c in pairs], index=table.index)
        for k in range(1, n + 1)
    }
    if (table["size"] > n).any():
        return values | {name: items.item_values(samples, name) for name in (f"maj@{n}", f"avg@{n}")}
    majority = table["mean"] if n == 1 else items.item_values(samples, f"maj@{n}")
    return values | {f"maj@{n}": majority, f"avg@{n}": table["mean"]}


def lever_keys(points: pd.DataFrame) -> list[Key]:
    """The keys of the lever points with a reference here and of those references, each once, levers' order."""
    keys: dict[Key, None] = {}
    for lever, reference, _ in lever_pairs(points):
        keys.setdefault(point_key(reference._asdict()))
        keys.setdefault(point_key(lever._asdict()))
    return list(keys)


def divergence_summary(points: pd.DataFrame, book: SampleBook) -> list[Mapping[str, Any]]:
    """Per lever point with a reference here: the samples paired under the same seed, the share whose output left
    the reference's, the median first differing character among those, and pass@1 of the ones that left and of the
    ones that did not."""
    rows: list[Mapping[str, Any]] = []
    for lever, reference, axis in lever_pairs(points):
        split = items.divergence(book.of(lever.run_ids), book.of(reference.run_ids))
        left = split["position"].notna()
        correct = split["score"].fillna(0.0) >= 1.0
        rows.append(
            {
                "lever": point_name(lever),
                "reference": point_name(reference),
                "axis": axis,
                "paired": len(split),
                "diverged": float(left.mean()) if len(split) else None,
                "median_position": float(split.loc[left, "position"].median()) if left.any() else None,
                "pass_at_1_diverged": float(correct[left].mean()) if left.any() else None,
                "pass_at_1_same": float(correct[~left].mean()) if (~left).any() else None,
            }
        )
    return rows
