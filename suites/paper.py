"""The `paper` suite: the reasoning benchmarks of the MELT and Ouro papers, as LightEval defines them.

Prompt functions and metrics are LightEval's own, imported from the specific LightEval modules
that hold them (never through LightEval's default registry, which imports every task module and
downloads at import time). Each task names its public dataset (`hf_repo`, `hf_subset`, split);
nothing is downloaded: `load_suite("paper", data_dir=DIR)` reads local copies, one file per task,
`DIR/<task>.jsonl` or `DIR/<task>.parquet` holding the public split's rows unchanged, and for
MMLU-Redux one file per subject, `DIR/mmlu_redux/<subject>.jsonl`.

Scores are pass@1 averaged over n samples (LightEval's pass@k with k=1), where each sample is
judged by the check LightEval uses for that benchmark: math-verify extraction for the math sets,
letter extraction for GPQA and MMLU-Redux. Departures from LightEval, each forced by running offline:
- AMC23 has no LightEval task; it uses LightEval's AIME prompt and metric on `math-ai/amc23`.
- OlympiadBench keeps the English, text-only, open-ended maths subset (`OE_TO_maths_en_COMP`) and
  is scored with math-verify extraction (LightEval's offline metric there is a whole-output exact
  match, which a reasoning trace never meets); several final answers are joined into one gold.
- HLE's LightEval metric is an OpenAI-judged one; here a sample counts as correct when its last
  "Answer:" line equals the gold answer (case and surrounding spaces ignored).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lighteval.tasks.lighteval_task import LightevalTaskConfig
    from lighteval.tasks.requests import Doc

MMLU_REDUX_SUBJECTS: tuple[str, ...] = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine",
    "college_physics", "computer_security", "conceptual_physics", "econometrics", "electrical_engineering",
    "elementary_mathematics", "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry",
    "high_school_computer_science", "high_school_european_history", "high_school_geography",
    "high_school_government_and_politics", "high_school_macroeconomics", "high_school_mathematics",
    "high_school_microeconomics", "high_school_physics", "high_school_psychology", "high_school_statistics",
    "high_school_us_history", "high_school_world_history", "human_aging", "human_sexuality",
    "international_law", "jurisprudence", "logical_fallacies", "machine_learning", "management", "marketing",
    "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition", "philosophy",
    "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy",
    "virology", "world_religions",
)  # fmt: skip

# Top-level task names; "mmlu_redux" stands for its 57 subject tasks "mmlu_redux:<subject>".
TASKS: tuple[str, ...] = (
    "aime24", "aime25", "amc23", "math_500", "olympiadbench", "gpqa_diamond", "mmlu_redux", "hle",
)  # fmt: skip


def _amc23_prompt(line: dict, task_name: str | None = None) -> "Doc":
    """math-ai/amc23 names the problem `question` and stores numeric answers: reuse LightEval's AIME prompt."""
    from lighteval.tasks.tasks.aime import aime_prompt

    return aime_prompt({"problem": line["question"], "answer": str(line["answer"])}, task_name)


def _olympiad_prompt(line: dict, task_name: str | None = None) -> "Doc":
    """LightEval's OlympiadBench prompt; its gold is the list `final_answer`, joined so pass@k sees one gold."""
    from lighteval.tasks.tasks.olympiade_bench import olympiad_bench_prompt

    doc = olympiad_bench_prompt(line, task_name or "")
    doc.choices = [", ".join(line["final_answer"])]
    return doc


_ANSWER_LINE = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)


def _hle_answer_matches(doc: "Doc", model_response) -> float:
    """1.0 when the last "Answer:" line of the output equals the gold (case-insensitive), else 0.0."""
    found = _ANSWER_LINE.findall(model_response.final_text[0])
    return float(bool(found) and found[-1].strip().lower() == doc.get_golds()[0].strip().lower())


def _pass_at_1(metric_name: str):
    """One of LightEval's pass@k metrics (a `Metrics` member name) at k=1."""
    from lighteval.metrics.metrics import Metrics

    return Metrics[metric_name](sample_params={"k": 1, "n": 1})


def _hle_pass_at_1():
    import numpy as np
    from lighteval.metrics.metrics_sample import PassAtK
    from lighteval.metrics.utils.metric_utils import SampleLevelMetric
    from lighteval.tasks.requests import SamplingMethod

    metric = SampleLevelMetric(
        metric_name="pass@k",
        sample_level_fn=PassAtK(sample_scoring_function=_hle_answer_matches),
        category=SamplingMethod.GENERATIVE,
        corpus_level_fn=np.mean,
        higher_is_better=True,
    )
    return metric(sample_params={"k": 1, "n": 1})


def task_configs() -> list["LightevalTaskConfig"]:
    """Every task of the suite, against its public dataset name; `load_suite` points them at local files.

    pass@1 metrics count one sample here; the run sets their n (`suites.loader.with_samples`).
    """
    from lighteval.metrics.metrics import Metrics
    from lighteval.tasks.lighteval_task import LightevalTaskConfig
    from lighteval.tasks.tasks.aime import aime_prompt
    from lighteval.tasks.tasks.gpqa import gpqa_instruct_prompt
    from lighteval.tasks.tasks.hle import hle_text_only
    from lighteval.tasks.tasks.math_500 import math_500_prompt
    from lighteval.tasks.tasks.mmlu_redux import mmlu_redux_2_prompt

    def task(name, prompt, repo, subset, split, metrics, generation_size=None, stop=()) -> LightevalTaskConfig:
        return LightevalTaskConfig(
            name=name,
            prompt_function=prompt,
            hf_repo=repo,
            hf_subset=subset,
            hf_avail_splits=[split],
            evaluation_splits=[split],
            few_shots_split=split,  # unused (zero-shot); naming it keeps LightEval from warning
            generation_size=generation_size,
            stop_sequence=list(stop),
            metrics=metrics,
        )

    math = [_pass_at_1("pass_at_k_math")]
    configs = [
        task("aime24", aime_prompt, "HuggingFaceH4/aime_2024", "default", "train", math),
        task("aime25", aime_prompt, "yentinglin/aime_2025", "default", "train", math),
        task("amc23", _amc23_prompt, "math-ai/amc23", "default", "test", math),
        task("math_500", math_500_prompt, "HuggingFaceH4/MATH-500", "default", "test", math, 32768),
        task("olympiadbench", _olympiad_prompt, "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", math),
        task(
            "gpqa_diamond", gpqa_instruct_prompt, "Idavidrein/gpqa", "gpqa_diamond", "train",
            [_pass_at_1("gpqa_instruct_pass_at_k")], 32768,
        ),
    ]  # fmt: skip
    configs += [
        task(
            f"mmlu_redux:{subject}", mmlu_redux_2_prompt(subject), "edinburgh-dawg/mmlu-redux-2.0", subject, "test",
            [Metrics.loglikelihood_acc, _pass_at_1("pass_at_k_letters")], 1, ["\n"],
        )
        for subject in MMLU_REDUX_SUBJECTS
    ]  # fmt: skip
    configs.append(task("hle", hle_text_only, "cais/hle", "default", "test", [_hle_pass_at_1()], 8192))
    return configs
