"""The `paper` suite: the ten benchmarks of the MELT paper's table, as LightEval defines them.

Prompt functions and metrics are LightEval's own, imported from the specific LightEval modules
that hold them (never through LightEval's default registry, which imports every task module and
downloads at import time). Each task names its public dataset (`hf_repo`, `hf_subset`, split);
nothing is downloaded: `load_suite("paper", data_dir=DIR)` reads local copies, one file per task,
`DIR/<task>.jsonl` or `DIR/<task>.parquet` holding the public split's rows unchanged, and for
MMLU-Redux one file per subject, `DIR/mmlu_redux/<subject>.jsonl`. Before anything runs, every file
is opened and checked for the columns in `COLUMNS` (numbers in a text column become text).

Each benchmark's headline is pass@1 averaged over n samples (LightEval's pass@k with k=1, the
unbiased estimator), where each sample is judged by the check LightEval uses for that benchmark:
math-verify extraction for the math sets, letter extraction for GPQA and MMLU-Redux.

Departures from LightEval (the one place they are listed; docs/reference.md's paper-suite section matches):
- AIME26 and AMC23 have no LightEval task; they use LightEval's AIME prompt and metric on
  `MathArena/aime_2026` and `math-ai/amc23` (whose answers are numbers, read as text).
- MATH-500: LightEval's prompt asks for a final line `ANSWER: $ANSWER`, which math-verify reads as
  the first number when the answer is bare LaTeX (`ANSWER: 3\\sqrt{13}` -> 3). A final `ANSWER:`
  line whose answer has no math delimiters is read as `\\boxed{answer}`.
- OlympiadBench keeps the English, text-only, open-ended maths subset (`OE_TO_maths_en_COMP`) and
  is scored with math-verify extraction (LightEval's offline metric there is a whole-output exact
  match, which a reasoning trace never meets). Each final answer is put in `$...$` when it has no
  math delimiters, and several are joined by ", ": bare, math-verify reads the list `1,3,5` as the
  decimal 1.3 and `1, 3, 5, 15` as its last number; in `$...$` it reads the set {1, 3, 5}.
- GPQA-Diamond and MMLU-Redux: the chosen letter is read by `answers.choice_letter` and handed to
  LightEval's letter metric as `Answer: X`; a reply that commits to no one letter is handed over empty
  (scored 0). LightEval alone takes the rightmost letter its patterns catch: it reads "The answer is
  not B.", "Answer: B, C, D, A" and four conflicting `Answer:` lines as B, reads letters inside the
  option text after `Answer: C)`, and fails `B)`. The rule and why: `suites/answers.py`.
- MMLU-Redux under the paper protocol is generative with room to reason (no 1-token limit, no
  newline stop: the run's max_new_tokens), scored by pass@1 over the letter; LightEval's
  log-likelihood accuracy is kept as its own metric, `loglikelihood_acc`, outside the headline.
- HumanEval has no LightEval task: the `openai_humaneval` prompt is asked for as a completed
  function, and each sample is executed against the item's tests in a sandbox (`suites.humaneval`,
  `suites.sandbox`); pass@1 is LightEval's pass@k estimator over those verdicts.
- HLE's LightEval metric is an OpenAI-judged one; offline, a sample is correct when every answer it
  gives (`answers.hle_answers`: the `Answer:` fields of HLE's response format, lines that begin
  `Answer:`; else what its last line states) is the gold under `answers.hle_equivalent`: equal as text
  after `hle_normalise` (`**`, `$`, `\\boxed{}`, `\\text{}` and quotes removed, whitespace runs collapsed,
  trailing `.,;:!?` dropped, case ignored), or, for a gold with a digit or LaTeX, under math-verify. On a
  multiple-choice item (its gold a letter) the answer must name that one letter (`answers.hle_letter`).
- MATH-500: a unary `\\pm X` in the gold or the reply is read as `0 \\pm X` (`answers.both_signs`):
  math-verify reads `\\pm 1` as 1 and fails on `\\pm\\frac{1}{2}`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from suites import answers, sandbox

if TYPE_CHECKING:
    from lighteval.metrics.utils.metric_utils import SampleLevelMetric
    from lighteval.models.model_output import ModelResponse
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
    "aime24", "aime25", "aime26", "amc23", "math_500", "olympiadbench", "gpqa_diamond", "mmlu_redux", "humaneval",
    "hle",
)  # fmt: skip
DEFAULT_TASKS = TASKS  # a run without --tasks evaluates all of them
# The name of every task config `task_configs` builds, in its order: names are checked against these before lighteval is imported.
CONFIG_NAMES: tuple[str, ...] = tuple(
    name
    for task in TASKS
    for name in ([f"mmlu_redux:{s}" for s in MMLU_REDUX_SUBJECTS] if task == "mmlu_redux" else [task])
)

# The columns each task's prompt and metric read, by top-level task (see `suites.loader.coerce_row`
# for the kinds): every local file is checked against them before a run starts.
_AIME = {"problem": "prompt", "answer": "text"}
COLUMNS: dict[str, dict[str, str]] = {
    "aime24": _AIME,
    "aime25": _AIME,
    "aime26": _AIME,
    "amc23": {"question": "prompt", "answer": "text"},
    "math_500": {"problem": "prompt", "solution": "text"},
    "olympiadbench": {
        "question": "prompt", "final_answer": "texts", "subject": "text", "language": "text", "unit": "text?",
        "is_multiple_answer": "flag", "answer_type": "text",
    },
    "gpqa_diamond": {
        "Question": "prompt", "Correct Answer": "text", "Incorrect Answer 1": "text", "Incorrect Answer 2": "text",
        "Incorrect Answer 3": "text",
    },
    "mmlu_redux": {"question": "prompt", "choices": "texts", "answer": "int"},
    "humaneval": {"task_id": "text", "prompt": "prompt", "canonical_solution": "text", "test": "text", "entry_point": "text"},
    "hle": {"question": "prompt", "answer": "text", "image": "text?"},
}  # fmt: skip


# Checks a task needs to pass before it runs: HumanEval refuses to start where the sandbox cannot be set up.
PREFLIGHT: dict[str, Callable[[], None]] = {"humaneval": sandbox.check_available}


# ------------------------------------------------------------------------------- answer extraction
_ANSWER_LINE_PREFIX = re.compile(r"(\s*(?:\*\*)?answer(?:\*\*)?\s*:\s*)(?:\*\*)?(.+?)(?:\*\*)?[\s.]*", re.I)
_MATH_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def boxed_final_answer(text: str) -> str:
    """`text` with its last line, when that is `ANSWER: <bare LaTeX>`, read as `ANSWER: \\boxed{<LaTeX>}`.

    math-verify reads undelimited LaTeX after "answer:" as its first number; the boxed form is
    parsed whole (and, being the last box, wins). Answers already in `$`, `\\(`, `\\[` or `\\boxed`
    and replies whose last line is something else are left alone.
    """
    head, newline, last = text.rstrip().rpartition("\n")
    match = _ANSWER_LINE_PREFIX.fullmatch(last)
    if match is None or any(delimiter in match.group(2) for delimiter in _MATH_DELIMITERS):
        return text
    return f"{head}{newline}{match.group(1)}\\boxed{{{match.group(2)}}}"


_MATH_DELIMITED = re.compile(r"^\s*(\$|\\\(|\\\[)")


def olympiad_gold(final_answers: list[str]) -> str:
    """OlympiadBench's final answers as one gold: each in `$...$` unless delimited, joined by ", "."""
    return ", ".join(a.strip() if _MATH_DELIMITED.match(a) else f"${a.strip()}$" for a in final_answers)


# ----------------------------------------------------------------------------------------- metrics
class _ReadPrediction:
    """A LightEval per-sample check that first rewrites each prediction (see the module docstring).

    It replaces the `compute_score` of LightEval's own `PassAtK`, so pass@k, its estimator and the
    bridge's per-sample scores all see the same reading of the sample.
    """

    def __init__(
        self, check: Callable[..., float], read: Callable[[Doc, str], str], gold: Callable[[str], str] | None = None
    ) -> None:
        self.check = check
        self.read = read
        self.gold = gold  # rewrites each gold too, where the reading must be the same on both sides

    def __call__(self, doc: Doc, model_response: ModelResponse) -> float:
        import copy

        from lighteval.models.model_output import ModelResponse

        texts = [self.read(doc, text) for text in model_response.final_text]
        if self.gold is not None:
            doc = copy.copy(doc)
            doc.choices = [self.gold(choice) for choice in doc.choices]
        return float(self.check(doc=doc, model_response=ModelResponse(text=texts)))


def _as_answer_letter(doc: Doc, text: str) -> str:
    """The reply as LightEval's letter metric should read it: `Answer: X`, or nothing when it commits to no letter."""
    letter = answers.choice_letter(text, len(doc.choices))
    return "" if letter is None else f"Answer: {letter}"


def _pass_at_1(
    metric_name: str, read: Callable[[Doc, str], str] | None = None, gold: Callable[[str], str] | None = None
) -> SampleLevelMetric:
    """One of LightEval's pass@k metrics (a `Metrics` member name) at k=1; the run sets its n."""
    from lighteval.metrics.metrics import Metrics

    metric: SampleLevelMetric = getattr(Metrics, metric_name)(sample_params={"k": 1, "n": 1})  # a fresh copy
    if read is not None:
        fn: Any = metric.sample_level_fn  # a pass@k computation, which LightEval types as any computation
        fn.compute_score = _ReadPrediction(fn.compute_score, read, gold)
    return metric


def _hle_matches(doc: Doc, model_response: ModelResponse) -> float:
    """1.0 when every answer the reply gives is the gold (`answers.hle_equivalent`; on a multiple-choice item, whose
    gold is a letter, when it names that one letter), else 0.0."""
    gold: str = doc.get_golds()[0]  # type: ignore[no-untyped-call]  # LightEval's Doc leaves it unannotated
    if re.fullmatch(r"[A-Z]", gold):
        return float(answers.hle_letter(model_response.final_text[0]) == gold)
    given = answers.hle_answers(model_response.final_text[0])
    return float(bool(given) and all(answers.hle_equivalent(answer, gold) for answer in given))


def custom_pass_at_1(check: Callable[[Doc, ModelResponse], float]) -> SampleLevelMetric:
    """LightEval's pass@k (k=1, its unbiased estimator over the run's n) around a per-sample check of ours."""
    import numpy as np
    from lighteval.metrics.metrics_sample import PassAtK
    from lighteval.metrics.utils.metric_utils import SampleLevelMetric
    from lighteval.tasks.requests import SamplingMethod

    metric = SampleLevelMetric(
        metric_name="pass@k",
        sample_level_fn=PassAtK(sample_scoring_function=check),
        category=SamplingMethod.GENERATIVE,
        corpus_level_fn=np.mean,
        higher_is_better=True,
    )
    fresh: SampleLevelMetric = metric(sample_params={"k": 1, "n": 1})
    return fresh


def _loglikelihood_acc() -> SampleLevelMetric:
    """LightEval's log-likelihood accuracy under a name that cannot pass for a generative score."""
    import copy

    from lighteval.metrics.metrics import Metrics

    member: Any = Metrics.loglikelihood_acc  # an Enum member at run time, which LightEval's annotations do not say
    metric: SampleLevelMetric = copy.deepcopy(member.value)
    metric.metric_name = "loglikelihood_acc"
    return metric


# ----------------------------------------------------------------------------------------- prompts
def _amc23_prompt(line: dict[str, Any], task_name: str | None = None) -> Doc:
    """math-ai/amc23 names the problem `question`: reuse LightEval's AIME prompt."""
    from lighteval.tasks.tasks.aime import aime_prompt

    doc: Doc = aime_prompt({"problem": line["question"], "answer": line["answer"]}, task_name or "")
    return doc


def _olympiad_prompt(line: dict[str, Any], task_name: str | None = None) -> Doc:
    """LightEval's OlympiadBench prompt; its gold is `olympiad_gold` of the list `final_answer`."""
    from lighteval.tasks.tasks.olympiade_bench import olympiad_bench_prompt

    doc: Doc = olympiad_bench_prompt(line, task_name or "")
    doc.choices = [olympiad_gold(line["final_answer"])]
    return doc


def task_configs() -> list[LightevalTaskConfig]:
    """Every task of the suite, against its public dataset name; `load_suite` points them at local files."""
    from lighteval.tasks.lighteval_task import LightevalTaskConfig
    from lighteval.tasks.tasks.aime import aime_prompt
    from lighteval.tasks.tasks.gpqa import gpqa_instruct_prompt
    from lighteval.tasks.tasks.hle import hle_text_only
    from lighteval.tasks.tasks.math_500 import math_500_prompt
    from lighteval.tasks.tasks.mmlu_redux import mmlu_redux_2_prompt

    from suites import humaneval

    def task(
        name: str,
        prompt: Callable[..., Doc],
        repo: str,
        subset: str,
        split: str,
        metrics: list[Any],
        generation_size: int | None = None,
    ) -> LightevalTaskConfig:
        return LightevalTaskConfig(
            name=name,
            prompt_function=prompt,
            hf_repo=repo,
            hf_subset=subset,
            hf_avail_splits=[split],
            evaluation_splits=[split],
            few_shots_split=split,  # unused (zero-shot); naming it keeps LightEval from warning
            generation_size=generation_size,
            stop_sequence=[],
            metrics=metrics,
        )

    math = [_pass_at_1("pass_at_k_math")]
    math_500 = [
        _pass_at_1("pass_at_k_math", lambda doc, text: answers.both_signs(boxed_final_answer(text)), answers.both_signs)
    ]
    gpqa = [_pass_at_1("gpqa_instruct_pass_at_k", _as_answer_letter)]
    mmlu = [_loglikelihood_acc(), _pass_at_1("pass_at_k_letters", _as_answer_letter)]
    configs = [
        task("aime24", aime_prompt, "HuggingFaceH4/aime_2024", "default", "train", math),
        task("aime25", aime_prompt, "yentinglin/aime_2025", "default", "train", math),
        task("aime26", aime_prompt, "MathArena/aime_2026", "default", "train", math),
        task("amc23", _amc23_prompt, "math-ai/amc23", "default", "test", math),
        task("math_500", math_500_prompt, "HuggingFaceH4/MATH-500", "default", "test", math_500, 32768),
        task("olympiadbench", _olympiad_prompt, "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", math),
        task("gpqa_diamond", gpqa_instruct_prompt, "Idavidrein/gpqa", "gpqa_diamond", "train", gpqa, 32768),
    ]  # fmt: skip
    configs += [
        task(f"mmlu_redux:{subject}", mmlu_redux_2_prompt(subject),  # type: ignore[no-untyped-call]
             "edinburgh-dawg/mmlu-redux-2.0", subject, "test", mmlu)
        for subject in MMLU_REDUX_SUBJECTS
    ]  # fmt: skip
    configs += [
        task("humaneval", humaneval.prompt, "openai/openai_humaneval", "openai_humaneval", "test",
             [custom_pass_at_1(humaneval.passes)]),
        task("hle", hle_text_only, "cais/hle", "default", "test", [custom_pass_at_1(_hle_matches)], 8192),
    ]  # fmt: skip
    return configs
