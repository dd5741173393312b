"""The evaluation of one run: LightEval's Pipeline on the project's tasks, and the scores read back.

`run_suite` runs the real Pipeline with two substitutions: the model is `AdapterModel`
(`harness.bridge.lighteval_model`) and the task set-up reads only the project's configs and local files
(`_ProjectPipeline`). LightEval scores with its own metrics; this module reads back each sample's
score and the aggregated metrics per task, per benchmark and for the suite (`db.headline`).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lighteval.logging.evaluation_tracker import EvaluationTracker
from lighteval.metrics.metrics_sample import SamplingMetric
from lighteval.models.model_output import ModelResponse
from lighteval.pipeline import ParallelismManager, Pipeline, PipelineParameters
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc, SamplingMethod
from rich.progress import Progress

from adapters.base import Adapter, AdapterError, Sampling
from db.headline import HEADLINE, SUITE, benchmark_of, headline
from harness.bridge.lighteval_model import AdapterModel
from harness.bridge.records import LOGLIKELIHOOD_SAMPLE_INDEX, SampleSink, task_of
from suites.loader import ProjectRegistry, load_task_dataset, with_samples

# LightEval's tracker wants an output folder, and writes to it only when asked to save, which loopeval never
# does (the store keeps everything): an in-memory fsspec folder, so a killed run leaves no folder in /tmp.
TRACKER_DIR = "memory://loopeval-lighteval"


@dataclass
class SuiteResult:
    """What a suite run measured.

    `metrics`: task -> metric name -> (value, stderr or None), with LightEval's values per task, an
    entry per benchmark made of subtasks (`mmlu_redux`: the mean of its subtasks, `db.headline.benchmark_of`)
    and `all`: {"pass@1": the unweighted mean over benchmarks of their pass@1, each counting once} (`db.headline`).
    `context_cut`: how many samples generated here stopped at the context (`harness.bridge.records.CONTEXT_LIMIT`).
    `scores`: (task, doc_id, sample_index) -> 1.0/0.0 correctness of that sample, judged by the
    per-sample check of the task's first metric (for pass@k, the same check pass@k counts); for a
    metric without a per-sample check, the doc's score is given to each of its samples. Log-likelihood
    picks are under `LOGLIKELIHOOD_SAMPLE_INDEX` with the doc's score of the first log-prob metric.
    """

    metrics: dict[str, Mapping[str, tuple[float | None, float | None]]]
    scores: dict[tuple[str, str, int], float]
    n_docs: dict[str, int] = field(default_factory=dict)
    context_cut: int = 0  # samples generated in this call whose finish reason is CONTEXT_LIMIT


class _ProjectPipeline(Pipeline):
    """LightEval's Pipeline with its task set-up reading only the given configs and their local files.

    `Pipeline._init_tasks_and_requests` would build LightEval's default `Registry` (every built-in
    task module; see docs/architecture.md) and fetch datasets from the hub; this does the same steps on
    `ProjectRegistry` and `load_task_dataset`.
    """

    def __init__(self, configs: list[LightevalTaskConfig], **kwargs: Any) -> None:
        self._configs = configs
        super().__init__(tasks=",".join(c.name for c in configs), **kwargs)

    def _init_tasks_and_requests(self, tasks: str) -> None:
        self.registry = ProjectRegistry(self._configs)
        self.tasks_dict = self.registry.load_tasks()
        for task in self.tasks_dict.values():
            task.dataset = load_task_dataset(task.config)
        self.documents_dict = {
            name: task.get_docs(self.pipeline_parameters.max_samples) for name, task in self.tasks_dict.items()
        }
        self.sampling_docs = collections.defaultdict(list)
        for docs in self.documents_dict.values():
            for doc in docs:
                for method in doc.sampling_methods:
                    self.sampling_docs[method].append(doc)
        self.evaluation_tracker.task_config_logger.log(self.tasks_dict)


def _sample_scores(pipeline: _ProjectPipeline) -> dict[tuple[str, str, int], float]:
    """Per-sample correctness, from the docs and responses LightEval scored (see `SuiteResult.scores`)."""
    scores: dict[tuple[str, str, int], float] = {}
    for full_name, details in pipeline.evaluation_tracker.details_logger.details.items():
        task = pipeline.tasks_dict[full_name]
        for detail in details:
            doc, response = detail.doc, detail.model_response
            name = task_of(doc)
            if response.text:  # generated samples
                metric = next(m for m in task.metrics if m.category == SamplingMethod.GENERATIVE)
                fn = metric.sample_level_fn
                if isinstance(fn, SamplingMetric):
                    choices = [fn.preprocess(c) for c in doc.choices]
                    gold_doc = Doc(query=doc.query, choices=choices, gold_index=doc.gold_index)
                    for j, text in enumerate(response.final_text):
                        judged = ModelResponse(text=[fn.preprocess(text)])
                        scores[(name, doc.id, j)] = float(fn.compute_score(gold_doc, judged))
                else:
                    for j in range(len(response.text)):
                        scores[(name, doc.id, j)] = float(detail.metric[metric.metric_name])
            else:  # a log-likelihood ranking of the choices
                metric = next(m for m in task.metrics if m.category == SamplingMethod.LOGPROBS)
                scores[(name, doc.id, LOGLIKELIHOOD_SAMPLE_INDEX)] = float(detail.metric[metric.metric_name])
    return scores


def _metrics(pipeline: _ProjectPipeline) -> dict[str, Mapping[str, tuple[float | None, float | None]]]:
    """LightEval's aggregated metrics by task name, plus each family's mean (`mmlu_redux`,
    `db.headline.benchmark_of`) and `all`: the suite mean of pass@1 (`db.headline`)."""
    aggregated = pipeline.evaluation_tracker.metrics_logger.metric_aggregated
    metrics: dict[str, dict[str, tuple[float, float | None]]] = {}
    for full_name in pipeline.tasks_dict:
        values = aggregated[full_name]
        metrics[full_name.rsplit("|", 1)[0]] = {
            name: (float(value), _float_or_none(values.get(f"{name}_stderr")))
            for name, value in values.items()
            if not name.endswith("_stderr")
        }

    def mean_of(tasks: list[str]) -> dict[str, tuple[float, float | None]]:
        values: dict[str, list[float]] = collections.defaultdict(list)
        for task in tasks:
            for name, (value, _) in metrics[task].items():
                values[name].append(value)
        return {name: (sum(vals) / len(vals), None) for name, vals in values.items()}

    families: dict[str, list[str]] = collections.defaultdict(list)
    for task in list(metrics):
        families[benchmark_of(task)].append(task)
    for benchmark, members in families.items():
        if members != [benchmark]:
            metrics[benchmark] = mean_of(members)
    plain = {task: {name: value for name, (value, _) in by_name.items()} for task, by_name in metrics.items()}
    suite_mean = headline(plain)
    return {**metrics, SUITE: {HEADLINE: (suite_mean.mean, None)}}


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def run_suite(
    adapter: Adapter,
    task_configs: list[LightevalTaskConfig],
    sampling: Sampling,
    *,
    sink: SampleSink | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    progress: bool | Progress | None = True,
) -> SuiteResult:
    """Run the tasks through LightEval's Pipeline on `adapter` and return metrics and per-sample scores.

    `sampling.n` is the number of samples per doc for pass@k metrics (`suites.loader.with_samples`);
    `limit` keeps the first `limit` docs of each task in LightEval's fixed shuffled order; `progress`
    is True (own bar), False, or a rich `Progress` to add the bars to.
    """
    if not task_configs:
        raise AdapterError("no tasks to run")
    if limit is not None and limit < 1:
        raise AdapterError(f"limit must be >= 1, got {limit}")
    configs = with_samples(task_configs, sampling.n)
    model = AdapterModel(adapter, sampling, batch_size=batch_size, sink=sink, progress=progress)
    pipeline = _ProjectPipeline(
        configs,
        pipeline_parameters=PipelineParameters(launcher_type=ParallelismManager.CUSTOM, max_samples=limit),
        evaluation_tracker=EvaluationTracker(output_dir=TRACKER_DIR, save_details=False),
        model=model,
    )
    pipeline.evaluate()
    return SuiteResult(
        metrics=_metrics(pipeline),
        scores=_sample_scores(pipeline),
        n_docs={name.rsplit("|", 1)[0]: len(docs) for name, docs in pipeline.documents_dict.items()},
        context_cut=model.context_cut,
    )
