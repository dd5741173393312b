"""What a point scores per item, from its stored samples: pass@k, maj@n and avg@n, the suite mean over benchmarks
with its standard error, the share of samples cut off by the token budget, and pass@1 by generation length.

An item is one (task, doc). Its samples are every sample of the point's runs on that doc, every seed's, so that a
resampled item carries all of them (`analysis.paired`). The suite mean weighs the items as the stored headline does
(`db.headline`): each benchmark counts once, a family's subtasks share their benchmark's weight, and within a task
every item counts alike, so pass@1 read here equals the stored pass@1 (`tests/analysis/test_claims.py`).

The metrics (`METRICS`), over an item's n samples of which c scored:

- `pass@k` (k <= n): the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k): the chance that k of
  the n samples, drawn without replacement, include one that scored. pass@1 is c / n.
- `avg@n`: the mean score of the samples (pass@1 where scores are 0 or 1).
- `maj@n`: the score of the answer most samples give. Only the output text and its score are stored, not an
  extracted answer, so the answer is the output stripped of surrounding whitespace: exactly what the synthetic suite's
  exact match compares. Where several answers tie for most votes, the item scores their mean (the expected score of
  picking one of them at random). On a suite whose scorer extracts the answer from prose (the paper suite), two
  replies with one answer in other words vote apart, so maj@n there is the majority of whole replies.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from db.headline import benchmark_of

ITEM = ["task", "doc_id"]  # an item's identity
METRICS = ("pass@k", "maj@n", "avg@n")  # as `--metric` names them, k and n numbers: pass@2, maj@4, avg@4
CUT_REASONS = ("length", "context_limit")  # finish reasons of a sample cut off before its answer ended
_METRIC = re.compile(r"^(pass|maj|avg)@([1-9][0-9]*)$")


def parse_metric(name: str) -> tuple[str, int]:
    """'pass@4' -> ('pass', 4); ValueError naming the accepted forms on anything else."""
    match = _METRIC.match(name.strip())
    if match is None:
        raise ValueError(f"{name!r} is not a metric: use pass@K, maj@N or avg@N (K, N whole numbers from 1)")
    return match.group(1), int(match.group(2))


@functools.cache  # items share a few (n, c): a set's points ask the same ones thousands of times
def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one item with `c` of `n` samples correct (Chen et al., 2021): 1 - C(n-c, k) / C(n, k),
    computed as a product so large n never overflows."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _majority(samples: pd.DataFrame) -> pd.Series:
    """Each item's maj@n from its samples: the mean score of the answer (stripped output) most of them give, tied
    answers averaged."""
    votes = samples.assign(answer=samples["output"].fillna("").str.strip())
    per_answer = votes.groupby([*ITEM, "answer"])["score"].agg(["size", "mean"]).reset_index()
    most = per_answer.groupby(ITEM)["size"].transform("max")
    return per_answer[per_answer["size"] == most].groupby(ITEM)["mean"].mean()


def sample_counts(samples: pd.DataFrame) -> pd.Series:
    """Samples per item (`ITEM`)."""
    return samples.groupby(ITEM).size()


def item_values(samples: pd.DataFrame, metric: str) -> pd.Series:
    """One value of `metric` per item (`ITEM` index) from `db.sample_queries.run_samples` rows; an unscored sample
    counts as 0, as LightEval scores it. pass@k reads all n samples of an item; maj@N and avg@N its first N (by seed,
    then sample index), as LightEval's maj@n does. ValueError where `metric` asks for more samples than an item has."""
    kind, k = parse_metric(metric)
    scored = samples.assign(score=samples["score"].fillna(0.0))
    least = int(sample_counts(scored).min()) if not scored.empty else 0
    if k > least:
        raise ValueError(f"{metric} needs {k} samples of every item; these items have n = {least}")
    if kind == "pass":
        grouped = scored.assign(correct=scored["score"] >= 1.0).groupby(ITEM)["correct"].agg(["size", "sum"])
        values = [pass_at_k(int(n), int(c), k) for n, c in zip(grouped["size"], grouped["sum"])]
        return pd.Series(values, index=grouped.index, dtype="float64")
    first = scored.sort_values([*ITEM, "seed", "sample_index"], kind="stable").groupby(ITEM).head(k)
    if kind == "avg":
        return first.groupby(ITEM)["score"].mean()
    return _majority(first)


def task_weights(tasks: Iterable[str]) -> dict[str, float]:
    """Each task's weight in the suite mean, as `db.headline.headline` weighs it: every benchmark (`benchmark_of`) counts
    once, split evenly among its tasks. A lone task weighs 1."""
    leaves: dict[str, list[str]] = {}
    for task in dict.fromkeys(tasks):
        leaves.setdefault(benchmark_of(task), []).append(task)
    return {task: 1.0 / (len(leaves) * len(members)) for members in leaves.values() for task in members}


def estimate(values: pd.Series) -> tuple[float, float | None]:
    """The suite mean of per-item values (`ITEM` index) and its standard error: each task's mean with the items'
    sample standard deviation over sqrt(items) (LightEval's), combined with `task_weights`, the tasks independent.
    The standard error is None where a task has a single item."""
    codes, names = pd.factorize(values.index.get_level_values("task"))
    array = values.to_numpy(float)
    sizes = np.bincount(codes)
    means = np.bincount(codes, array) / sizes
    weights = np.array([task_weights(names)[name] for name in names])
    mean = float(weights @ means)
    if (sizes < 2).any():
        return mean, None
    variances = np.bincount(codes, (array - means[codes]) ** 2) / (sizes - 1)
    return mean, float(math.sqrt(np.sum(weights**2 * variances / sizes)))


def cut_share(samples: pd.DataFrame) -> float | None:
    """The share of samples the token budget (or the context) cut off (`CUT_REASONS`): they score 0 for a reason no
    accuracy shows. None where no sample says why it ended."""
    reasons = samples["finish_reason"].dropna()
    return None if reasons.empty else float(reasons.isin(CUT_REASONS).mean())


def length_bin(tokens: float) -> str:
    """A generated length's bin, powers of two ('0', '1', '2-3', '4-7', ...): '?' where the length is unknown."""
    if tokens != tokens:
        return "?"
    low = 0 if tokens < 1 else 2 ** int(math.log2(tokens))
    high = max(low, 2 * low - 1)
    return str(low) if low == high else f"{low}-{high}"


def by_length(samples: pd.DataFrame) -> pd.DataFrame:
    """pass@1 of the samples binned by their generated length (`length_bin`), shortest first: bin, low (its first
    length), samples, pass@1 and the share cut off (`cut_share`). Each sample counts alike, whatever its item."""
    frame = samples.assign(
        bin=[length_bin(t) for t in samples["generated_tokens"]],
        low=samples["generated_tokens"].fillna(-1),
        correct=samples["score"].fillna(0.0) >= 1.0,
        cut=samples["finish_reason"].isin(CUT_REASONS),
    )
    table = frame.groupby("bin").agg(low=("low", "min"), samples=("correct", "size"), pass_at_1=("correct", "mean"))
    table["cut"] = frame.groupby("bin")["cut"].mean()
    return table.sort_values("low").reset_index()


def first_difference(a: str, b: str) -> int | None:
    """The first character position at which two outputs differ (the shorter one's length where one extends the
    other); None where they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def divergence(lever: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Where a lever run's outputs leave its reference's under the same seed: the samples both have (same seed, task,
    doc and sample index) with `position`, the first character at which the lever's output differs (NaN where the two
    are the same), and the lever sample's score and length. Characters, not tokens: only the text is stored, and on
    the zoo's character tokenizer a character is a token."""
    keys = ["seed", "task", "doc_id", "sample_index"]
    both = lever.merge(reference[[*keys, "output"]], on=keys, suffixes=("", "_reference"))
    positions = [first_difference(a or "", b or "") for a, b in zip(both["output"], both["output_reference"])]
    return both.assign(position=pd.Series(positions, index=both.index, dtype="float64"))
