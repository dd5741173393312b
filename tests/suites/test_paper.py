"""The paper suite on small local fixture files in the public datasets' schemas, through the real pipeline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from adapters.base import Generation, Sampling
from suites import SuiteError
from suites.registry import load_suite

# Two rows per dataset, with the columns the public datasets have (and a reply that a model
# answering correctly in the prompt's requested format would give).
AIME24 = [
    {"id": 60, "problem": "Find the number of ways alpha.", "solution": "...", "answer": "204", "url": "u", "year": "2024"},
    {"id": 61, "problem": "Find the remainder beta.", "solution": "...", "answer": "25", "url": "u", "year": "2024"},
]
AIME25 = [
    {"id": "0", "problem": "Find the sum gamma.", "answer": "70", "url": "u", "year": 2025},
    {"id": "1", "problem": "Find the count delta.", "answer": "588", "url": "u", "year": 2025},
]
AMC23 = [
    {"id": 0, "question": "How many epsilon?", "answer": 27.0, "url": "u"},
    {"id": 1, "question": "What is zeta?", "answer": 3.0, "url": "u"},
]
MATH500 = [
    {"problem": "Compute eta: 1/2 + 1/4.", "solution": "Add: $\\frac12+\\frac14=\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}",
     "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
    {"problem": "Compute theta: 6 times 7.", "solution": "It is $\\boxed{42}$.", "answer": "42",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/2.json"},
]  # fmt: skip
OLYMPIAD = [
    {"id": 1606, "subfield": "Combinatorics", "context": None, "question": "Determine iota.", "solution": ["..."],
     "final_answer": ["$12$"], "is_multiple_answer": False, "unit": None, "answer_type": "Numerical", "error": None,
     "question_type": "Open-ended", "subject": "Math", "language": "English", "modality": "Text-only", "difficulty": "Competition"},
    {"id": 1607, "subfield": "Algebra", "context": None, "question": "Find kappa.", "solution": ["..."],
     "final_answer": ["$\\frac{1}{2}$"], "is_multiple_answer": False, "unit": None, "answer_type": "Numerical", "error": None,
     "question_type": "Open-ended", "subject": "Math", "language": "English", "modality": "Text-only", "difficulty": "Competition"},
]  # fmt: skip
GPQA = [
    {"Record ID": "r1", "Question": "Which lambda?", "Correct Answer": "right one", "Incorrect Answer 1": "wrong a",
     "Incorrect Answer 2": "wrong b", "Incorrect Answer 3": "wrong c", "Subdomain": "Physics"},
    {"Record ID": "r2", "Question": "Which mu?", "Correct Answer": "true mu", "Incorrect Answer 1": "false x",
     "Incorrect Answer 2": "false y", "Incorrect Answer 3": "false z", "Subdomain": "Chemistry"},
]  # fmt: skip
MMLU_ANATOMY = [
    {"question": "Which nu bone?", "choices": ["femur", "ulna", "tibia", "radius"], "answer": 0, "error_type": "ok",
     "source": "s", "correct_answer": None, "potential_reason": None},
    {"question": "Which xi organ?", "choices": ["heart", "lung", "liver", "skin"], "answer": 2, "error_type": "ok",
     "source": "s", "correct_answer": None, "potential_reason": None},
]  # fmt: skip
HLE = [
    {"id": "h1", "question": "What is omicron?", "image": "", "answer": "42", "answer_type": "exactMatch", "category": "Math"},
    {"id": "h2", "question": "What is pi in this picture?", "image": "data:image/png;base64,AAAA", "answer": "7",
     "answer_type": "exactMatch", "category": "Math"},
    {"id": "h3", "question": "Which rho?", "image": "", "answer": "B", "answer_type": "multipleChoice", "category": "Bio"},
]  # fmt: skip


def boxed(answer: str) -> str:
    return f"Reasoning...\nTherefore, the final answer is: $\\boxed{{{answer}}}$. I hope it is correct"


def gpqa_letter(prompt: str, correct: str) -> str:
    return re.search(rf"^([A-D])\) {re.escape(correct)}$", prompt, re.M).group(1)


def wrong_reply(right: str) -> str:
    """The same format with another answer: the next letter for letter answers, else 99991."""
    if re.search(r"(^|Answer: )[A-D]$", right):
        return right[:-1] + "BCDA"["ABCD".index(right[-1])]
    return "Answer: 99991\nTherefore, the final answer is: $\\boxed{99991}$."


REPLIES = (
    [(r["problem"], lambda p, r=r: boxed(r["answer"])) for r in AIME24 + AIME25]
    + [(r["question"], lambda p, r=r: boxed(str(int(r["answer"])))) for r in AMC23]
    + [(r["problem"], lambda p, r=r: f"ANSWER: {r['answer']}") for r in MATH500]
    + [(r["question"], lambda p, r=r: f"So the final answer is $\\boxed{{{r['final_answer'][0].strip('$')}}}$.") for r in OLYMPIAD]
    + [(r["Question"], lambda p, r=r: f"Thinking.\nAnswer: {gpqa_letter(p, r['Correct Answer'])}") for r in GPQA]
    + [(r["question"], lambda p, r=r: "ABCD"[r["answer"]]) for r in MMLU_ANATOMY]
    + [(r["question"], lambda p, r=r: f"Explanation: known.\nAnswer: {r['answer']}\nConfidence: 90%") for r in HLE]
)


class ReferenceAdapter:
    """Answers each fixture question correctly, in the format its prompt asks for; uniform logits."""

    spec = "test:reference"
    max_context = 4096

    def __init__(self, wrong: bool = False) -> None:
        from adapters.engine.tokenizer import char_tokenizer

        self.tokenizer = char_tokenizer()
        self.wrong = wrong  # then every reply is well-formed but wrong
        self.prompts: list[str] = []

    def generate(self, prompts, sampling: Sampling) -> list[Generation]:
        self.prompts += prompts
        replies = [next(reply(p) for needle, reply in REPLIES if needle in p) for p in prompts]
        if self.wrong:
            replies = [wrong_reply(r) for r in replies]
        return [
            Generation(token_ids=[], text=text, finish_reason="eos", prompt_tokens=len(p), generated_tokens=len(text))
            for p, text in zip(prompts, replies)
            for _ in range(sampling.n)
        ]

    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*input_ids.shape, len(self.tokenizer))  # every choice equally likely: ties go to "A"

    def memory(self) -> dict:
        return {}

    def describe(self) -> dict:
        return {}


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    def jsonl(name: str, rows: list[dict]) -> None:
        path = tmp_path / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    jsonl("aime24", AIME24)
    pd.DataFrame(AIME25).to_parquet(tmp_path / "aime25.parquet")
    jsonl("amc23", AMC23)
    jsonl("math_500", MATH500)
    jsonl("olympiadbench", OLYMPIAD)
    pd.DataFrame(GPQA).to_parquet(tmp_path / "gpqa_diamond.parquet")
    (tmp_path / "mmlu_redux").mkdir()
    pd.DataFrame(MMLU_ANATOMY).to_parquet(tmp_path / "mmlu_redux" / "anatomy.parquet")  # a list column in parquet
    jsonl("hle", HLE)
    return tmp_path


TASKS = ["aime24", "aime25", "amc23", "math_500", "olympiadbench", "gpqa_diamond", "mmlu_redux:anatomy", "hle"]


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


def test_paper_configs_follow_the_protocol(data_dir: Path):
    from harness.spec import PAPER_PROTOCOL
    from suites.loader import with_samples

    loaded = with_samples(load_suite("paper", tasks=TASKS, data_dir=data_dir), int(PAPER_PROTOCOL["n"]))
    configs = {c.name: c for c in loaded}
    assert list(configs) == TASKS
    assert configs["aime25"].hf_repo == str(data_dir / "aime25.parquet")
    assert configs["math_500"].generation_size == 32768
    assert [m.metric_name for m in configs["aime24"].metrics] == ["pass@k:k=1&n=4"]
    assert [m.metric_name for m in configs["mmlu_redux:anatomy"].metrics] == ["acc", "pass@k:k=1&n=4"]


def test_paper_suite_end_to_end_on_fixtures(data_dir: Path):
    from harness.bridge import LOGLIKELIHOOD_SAMPLE_INDEX, run_suite

    adapter = ReferenceAdapter()
    configs = load_suite("paper", tasks=TASKS, data_dir=data_dir)
    result = run_suite(adapter, configs, Sampling(n=2), progress=False)

    assert result.n_docs == {task: 2 for task in TASKS}  # HLE's image question is left out, as LightEval does
    assert not any("pi in this picture" in p for p in adapter.prompts)
    for task in TASKS:
        generative = [name for name in result.metrics[task] if name != "acc"]
        assert generative and all(result.metrics[task][name][0] == 1.0 for name in generative), (task, result.metrics[task])
    # Uniform logits: the log-likelihood pick is always "A", right for one of the two anatomy questions.
    assert result.metrics["mmlu_redux:anatomy"]["acc"][0] == 0.5
    assert result.metrics["mmlu_redux"]["acc"][0] == 0.5  # the group entry
    picks = sorted(v for (t, _, i), v in result.scores.items() if t == "mmlu_redux:anatomy" and i == LOGLIKELIHOOD_SAMPLE_INDEX)
    assert picks == [0.0, 1.0]
    generated = {k: v for k, v in result.scores.items() if k[2] != LOGLIKELIHOOD_SAMPLE_INDEX}
    assert len(generated) == 2 * 2 * len(TASKS) and set(generated.values()) == {1.0}


def test_paper_metrics_fail_wrong_answers(data_dir: Path):
    from harness.bridge import run_suite

    configs = load_suite("paper", tasks=TASKS, data_dir=data_dir)
    result = run_suite(ReferenceAdapter(wrong=True), configs, Sampling(n=1), limit=1, progress=False)
    for task in TASKS:
        assert all(value == 0.0 for name, (value, _) in result.metrics[task].items() if name != "acc"), task
