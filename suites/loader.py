"""LightEval objects made from this project's task configs only: the registry, the datasets, the sample count.

LightEval 0.13's `Registry()` imports every built-in task module, and its tinyBenchmarks module
downloads a file at import time, which fails offline (docs/architecture.md, pitfalls). `ProjectRegistry`
holds exactly the configs it is given. Datasets are read from the local JSONL or parquet file a
config's `hf_repo` names (`load_suite` sets it), never from the hub.
"""

from __future__ import annotations

import copy
import functools
import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from datasets import Dataset, DatasetDict
from lighteval.metrics.metrics_sample import PassAtK
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.registry import Registry

from suites import SuiteError

LOCAL_SUFFIXES = (".jsonl", ".parquet")


class ProjectRegistry(Registry):
    """A LightEval `Registry` over the given task configs, each run with its own `num_fewshots`."""

    def __init__(self, configs: list[LightevalTaskConfig]):
        # Registry.__init__ would load every built-in task module (see the module docstring), so
        # this sets the same attributes from `configs` and reuses LightEval's per-task set-up.
        names = [config.name for config in configs]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise SuiteError(f"task names must be unique, repeated: {', '.join(duplicates)}")
        self._load_multilingual = False
        self._custom_tasks = None
        self._task_registry = {config.name: config for config in configs}
        self.tasks_list = [f"{config.name}|{config.num_fewshots}" for config in configs]
        self.task_to_configs = self._update_task_configs()


def _text(value: Any) -> str:
    """A text cell; numbers become their usual spelling (27.0 -> "27"), since answers are compared as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"expected text, got {type(value).__name__} {value!r}")
    number = float(value)
    return str(int(number)) if number.is_integer() else str(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer()):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"expected an integer, got {type(value).__name__} {value!r}")


def _prompt(value: Any) -> str:
    """A question the model is asked: text with something in it (an empty one would be scored as if asked)."""
    text = _text(value)
    if not text.strip():
        raise ValueError(f"expected a non-empty question, got {text!r}")
    return text


def _flag(value: Any) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise ValueError(f"expected true or false, got {value!r}")


def _texts(value: Any) -> list[str]:
    if hasattr(value, "tolist"):  # a numpy array, as parquet list columns may arrive
        value = value.tolist()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"expected a list of texts, got {type(value).__name__} {value!r}")
    return [_text(item) for item in value]


# Column kinds a suite's COLUMNS may name, each a coercion that raises ValueError on a value it cannot take.
_KINDS: dict[str, Callable[[Any], Any]] = {
    "text": _text,
    "prompt": _prompt,
    "int": _integer,
    "flag": _flag,
    "texts": _texts,
}


def coerce_row(row: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """`row` with each named column checked and coerced to its kind ("text", "prompt", "int", "flag", "texts";
    a trailing "?" also allows null). Raises KeyError for a missing column, ValueError(column) else."""
    result = dict(row)
    for column, kind in columns.items():
        value = row[column]
        if value is None and kind.endswith("?"):
            continue
        try:
            result[column] = _KINDS[kind.rstrip("?")](value)
        except ValueError as exc:
            raise ValueError(f"column {column!r}: {exc}") from None
    return result


class CoercedPrompt:
    """A task's prompt function that first coerces the row's columns, as they were checked before the run."""

    def __init__(self, prompt: Callable[..., Any], columns: Mapping[str, str]) -> None:
        self.prompt = prompt
        self.columns = dict(columns)
        self.__name__ = getattr(prompt, "__name__", type(prompt).__name__)  # LightEval logs the function's name

    def __call__(self, line: dict[str, Any], task_name: str | None = None) -> Any:
        return self.prompt(coerce_row(line, self.columns), task_name)


def check_rows(config: LightevalTaskConfig, path: Path, columns: Mapping[str, str], source: str) -> None:
    """Open `path` and check every row has `columns` of the right kinds; SuiteError (one line) names
    the file, the column and `source`, the public dataset to copy, at the first problem."""
    copy = f"copy {source} there unchanged"
    try:
        rows = _read(path)
    except (OSError, ValueError) as exc:
        raise SuiteError(f"task {config.name}: cannot read {path} ({_first_line(exc)}); {copy}") from None
    if len(rows) == 0:
        raise SuiteError(f"task {config.name}: {path} holds no rows; {copy}")
    missing = [column for column in columns if column not in rows.column_names]
    if missing:
        raise SuiteError(
            f"task {config.name}: {path} has no column {missing[0]!r} (it has {', '.join(rows.column_names)}); {copy}"
        )
    for index, row in enumerate(rows):
        try:
            coerce_row(row, columns)
        except ValueError as exc:
            raise SuiteError(f"task {config.name}: {path} row {index + 1}, {exc}; {copy}") from None


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _read(path: Path) -> Dataset:
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            rows = [(number, json.loads(line)) for number, line in enumerate(f, 1) if line.strip()]
        for number, row in rows:
            if not isinstance(row, dict):  # Dataset.from_list fails on these with an AttributeError
                raise ValueError(f"line {number} is a JSON {type(row).__name__}, not an object")
        return Dataset.from_list([row for _, row in rows])
    return Dataset.from_pandas(pd.read_parquet(path), preserve_index=False)  # keeps list columns as lists


def load_task_dataset(config: LightevalTaskConfig) -> DatasetDict:
    """The task's evaluation split read from the local file its `hf_repo` names, filtered like LightEval does.

    Read once per process while the file is unchanged (same size, modification time and inode): a sweep runs the
    same tasks once per model and loop count, and reading a file into a Dataset takes time each task. The
    Dataset is never changed in place (LightEval reads rows from it), so runs can share it."""
    path = Path(config.hf_repo)
    if path.suffix not in LOCAL_SUFFIXES or not path.is_file():
        raise SuiteError(
            f"task {config.name} reads {config.hf_repo}, which is not a local JSONL or parquet file; "
            "load the suite with --data-dir DIR holding a copy (nothing is downloaded at run time)"
        )
    stat = path.stat()
    return _dataset(
        config.name,
        str(path.resolve()),
        (stat.st_size, stat.st_mtime_ns, stat.st_ino),
        config.evaluation_splits[0],
        config.hf_filter,
    )


@functools.lru_cache(maxsize=256)  # above the paper suite's 66 tasks (57 of them mmlu_redux subjects)
def _dataset(
    task: str, path: str, version: tuple[int, int, int], split: str, hf_filter: Callable[[dict[str, Any]], bool] | None
) -> DatasetDict:
    try:
        rows = _read(Path(path))
    except (OSError, ValueError) as exc:
        raise SuiteError(f"task {task}: cannot read {path}: {exc}") from exc
    if len(rows) == 0:
        raise SuiteError(f"task {task}: {path} holds no rows")
    dataset = DatasetDict({split: rows})
    return dataset.filter(hf_filter) if hf_filter is not None else dataset


def with_samples(configs: list[LightevalTaskConfig], n: int) -> list[LightevalTaskConfig]:
    """Copies of the configs whose pass@k metrics draw `n` samples per doc (metric names say `n=<n>`).

    The run's sample count is the one knob for "pass@1 over n samples"; other metrics (exact match,
    log-likelihood accuracy) score one sample and are left as they are.
    """
    result = []
    for config in configs:
        metrics = []
        for metric in config.metrics:
            fn = metric.sample_level_fn
            if isinstance(fn, PassAtK) and fn.n != n:
                metric = copy.deepcopy(metric)
                fn = metric.sample_level_fn
                assert isinstance(fn, PassAtK)  # the copy's
                fn.n = n
                metric.metric_name = f"{metric.metric_name.split(':')[0]}:k={fn.k}&n={n}"
            metrics.append(metric)
        result.append(copy.copy(config))
        result[-1].metrics = tuple(metrics)
    return result
