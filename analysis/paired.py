"""A paired comparison of two points on the same items: the difference in a metric (pass@1 by default) with a
bootstrap 95% interval over items and a paired permutation p-value, and how many items a difference of that size
would need.

Two points scored on the same items are correlated (an easy item is easy for both), so their own intervals say
little about their difference: the comparison works on each item's difference. The statistic is the suite mean
(`analysis.items.estimate`: each benchmark once, its items alike), so it equals the difference of the two points'
pass@1 as `loopeval results` shows them.

- **Bootstrap** (percentile, stratified): each resample draws every task's items with replacement, as many as it
  has, an item keeping all its samples and its pair; the interval is the 2.5% and 97.5% quantiles of the resampled
  differences (the same resamples give the interval of the ratio A / B, the retained accuracy).
- **Permutation** (paired, two-sided): under "A and B are exchangeable" each item's pair may swap, so its difference
  flips sign; the p-value is the share of sign patterns whose |difference| reaches the observed one. Exact (every
  pattern of the items whose difference is not 0) up to `EXACT_ITEMS`, else `RESAMPLES` random patterns with the
  observed one counted in, (1 + hits) / (1 + resamples) (drawn per kind of item: `permutation_p`).
- **Items needed**: where the interval straddles 0, the items that would resolve a difference of the observed size at
  95% with the paired variance these items show: the standard error shrinks as 1 / sqrt(items), so
  items x (1.96 standard errors / |difference|)^2, every task grown alike.

The random draws are seeded (`SEED`), so a comparison prints the same numbers every time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.items import task_weights

RESAMPLES = 10_000
EXACT_ITEMS = 13  # up to 2^13 = 8192 sign patterns: enumerated, not drawn
SEED = 0
LEVEL = 0.95
Z95 = 1.96
_TIES = 1e-12  # a resampled statistic this close to the observed one counts as reaching it (float sums)


@dataclass(frozen=True)
class Design:
    """Paired items as arrays: A's and B's value per item, each item's task (an index into `weights`) and each
    task's weight in the suite mean."""

    a: np.ndarray
    b: np.ndarray
    task: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, a: pd.Series, b: pd.Series) -> Design:
        """The design of two `analysis.items.item_values` series on the same items (ValueError otherwise)."""
        if len(a) != len(b) or not a.index.sort_values().equals(b.index.sort_values()):
            shared = len(a.index.intersection(b.index))
            raise ValueError(f"not on the same items: A has {len(a)}, B has {len(b)}, {shared} in common")
        b = b.reindex(a.index)
        tasks = a.index.get_level_values("task")
        names = list(dict.fromkeys(tasks))
        weights = task_weights(names)
        codes = np.array([names.index(task) for task in tasks])
        return cls(a.to_numpy(float), b.to_numpy(float), codes, np.array([weights[name] for name in names]))

    @property
    def difference(self) -> np.ndarray:
        return np.asarray(self.a - self.b)

    def mean(self, values: np.ndarray) -> float:
        """The suite mean of per-item values: each task's mean, weighed."""
        return float(sum(w * values[self.task == t].mean() for t, w in enumerate(self.weights)))

    def stderr(self, values: np.ndarray) -> float:
        """The suite mean's standard error (`analysis.items.estimate`), 0 where a task has one item."""
        squares = 0.0
        for t, w in enumerate(self.weights):
            own = values[self.task == t]
            squares += 0.0 if len(own) < 2 else w * w * own.var(ddof=1) / len(own)
        return math.sqrt(squares)


def bootstrap(design: Design, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """A's and B's suite means over `resamples` stratified resamples of the items (each task's items drawn with
    replacement, pairs kept).

    Drawn as counts: a task's items fall into a few kinds (their (A, B) values: 9 with two samples an item), and n
    draws with replacement are a multinomial count of each kind, the same distribution as drawing item by item for
    a fraction of the work."""
    rng = np.random.default_rng(seed)
    a, b = np.zeros(resamples), np.zeros(resamples)
    for t, weight in enumerate(design.weights):
        own = design.task == t
        kinds, counts = np.unique(np.column_stack([design.a[own], design.b[own]]), axis=0, return_counts=True)
        drawn = rng.multinomial(int(own.sum()), counts / own.sum(), size=resamples) / own.sum()
        a += weight * drawn @ kinds[:, 0]
        b += weight * drawn @ kinds[:, 1]
    return a, b


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central `level` interval of resampled values (linear interpolation between order statistics)."""
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def permutation_p(design: Design, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, bool]:
    """The paired two-sided permutation p-value of the suite-mean difference, and whether it is exact (every sign
    pattern enumerated) rather than drawn."""
    # an item's contribution to the suite mean: its difference times its task's weight over its task's items
    sizes = np.bincount(design.task)
    contribution = design.difference * design.weights[design.task] / sizes[design.task]
    observed = abs(contribution.sum())
    moving = contribution[contribution != 0]
    if len(moving) <= EXACT_ITEMS:
        patterns = (np.arange(2 ** len(moving))[:, None] >> np.arange(len(moving))) & 1
        totals = np.abs(((2 * patterns - 1) * moving).sum(axis=1))
        return float(np.mean(totals >= observed - _TIES)), True
    # drawn as counts: of the m items sharing one contribution v, Binomial(m, 1/2) keep their sign
    values, counts = np.unique(moving, return_counts=True)
    kept = np.random.default_rng(seed).binomial(counts, 0.5, size=(resamples, len(values)))
    hits = int(np.sum(np.abs((2 * kept - counts) @ values) >= observed - _TIES))
    return (1 + hits) / (1 + resamples), False


def items_needed(design: Design) -> int | None:
    """Items that would resolve the observed difference at 95% with the paired variance seen here (module docstring);
    None where the difference is 0 (no number of items resolves it) or the variance is unknown."""
    difference = design.mean(design.difference)
    stderr = design.stderr(design.difference)
    if difference == 0 or stderr == 0:
        return None
    return math.ceil(len(design.a) * (Z95 * stderr / abs(difference)) ** 2)


@dataclass(frozen=True)
class Comparison:
    """A against B on the same items: their `metric` (suite means), the difference A - B with its bootstrap interval
    and standard error, the permutation p-value, A / B (the retained accuracy, where B scored) with its interval, the
    items needed where the interval straddles 0, and each side's share of samples cut off by the token budget."""

    a: str
    b: str
    metric: str
    items: int
    value_a: float
    value_b: float
    difference: float
    low: float
    high: float
    stderr: float
    p_value: float
    exact: bool
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    items_needed: int | None
    cut_a: float | None = None
    cut_b: float | None = None

    @property
    def straddles(self) -> bool:
        """Whether the interval holds 0: these items cannot tell A from B."""
        return self.low <= 0 <= self.high

    @property
    def verdict(self) -> str:
        """'real', 'unresolved' or 'mixed' (the interval and the p-value disagree at 95%)."""
        significant = self.p_value < 1 - LEVEL
        if significant != (not self.straddles):
            return "mixed"
        return "real" if significant else "unresolved"

    @property
    def p_text(self) -> str:
        """The p-value as the sentence gives it: '= 0.097' where exact, '≈ 0.2' where drawn, '< 0.0001' below."""
        return f"{'=' if self.exact else '≈'} {self.p_value:.2g}" if self.p_value >= 1e-4 else "< 0.0001"

    def sentence(self) -> str:
        """The comparison in one sentence, as `loopeval compare` ends and the report lists it."""
        if self.difference == 0:
            size = f"level with {self.b} in {self.metric} ({self.value_a:.3f})"
        else:
            side = "above" if self.difference > 0 else "below"
            size = f"{abs(self.difference):.3f} {side} {self.b} in {self.metric} ({self.value_a:.3f} against {self.value_b:.3f})"
        interval = f"95% interval [{self.low:+.3f}, {self.high:+.3f}] over {self.items} paired items"
        return f"{self.a} is {size}, {interval}, permutation p {self.p_text}: {self._conclusion()}."

    def _conclusion(self) -> str:
        if self.low == self.high == 0:
            return "not one item scores differently"
        if self.verdict == "real":
            return "the difference is real"
        if self.verdict == "mixed":
            return "the interval and the permutation test disagree at 95%, so call it unresolved"
        if self.items_needed is None:
            return "these items cannot tell them apart"
        return (
            f"these items cannot tell them apart; a difference of this size needs about {self.items_needed:,} items "
            "to resolve at 95%"
        )

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "straddles_zero": self.straddles, "verdict": self.verdict, "sentence": self.sentence()}


def compare(
    a: pd.Series, b: pd.Series, names: tuple[str, str], metric: str = "pass@1", resamples: int = RESAMPLES
) -> Comparison:
    """The paired comparison of two points' per-item values (`analysis.items.item_values`, same items; ValueError
    otherwise)."""
    design = Design.of(a, b)
    boot_a, boot_b = bootstrap(design, resamples)
    low, high = percentile_interval(boot_a - boot_b)
    value_a, value_b = design.mean(design.a), design.mean(design.b)
    ratio, ratio_low, ratio_high = None, None, None
    if value_b > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_low, ratio_high = percentile_interval(np.where(boot_b > 0, boot_a / boot_b, 0.0))
        ratio = value_a / value_b
    p_value, exact = permutation_p(design, resamples)
    return Comparison(
        a=names[0],
        b=names[1],
        metric=metric,
        items=len(design.a),
        value_a=value_a,
        value_b=value_b,
        difference=value_a - value_b,
        low=low,
        high=high,
        stderr=design.stderr(design.difference),
        p_value=p_value,
        exact=exact,
        ratio=ratio,
        ratio_low=ratio_low,
        ratio_high=ratio_high,
        items_needed=items_needed(design) if low <= 0 <= high else None,
    )
