"""One rule for what a task counts toward: `db.headline.benchmark_of` (subtask -> benchmark) and `task_group`
(benchmark -> task group), read by the headline, the evaluation's stored family means and the set labels."""

from __future__ import annotations

import pytest

from db.headline import GROUP_PATTERNS, HEADLINE, SUITE, TASK_GROUPS, benchmark_of, group_means, headline, task_group
from db.sets import EvalSet
from suites import paper, synthetic

PASS = "pass@k:k=1&n=1"


def _every_task(suite: str) -> list[str]:
    """The task names a run of `suite` stores: MMLU-Redux as its subject tasks."""
    module = {"paper": paper, "synthetic": synthetic}[suite]
    subjects = [f"mmlu_redux:{subject}" for subject in getattr(module, "MMLU_REDUX_SUBJECTS", ())]
    return [task for name in module.TASKS for task in (subjects if name == "mmlu_redux" else [name])]


@pytest.mark.parametrize("suite", ["paper", "synthetic"])
def test_every_shipped_task_has_a_benchmark_and_a_named_group(suite: str) -> None:
    """Each task of a shipped suite counts toward one of the suite's top-level tasks, which the table (or a
    pattern) puts in a named group: none falls back to a group of its own."""
    module = {"paper": paper, "synthetic": synthetic}[suite]
    tasks = _every_task(suite)
    assert {benchmark_of(task) for task in tasks} == set(module.TASKS)
    named = set(TASK_GROUPS[suite].values()) | {group for _, group in GROUP_PATTERNS.get(suite, ())}
    assert {task_group(benchmark_of(task), suite) for task in tasks} <= named


def test_the_headline_counts_and_groups_by_the_one_rule() -> None:
    """What the evaluation stores (each subtask, the family's mean under `benchmark_of`, the suite mean) is read
    back with the family counted once, in the group `task_group` names."""
    stored = {
        "aime24": {PASS: 1.0},
        "mmlu_redux:anatomy": {PASS: 0.0},
        "mmlu_redux:virology": {PASS: 0.5},
        benchmark_of("mmlu_redux:anatomy"): {PASS: 0.25},
        SUITE: {HEADLINE: 0.625},
    }
    result = headline(stored, "paper")
    assert result.benchmarks == {"aime24": 1.0, "mmlu_redux": 0.25}
    assert result.groups == {task_group("aime24", "paper"): 1.0, task_group("mmlu_redux", "paper"): 0.25}
    assert group_means(result.benchmarks, "paper") == result.groups


def test_task_group_falls_back_and_knows_suites_without_groups() -> None:
    assert task_group("c30k4", "synthetic") == "automata"  # by pattern
    assert task_group("newer_task", "synthetic") == "newer_task"  # unknown: a group of its own, nothing dropped
    assert task_group("aime24", "custom") is None and task_group("aime24", None) is None
    assert group_means({"aime24": 1.0}, "custom") == {}


def test_the_set_label_names_benchmarks_by_the_same_rule() -> None:
    tasks = ("mmlu_redux:anatomy", "mmlu_redux:virology", "aime24")
    description = EvalSet.of("paper", tasks, None, {}, None).description
    assert " · aime24, mmlu_redux · " in description
