"""LightEval objects made from this project's task configs only: the registry, the datasets, the sample count.

LightEval 0.13's `Registry()` imports every built-in task module, and its tinyBenchmarks module
downloads a file at import time, which fails offline (docs/architecture.md, pitfalls). `ProjectRegistry`
holds exactly the configs it is given. Datasets are read from the local JSONL or parquet file a
config's `hf_repo` names (`load_suite` sets it), never from the hub.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

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


def _read(path: Path) -> Dataset:
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            return Dataset.from_list([json.loads(line) for line in f if line.strip()])
    return Dataset.from_pandas(pd.read_parquet(path), preserve_index=False)  # keeps list columns as lists


def load_task_dataset(config: LightevalTaskConfig) -> DatasetDict:
    """The task's evaluation split read from the local file its `hf_repo` names, filtered like LightEval does."""
    path = Path(config.hf_repo)
    if path.suffix not in LOCAL_SUFFIXES or not path.is_file():
        raise SuiteError(
            f"task {config.name} reads {config.hf_repo}, which is not a local JSONL or parquet file; "
            "load the suite with --data-dir DIR holding a copy (nothing is downloaded at run time)"
        )
    try:
        rows = _read(path)
    except (OSError, ValueError) as exc:
        raise SuiteError(f"task {config.name}: cannot read {path}: {exc}") from exc
    if len(rows) == 0:
        raise SuiteError(f"task {config.name}: {path} holds no rows")
    dataset = DatasetDict({config.evaluation_splits[0]: rows})
    return dataset.filter(config.hf_filter) if config.hf_filter is not None else dataset


def with_samples(configs: list[LightevalTaskConfig], n: int) -> list[LightevalTaskConfig]:
    """Copies of the configs whose pass@k metrics draw `n` samples per doc (metric names say `n=<n>`).

    The run's sample count is the one knob for "pass@1 over n samples"; other metrics (exact match,
    log-likelihood accuracy) score one sample and are left as they are.
    """
    result = []
    for config in configs:
        metrics = []
        for metric in config.metrics:
            if isinstance(metric.sample_level_fn, PassAtK) and metric.sample_level_fn.n != n:
                metric = copy.deepcopy(metric)
                metric.sample_level_fn.n = n
                metric.metric_name = f"{metric.metric_name.split(':')[0]}:k={metric.sample_level_fn.k}&n={n}"
            metrics.append(metric)
        result.append(copy.copy(config))
        result[-1].metrics = tuple(metrics)
    return result
