"""The headline numbers of a run: one pass@1 per benchmark and their unweighted mean over the suite.

Pure functions over a run's stored metrics (task -> metric name -> value), shared by the bridge (which
stores the mean as task "all", metric "pass@1"), `loopeval results` and the dashboards, so every
place shows the same numbers. A benchmark is a top-level task: a group such as `mmlu_redux` counts
once, as the mean of its subtasks. Its headline is its generative pass@1 (LightEval's pass@k with
k=1, averaged over n samples, as the MELT paper reports); other metrics, such as MMLU-Redux's
`loglikelihood_acc`, never enter it. No imports: `db` stays free of harness and LightEval.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SUITE = "all"  # the task name under which the suite mean is stored
HEADLINE = "pass@1"  # its metric name
_PASS_AT_1 = re.compile(r"^(?:\w+_)?pass@k:k=1(?:&|$)")  # pass@k:k=1&n=4, gpqa_pass@k:k=1&n=4


@dataclass(frozen=True)
class Headline:
    """`benchmarks`: benchmark -> pass@1 (None where it has none); `mean`: over benchmarks, None unless all have one."""

    benchmarks: dict[str, float | None]
    mean: float | None


def headline_metric(names: Iterable[str]) -> str | None:
    """Which of a task's metric names is its headline pass@1, if any."""
    return next((name for name in sorted(names) if _PASS_AT_1.match(name)), None)


def _task_value(metrics: Mapping[str, float | None]) -> float | None:
    name = headline_metric(metrics)
    return None if name is None else metrics[name]


def _benchmark_tasks(metrics: Mapping[str, object]) -> dict[str, list[str]]:
    """benchmark -> its leaf tasks: a group counts once, through its subtasks; the stored `all` is left out."""
    leaves: dict[str, list[str]] = {}
    groups = {task.split(":")[0] for task in metrics if ":" in task}
    for task in metrics:
        benchmark = task.split(":")[0]
        if task == SUITE or (task == benchmark and benchmark in groups):
            continue  # the stored mean, or a group entry whose subtasks are here
        leaves.setdefault(benchmark, []).append(task)
    return leaves


def _mean(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]


def _mean_stderr(values: list[float | None]) -> float | None:
    """The standard error of a mean of independent estimates: sqrt(sum se^2) / count."""
    return None if not values or any(v is None for v in values) else math.sqrt(sum(v * v for v in values)) / len(values)  # type: ignore[operator]


def headline(metrics: Mapping[str, Mapping[str, float | None]]) -> Headline:
    """One pass@1 per benchmark from a run's per-task metrics, and the suite mean (stored `all` is ignored)."""
    benchmarks = {name: _mean([_task_value(metrics[t]) for t in tasks]) for name, tasks in _benchmark_tasks(metrics).items()}
    return Headline(benchmarks, _mean(list(benchmarks.values())))


def benchmark_stderrs(stderrs: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    """The standard error of each benchmark's pass@1 from the stored stderr of its tasks (a group's subtasks
    scored independently). `stderrs` is shaped like `headline`'s metrics: task -> metric -> stderr."""
    return {name: _mean_stderr([_task_value(stderrs[t]) for t in tasks]) for name, tasks in _benchmark_tasks(stderrs).items()}


def headline_stderr(stderrs: Mapping[str, Mapping[str, float | None]]) -> float | None:
    """The standard error of the suite mean (None where a benchmark has none)."""
    return _mean_stderr(list(benchmark_stderrs(stderrs).values()))
