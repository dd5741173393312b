"""The headline numbers of a run: one pass@1 per benchmark and their unweighted mean over the suite.

Pure functions over a run's stored metrics (task -> metric name -> value), shared by the bridge (which
stores the mean as task "all", metric "pass@1"), `loopeval results` and the dashboards, so every
place shows the same numbers. A benchmark is a top-level task: a group such as `mmlu_redux` counts
once, as the mean of its subtasks (`benchmark_of`). Its headline is its generative pass@1 (LightEval's pass@k with
k=1, averaged over n samples, as the MELT paper reports); other metrics, such as MMLU-Redux's
`loglikelihood_acc`, never enter it. No imports: `db` stays free of harness and LightEval.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

SUITE = "all"  # the task name under which the suite mean is stored
HEADLINE = "pass@1"  # its metric name
_PASS_AT_1 = re.compile(r"^(?:\w+_)?pass@k:k=1(?:&|$)")  # pass@k:k=1&n=4, gpqa_pass@k:k=1&n=4


_MATHS_REASONING = ("aime24", "aime25", "aime26", "amc23", "math_500", "olympiadbench", "gpqa_diamond", "hle")
# suite -> benchmark -> task group. A suite mean averages a knowledge drop away (deeper loops may help
# maths while MMLU-Redux falls), so the headline also gives each group's mean, and the depth
# extrapolation figure plots them apart. Kept here, beside the mean, because the dashboards read only `db`.
TASK_GROUPS: dict[str, dict[str, str]] = {
    "paper": {**dict.fromkeys(_MATHS_REASONING, "maths/reasoning"), "mmlu_redux": "knowledge", "humaneval": "code"},
    "synthetic": {**dict.fromkeys(("addition", "chain2", "chain3", "chain4"), "arithmetic"), "lookup": "recall"},
}
# Groups by task-name pattern, for families named by their parameters: the synthetic suite's
# cellular automata (r30k4, c30k6, c150k7, ...: ring or causal, rule, steps).
GROUP_PATTERNS: dict[str, tuple[tuple[re.Pattern[str], str], ...]] = {
    "synthetic": ((re.compile(r"^[rc]\d+k\d+$"), "automata"),),
}


@dataclass(frozen=True)
class Headline:
    """`benchmarks`: benchmark -> pass@1 (None where it has none); `mean`: over benchmarks, None unless all have one;
    `groups`: task group -> the mean over its benchmarks (None unless all have one), for suites with groups."""

    benchmarks: dict[str, float | None]
    mean: float | None
    groups: dict[str, float | None] = field(default_factory=dict)


def headline_metric(names: Iterable[str]) -> str | None:
    """Which of a task's metric names is its headline pass@1, if any."""
    return next((name for name in sorted(names) if _PASS_AT_1.match(name)), None)


def _task_value(metrics: Mapping[str, float | None]) -> float | None:
    name = headline_metric(metrics)
    return None if name is None else metrics[name]


def benchmark_of(task: str) -> str:
    """The benchmark a task counts toward: a subtask (`mmlu_redux:anatomy`) toward its family (`mmlu_redux`),
    any other task toward itself. The one rule for it: the evaluation stores a family's mean under this name
    (`harness.bridge.evaluation`), the headline counts each benchmark once and the task groups are of benchmarks."""
    return task.split(":")[0]


def task_group(benchmark: str, suite: str | None) -> str | None:
    """The task group of a benchmark (`TASK_GROUPS`, then `GROUP_PATTERNS`); None for a suite without groups.
    A benchmark the table does not know (a newer task) forms a group of its own, so nothing is dropped."""
    table = TASK_GROUPS.get(suite or "")
    if not table:
        return None
    patterns = GROUP_PATTERNS.get(suite or "", ())
    return table.get(benchmark) or next((group for pattern, group in patterns if pattern.match(benchmark)), benchmark)


def _leaves(metrics: Mapping[str, Mapping[str, float | None]]) -> dict[str, list[float | None]]:
    """Benchmark -> the headline value of each of its tasks (a family's subtasks, or the task itself)."""
    leaves: dict[str, list[float | None]] = {}
    families = {benchmark_of(task) for task in metrics if benchmark_of(task) != task}
    for task, values in metrics.items():
        benchmark = benchmark_of(task)
        if task == SUITE or (task == benchmark and benchmark in families):
            continue  # the stored mean, or a family's mean whose subtasks are here
        leaves.setdefault(benchmark, []).append(_task_value(values))
    return leaves


def _combine(values: list[float | None], combine: Callable[[list[float]], float]) -> float | None:
    known = [value for value in values if value is not None]
    return combine(known) if values and len(known) == len(values) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _mean_stderr(stderrs: list[float]) -> float:
    """Standard error of an unweighted mean of independent estimates: sqrt(sum of squares) / n."""
    return math.sqrt(sum(e * e for e in stderrs)) / len(stderrs)


def headline(metrics: Mapping[str, Mapping[str, float | None]], suite: str | None = None) -> Headline:
    """One pass@1 per benchmark from a run's per-task metrics, the suite mean (stored `all` is ignored)
    and, when `suite` has task groups (`TASK_GROUPS`, `GROUP_PATTERNS`), the mean of each group present."""
    benchmarks = {name: _combine(values, _mean) for name, values in _leaves(metrics).items()}
    return Headline(benchmarks, _combine(list(benchmarks.values()), _mean), group_means(benchmarks, suite))


def group_means(benchmarks: Mapping[str, float | None], suite: str | None) -> dict[str, float | None]:
    """Task group (`task_group`) -> mean pass@1 of its benchmarks among `benchmarks`; {} for a suite without groups."""
    grouped: dict[str, list[float | None]] = {}
    for name, value in benchmarks.items():
        group = task_group(name, suite)
        if group is not None:
            grouped.setdefault(group, []).append(value)
    return {group: _combine(values, _mean) for group, values in grouped.items()}


def benchmark_stderrs(stderrs: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    """Each benchmark's standard error, from its tasks' headline stderr (same shape as `headline`'s input);
    a group's subtasks add in quadrature. None where a task has none."""
    return {name: _combine(values, _mean_stderr) for name, values in _leaves(stderrs).items()}


def headline_stderr(stderrs: Mapping[str, Mapping[str, float | None]]) -> float | None:
    """The suite mean's standard error, from each task's headline stderr (same shape as `headline`'s input).

    Benchmarks are different problems, so their estimates are independent and the errors add in
    quadrature, a group's subtasks first, then the suite's benchmarks. None unless every task has one.
    """
    return _combine(list(benchmark_stderrs(stderrs).values()), _mean_stderr)


@dataclass(frozen=True)
class Estimate:
    """One run's estimate of a task's metric: the mean over its `items` docs and its standard error
    (LightEval's: the items' sample standard deviation over sqrt(items)); `items` None where unknown."""

    mean: float
    stderr: float | None
    items: int | None


def pool(estimates: list[Estimate]) -> tuple[float, float | None]:
    """Mean and standard error of several runs' items pooled into one sample, as if one run had scored them all.

    Repeated seeds of one (model, loops) score the same docs again: pooled, the mean is over every
    (seed, doc) item and the standard error is that sample's, its spread within each run plus the runs'
    differences (the exact pooled variance from each run's mean, stderr and item count). One estimate
    is returned as it is. Where an item count or stderr is unknown, the runs are taken as independent
    estimates of one mean (their errors add in quadrature).
    """
    if len(estimates) == 1:
        return estimates[0].mean, estimates[0].stderr
    means = [e.mean for e in estimates]
    stderrs = [e.stderr for e in estimates if e.stderr is not None]
    if len(stderrs) < len(estimates):
        return _mean(means), None
    items = [e.items for e in estimates if e.items]
    if len(items) < len(estimates):
        return _mean(means), _mean_stderr(stderrs)
    total = sum(items)
    mean = sum(m * n for m, n in zip(means, items)) / total
    # (items - 1) * variance within each run, from stderr = sd / sqrt(items), plus each run's offset from the pooled mean
    squares = sum(s**2 * n * (n - 1) + n * (m - mean) ** 2 for m, s, n in zip(means, stderrs, items))
    return mean, math.sqrt(squares / (total - 1) / total)


def rounded(value: float, digits: int = 3) -> str:
    """`value` to `digits` decimals, alike for every sum of the same numbers: float noise below 1e-9 is dropped
    first, so a mean of 0.1425 reads 0.142 whether its sum came out a hair above it or below (summing order)."""
    return f"{round(round(value, 9), digits):.{digits}f}"
