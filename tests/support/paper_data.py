"""Fixture data for the paper suite: a few rows per benchmark in the public datasets' layouts, and a
scripted adapter that answers them the way reasoning models write answers (right or wrong).

Not a test module: `test_paper*.py` import it, and the CLI test loads `ReferenceAdapter` as an
adapter plugin (`reference:right`, `reference:wrong`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from collections.abc import Callable

import pandas as pd
import torch

from adapters.base import Generation, Sampling
from suites.paper import MMLU_REDUX_SUBJECTS

AIME24 = [
    {
        "id": 60,
        "problem": "Find the number of ways alpha.",
        "solution": "...",
        "answer": "204",
        "url": "u",
        "year": "2024",
    },
    {"id": 61, "problem": "Find the remainder beta.", "solution": "...", "answer": "025", "url": "u", "year": "2024"},
]
AIME25 = [
    {"id": "0", "problem": "Find the sum gamma.", "answer": "70", "url": "u", "year": 2025},
    {"id": "1", "problem": "Find the count delta.", "answer": "588", "url": "u", "year": 2025},
]
AIME26 = [  # MathArena's layout: the answers are numbers, not strings
    {"problem_idx": 1, "problem": "Find the product aime26-one.", "answer": 277},
    {"problem_idx": 2, "problem": "Find the least aime26-two.", "answer": 62},
]
AMC23 = [
    {"id": 0, "question": "How many epsilon?", "answer": 27.0, "url": "u"},
    {"id": 1, "question": "What is zeta?", "answer": 3.0, "url": "u"},
]
MATH500 = [
    {"problem": "Compute eta: 1/2 + 1/4.", "solution": "Add: $\\frac12+\\frac14=\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}",
     "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
    {"problem": "Find the length theta.", "solution": "It is $\\sqrt{117}=\\boxed{3\\sqrt{13}}$.", "answer": "3\\sqrt{13}",
     "subject": "Geometry", "level": 3, "unique_id": "test/geometry/2.json"},
]  # fmt: skip


def _olympiad(row_id: int, question: str, final_answer: list[str], multiple: bool) -> dict:
    return {
        "id": row_id, "subfield": "Algebra", "context": None, "question": question, "solution": ["..."],
        "final_answer": final_answer, "is_multiple_answer": multiple, "unit": None, "answer_type": "Numerical",
        "error": None, "question_type": "Open-ended", "subject": "Math", "language": "English",
        "modality": "Text-only", "difficulty": "Competition",
    }  # fmt: skip


OLYMPIAD = [
    _olympiad(1606, "Determine iota.", ["$12$"], False),
    _olympiad(1607, "Find kappa.", ["$\\frac{1}{2}$"], False),
    _olympiad(1608, "Find all odd divisors omega-one.", ["1,3,5"], True),
    _olympiad(1609, "Find both prices omega-two.", ["2500,7500"], True),
    _olympiad(1610, "Find every divisor omega-three.", ["1, 3, 5, 15"], True),
]
GPQA = [
    {"Record ID": "r1", "Question": "Which lambda?", "Correct Answer": "A wave of type B in region D", "Incorrect Answer 1": "wrong a",
     "Incorrect Answer 2": "wrong b", "Incorrect Answer 3": "wrong c", "Subdomain": "Physics"},
    {"Record ID": "r2", "Question": "Which mu?", "Correct Answer": "true mu", "Incorrect Answer 1": "false x",
     "Incorrect Answer 2": "false y", "Incorrect Answer 3": "false z", "Subdomain": "Chemistry"},
]  # fmt: skip


def mmlu_rows(subject: str) -> list[dict]:
    """Two questions per subject, the second with its answer index stored as a string (as some copies do)."""
    return [
        {"question": f"Which nu of {subject}?", "choices": ["femur", "ulna", "tibia", "radius"], "answer": 1,
         "error_type": "ok", "source": "s", "correct_answer": None, "potential_reason": None},
        {"question": f"Which xi of {subject}?", "choices": ["heart", "lung", "liver", "skin"], "answer": 2,
         "error_type": "ok", "source": "s", "correct_answer": None, "potential_reason": None},
    ]  # fmt: skip


HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n'
                  '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
                  '    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n'
                  '    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n',
        "canonical_solution": "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n"
                              "            if idx != idx2:\n                distance = abs(elem - elem2)\n"
                              "                if distance < threshold:\n                    return True\n\n    return False\n",
        "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
                "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
                "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
                "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n"
                "    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True\n",
        "entry_point": "has_close_elements",
    },
    {
        "task_id": "HumanEval/2",
        "prompt": '\n\ndef truncate_number(number: float) -> float:\n    """ Given a positive floating point number, it can be '
                  'decomposed into\n    and integer part (largest integer smaller than given number) and decimals\n'
                  '    (leftover part always smaller than 1).\n\n    Return the decimal part of the number.\n'
                  '    >>> truncate_number(3.5)\n    0.5\n    """\n',
        "canonical_solution": "    return number % 1.0\n",
        "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
                "    assert candidate(3.5) == 0.5\n    assert abs(candidate(1.33) - 0.33) < 1e-6\n"
                "    assert abs(candidate(123.456) - 0.456) < 1e-6\n",
        "entry_point": "truncate_number",
    },
]  # fmt: skip
HLE = [
    {"id": "h1", "question": "What is omicron?", "image": "", "answer": "42", "answer_type": "exactMatch", "category": "Math"},
    {"id": "h2", "question": "What is pi in this picture?", "image": "data:image/png;base64,AAAA", "answer": "7",
     "answer_type": "exactMatch", "category": "Math"},
    {"id": "h3", "question": "Which rho?", "image": None, "answer": "B", "answer_type": "multipleChoice", "category": "Bio"},
    {"id": "h4", "question": "Name the sigma city.", "image": "", "answer": "Paris", "answer_type": "exactMatch", "category": "Geo"},
    {"id": "h5", "question": "What is tau?", "image": "", "answer": "x^2", "answer_type": "exactMatch", "category": "Math"},
]  # fmt: skip

# The ten benchmarks: task name -> (file name, rows); mmlu_redux is one file per subject.
FILES: dict[str, tuple[str, list[dict]]] = {
    "aime24": ("aime24.jsonl", AIME24),
    "aime25": ("aime25.parquet", AIME25),
    "aime26": ("aime26.jsonl", AIME26),
    "amc23": ("amc23.jsonl", AMC23),
    "math_500": ("math_500.jsonl", MATH500),
    "olympiadbench": ("olympiadbench.parquet", OLYMPIAD),
    "gpqa_diamond": ("gpqa_diamond.parquet", GPQA),
    "humaneval": ("humaneval.jsonl", HUMANEVAL),
    "hle": ("hle.jsonl", HLE),
}


def write_rows(path: Path, rows: list[dict]) -> None:
    """JSONL or parquet by suffix, as `datasets.Dataset.to_json` / `to_parquet` would write them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_data_dir(root: Path, subjects: tuple[str, ...] = MMLU_REDUX_SUBJECTS) -> Path:
    """All ten benchmarks under `root` (MMLU-Redux: one parquet file per subject, list columns in parquet)."""
    for name, rows in FILES.values():
        write_rows(root / name, rows)
    for subject in subjects:
        write_rows(root / "mmlu_redux" / f"{subject}.parquet", mmlu_rows(subject))
    return root


# --------------------------------------------------------------------------------------- replies
def boxed(answer: str) -> str:
    return f"<think>Let me work it out.</think>\nTherefore, the final answer is: $\\boxed{{{answer}}}$. I hope it is correct"


def _gpqa_letter(prompt: str, correct: str) -> str:
    return re.search(rf"^([A-D])\) {re.escape(correct)}$", prompt, re.M).group(1)


MMLU_FORMS: tuple[Callable[[str], str], ...] = (
    lambda x: f" {x}",  # the first token after "Answer: ", as a 1-token model would write it
    lambda x: f"<think>\nA looks tempting, C is out.\n</think>\n\nAnswer: {x}",
    lambda x: f"({x})",
    lambda x: f"{x})",
    lambda x: f"**{x}**",
    lambda x: f"Comparing the options, A is too broad and so the answer is {x}.",
    lambda x: f"<think>\nChecking each option in turn.\n</think>\n\n{x}. This option fits, because A and C do not.",
)
HLE_FORMS = {"42": "**42**.", "B": "$B$", "Paris": "  paris. ", "x^2": "$x^2$"}


def _mmlu_reply(prompt: str, wrong: bool) -> str:
    row = next(r for s in MMLU_REDUX_SUBJECTS for r in mmlu_rows(s) if r["question"] in prompt)
    letter = "ABCD"[(row["answer"] + wrong) % 4]
    return MMLU_FORMS[(len(prompt) + wrong) % len(MMLU_FORMS)](letter)


def _humaneval_reply(row: dict, wrong: bool) -> str:
    if wrong:
        return "```python\n" + row["prompt"].lstrip() + "    return None\n```"
    if row["task_id"] == "HumanEval/0":
        return row["canonical_solution"]  # a plain completion of the prompt
    return f"<think>modulo 1</think>\nHere it is:\n```python\n{row['prompt'].lstrip()}{row['canonical_solution']}```\n"


def reply(prompt: str, wrong: bool = False) -> str:
    """What a reasoning model that knows (or gets wrong) the fixture answer writes, in real-world forms."""
    for row in AIME24 + AIME25 + AIME26:
        if row["problem"] in prompt:
            return boxed("99991" if wrong else str(row["answer"]))
    for row in AMC23:
        if row["question"] in prompt:
            return boxed("99991" if wrong else str(int(row["answer"])))
    for row in MATH500:
        if row["problem"] in prompt:
            return f"We simplify.\nANSWER: {'3' if wrong else row['answer']}"
    for row, bad in zip(OLYMPIAD, ["13", "\\frac{1}{3}", "1.3", "7500", "15"]):
        if row["question"] in prompt:
            return f"So the final answer is $\\boxed{{{bad if wrong else row['final_answer'][0].strip('$')}}}$."
    for row in GPQA:
        if row["Question"] in prompt:
            letter = _gpqa_letter(prompt, row["Correct Answer"])
            letter = "BCDA"["ABCD".index(letter)] if wrong else letter
            option = re.search(rf"^{letter}\) (.*)$", prompt, re.M).group(1)
            return f"Thinking it through.\nAnswer: {letter}) {option}"
    for row in HUMANEVAL:
        if row["prompt"].strip() in prompt:
            return _humaneval_reply(row, wrong)
    for row in HLE:
        if row["question"] in prompt:
            answer = "41" if wrong else HLE_FORMS[row["answer"]]
            return f"Explanation: known.\nAnswer: {answer}\nConfidence: 90%"
    return _mmlu_reply(prompt, wrong)


class ReferenceAdapter:
    """Answers each fixture question (right, or wrong when `wrong`) in a form real models write; uniform logits."""

    max_context = 4096

    def __init__(self, wrong: bool = False) -> None:
        from adapters.engine.io.tokenizer import char_tokenizer

        self.spec = f"reference:{'wrong' if wrong else 'right'}"
        self.tokenizer = char_tokenizer()
        self.wrong = wrong
        self.prompts: list[str] = []

    def generate(self, prompts, sampling: Sampling) -> list[Generation]:
        self.prompts += prompts
        return [
            Generation(token_ids=[], text=text, finish_reason="eos", prompt_tokens=len(p), generated_tokens=len(text))
            for p in prompts
            for text in [reply(p, self.wrong)]
            for _ in range(sampling.n)
        ]

    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*input_ids.shape, len(self.tokenizer))  # every choice equally likely: ties go to "A"

    def memory(self) -> dict:
        return {}

    def describe(self) -> dict:
        return {}
