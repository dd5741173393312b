"""The paper suite on small local fixture files in the public datasets' layouts, through the real pipeline.

Every scoring case the suite was found to get wrong on real data is checked here with LightEval's
own metric objects as the suite configures them: right answers in the forms reasoning models write
score 1, wrong ones 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lighteval.models.model_output import ModelResponse

from adapters.base import Sampling
from paper_data import AIME26, GPQA, HLE, MATH500, OLYMPIAD, ReferenceAdapter, mmlu_rows, write_data_dir, write_rows
from suites import SuiteError, paper
from suites.loader import with_samples
from suites.registry import load_suite

SUBJECTS = ("anatomy", "virology")
TASKS = ["aime24", "aime25", "aime26", "amc23", "math_500", "olympiadbench", "gpqa_diamond",
         "mmlu_redux:anatomy", "mmlu_redux:virology", "humaneval", "hle"]  # fmt: skip


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    return write_data_dir(tmp_path / "data", SUBJECTS)


def configured(task: str, row: dict):
    """The doc the task's real prompt function makes of `row`, and the task's pass@1 over one sample."""
    (config,) = with_samples([c for c in paper.task_configs() if c.name == task], 1)
    metric = next(m for m in config.metrics if m.metric_name != "loglikelihood_acc")
    return config.prompt_function(row, task), metric.sample_level_fn


def verdict(task: str, row: dict, reply: str) -> float:
    doc, fn = configured(task, row)
    return fn.compute(doc=doc, model_response=ModelResponse(text=[reply]))


@pytest.mark.parametrize(
    ("final_answer", "reply", "expected"),
    [
        ("1,3,5", r"So the final answer is $\boxed{1,3,5}$.", 1.0),
        ("1,3,5", r"So the final answer is $\boxed{1, 3, 5}$.", 1.0),
        ("1,3,5", r"So the final answer is $\boxed{1.3}$.", 0.0),
        ("1,3,5", r"So the final answer is $\boxed{5}$.", 0.0),
        ("2500,7500", r"So the final answer is $\boxed{2500, 7500}$.", 1.0),
        ("2500,7500", r"So the final answer is $\boxed{2500.75}$.", 0.0),
        ("2500,7500", r"So the final answer is $\boxed{7500}$.", 0.0),
        ("1, 3, 5, 15", r"So the final answer is $\boxed{1,3,5,15}$.", 1.0),
        ("1, 3, 5, 15", r"So the final answer is $\boxed{15}$.", 0.0),
        ("$12$", r"So the final answer is $\boxed{12}$.", 1.0),
        ("$1,000$", r"So the final answer is $\boxed{1000}$.", 1.0),
    ],
)
def test_olympiadbench_comma_lists_are_sets(final_answer: str, reply: str, expected: float):
    row = {**OLYMPIAD[0], "final_answer": [final_answer], "is_multiple_answer": "," in final_answer}
    assert verdict("olympiadbench", row, reply) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("B", 1.0), (" B", 1.0), ("(B)", 1.0), ("B)", 1.0), ("Answer: B", 1.0), ("**B**", 1.0), ("B.", 1.0),
        ("<think>\nMaybe A. No: C fails, so\n</think>\n\nAnswer: B", 1.0), ("**Answer:** (B)", 1.0),
        ("A is wrong since ulna... the answer is B.", 1.0), ("$\\boxed{B}$", 1.0),
        (" C", 0.0), ("<think>", 0.0), ("Answer: A", 0.0), ("Both are possible.", 0.0),
    ],
)  # fmt: skip
def test_mmlu_redux_reads_the_letter_in_every_form(reply: str, expected: float):
    assert verdict("mmlu_redux:anatomy", mmlu_rows("anatomy")[0], reply) == expected  # gold: B (index 1)


def test_gpqa_answer_with_option_text_is_that_letter():
    doc, fn = configured("gpqa_diamond", GPQA[0])  # the correct option's text holds other letters
    right, wrong = "ABCD"[doc.gold_index], "ABCD"[(doc.gold_index + 1) % 4]
    wrong_text = doc.query.split(f"\n{wrong}) ")[1].split("\n")[0]
    for reply, expected in [
        (f"Reasoning.\nAnswer: {right}) A wave of type B in region D", 1.0),
        (f"Reasoning.\nAnswer: **{right}**", 1.0),
        (f"Reasoning.\nAnswer: {wrong}) {wrong_text}", 0.0),
    ]:
        assert fn.compute(doc=doc, model_response=ModelResponse(text=[reply])) == expected, reply


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Step.\nANSWER: 3\\sqrt{13}", 1.0), ("Step.\nANSWER: $3\\sqrt{13}$", 1.0), ("Step.\n**ANSWER:** 3\\sqrt{13}.", 1.0),
        ("It is $\\boxed{3\\sqrt{13}}$.", 1.0), ("ANSWER: \\sqrt{117}", 1.0),
        ("Step.\nANSWER: 3", 0.0), ("Step.\nANSWER: 3\\sqrt{12}", 0.0), ("Step.\nANSWER: 13", 0.0),
    ],
)  # fmt: skip
def test_math_500_reads_the_whole_final_answer_line(reply: str, expected: float):
    assert verdict("math_500", MATH500[1], reply) == expected  # gold: 3\sqrt{13}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("42", 1.0), ("42.", 1.0), ("**42**", 1.0), ("$42$", 1.0), ("  42 !", 1.0), ("421", 0.0), ("4 2", 0.0), ("", 0.0)],
)
def test_hle_offline_rule_normalises_the_answer(answer: str, expected: float):
    assert verdict("hle", HLE[0], f"Explanation: x.\nAnswer: {answer}\nConfidence: 80%") == expected
    assert verdict("hle", HLE[3], "Explanation: x.\nAnswer: **The city of paris**") == 0.0
    assert verdict("hle", HLE[3], "Explanation: x.\n**Answer:** $PARIS$.") == 1.0


def test_paper_needs_local_copies_and_names_the_missing_file(tmp_path: Path):
    with pytest.raises(SuiteError, match=r"pass --data-dir DIR .*aime24\.jsonl.*HuggingFaceH4/aime_2024"):
        load_suite("paper")
    with pytest.raises(SuiteError) as info:
        load_suite("paper", tasks=["gpqa_diamond"], data_dir=tmp_path)
    message = str(info.value)
    assert "Idavidrein/gpqa (subset gpqa_diamond, split train)" in message
    assert str(tmp_path / "gpqa_diamond.jsonl") in message and str(tmp_path / "gpqa_diamond.parquet") in message
    assert "\n" not in message
    with pytest.raises(SuiteError, match=r"mmlu_redux/abstract_algebra\.jsonl"):
        load_suite("paper", tasks=["mmlu_redux"], data_dir=tmp_path)  # the group needs every subject


@pytest.mark.parametrize(
    ("task", "name", "rows", "expected"),
    [
        ("aime26", "aime26.jsonl", [{"problem_idx": 1, "question": "no problem column", "answer": 3}],
         r"aime26\.jsonl has no column 'problem' \(it has problem_idx, question, answer\); copy the 'train' split of MathArena/aime_2026"),
        ("mmlu_redux:anatomy", "mmlu_redux/anatomy.jsonl", [{**mmlu_rows("anatomy")[0], "answer": "B"}],
         r"anatomy\.jsonl row 1, column 'answer': expected an integer, got str 'B'; copy the 'test' split of edinburgh-dawg/mmlu-redux-2.0 \(subset anatomy\)"),
        ("hle", "hle.jsonl", [{**HLE[0], "answer": None}], r"hle\.jsonl row 1, column 'answer': expected text, got NoneType"),
    ],
)  # fmt: skip
def test_data_files_are_checked_before_anything_runs(tmp_path: Path, task: str, name: str, rows: list, expected: str):
    write_rows(tmp_path / name, rows)
    with pytest.raises(SuiteError, match=expected) as info:
        load_suite("paper", tasks=[task], data_dir=tmp_path)
    assert "\n" not in str(info.value)


def test_numeric_answers_are_read_as_text(data_dir: Path):
    (config,) = load_suite("paper", tasks=["aime26"], data_dir=data_dir)
    doc = config.prompt_function(AIME26[0], "aime26")
    assert doc.choices == ["277"]


def test_paper_configs_follow_the_protocol(data_dir: Path):
    assert paper.TASKS == ("aime24", "aime25", "aime26", "amc23", "math_500", "olympiadbench", "gpqa_diamond",
                           "mmlu_redux", "humaneval", "hle")  # fmt: skip
    from adapters.base import PAPER_PROTOCOL
    from suites.loader import with_samples

    loaded = with_samples(load_suite("paper", tasks=TASKS, data_dir=data_dir), PAPER_PROTOCOL.n)
    configs = {c.name: c for c in loaded}
    assert list(configs) == TASKS
    assert configs["aime25"].hf_repo == str(data_dir / "aime25.parquet")
    assert configs["math_500"].generation_size == 32768
    assert [m.metric_name for m in configs["aime26"].metrics] == ["pass@k:k=1&n=4"]
    # MMLU-Redux under the paper protocol: generative with room to reason, log-likelihood kept apart.
    mmlu = configs["mmlu_redux:anatomy"]
    assert [m.metric_name for m in mmlu.metrics] == ["loglikelihood_acc", "pass@k:k=1&n=4"]
    assert mmlu.generation_size is None and list(mmlu.stop_sequence or []) == []


def test_paper_suite_end_to_end_on_fixtures(data_dir: Path):
    from harness.evaluation import run_suite
    from harness.lighteval_model import LOGLIKELIHOOD_SAMPLE_INDEX

    adapter = ReferenceAdapter()
    configs = load_suite("paper", tasks=TASKS, data_dir=data_dir)
    result = run_suite(adapter, configs, Sampling(n=2), progress=False)

    expected_docs = {task: 2 for task in TASKS} | {"olympiadbench": len(OLYMPIAD), "hle": len(HLE) - 1}
    assert result.n_docs == expected_docs  # HLE's image question is left out, as LightEval does
    assert not any("pi in this picture" in p for p in adapter.prompts)
    for task in TASKS:
        generative = [name for name in result.metrics[task] if name != "loglikelihood_acc"]
        assert generative and all(result.metrics[task][name][0] == 1.0 for name in generative), (task, result.metrics[task])
    # Uniform logits: the log-likelihood pick is always "A", right for neither fixture question.
    assert result.metrics["mmlu_redux"]["loglikelihood_acc"][0] == 0.0
    assert result.metrics["all"] == {"pass@1": (1.0, None)}  # the suite mean of the generative headlines only
    picks = [v for (t, _, i), v in result.scores.items() if t == "mmlu_redux:anatomy" and i == LOGLIKELIHOOD_SAMPLE_INDEX]
    assert picks == [0.0, 0.0]
    generated = {k: v for k, v in result.scores.items() if k[2] != LOGLIKELIHOOD_SAMPLE_INDEX}
    assert len(generated) == 2 * sum(expected_docs.values()) and set(generated.values()) == {1.0}


def test_paper_metrics_fail_wrong_answers(data_dir: Path):
    from harness.evaluation import run_suite

    configs = load_suite("paper", tasks=TASKS, data_dir=data_dir)
    result = run_suite(ReferenceAdapter(wrong=True), configs, Sampling(n=1), progress=False)
    for task in TASKS:
        assert all(value == 0.0 for name, (value, _) in result.metrics[task].items() if name != "loglikelihood_acc"), (
            task, result.metrics[task])
