"""Replies written the way reasoning models write them, scored through the paper suite's real metrics, both ways.

Each table holds, per benchmark, replies in the three styles the looped and reference models write:
- Qwen3: its reasoning, then `</think>` (the opening `<think>` sometimes in the prompt, not the reply), then an
  answer with its explanation, often `**Answer: B**` or an option line `B. <option>` over a paragraph of why;
- DeepSeek-R1-style: `<think> ... </think>`, then a final answer, often `**Answer: B**` or
  "The answer is \\boxed{B}", sometimes an `### Approach` / `### Solution Code` layout for code;
- Ouro-Thinking: `<think> ... </think>`, then a short conclusion ("Therefore, the correct answer is B.") or a
  `**Final Answer**` header over display maths (`\\[ \\boxed{B} \\]`).
A right answer in any of these forms scores 1; a wrong, hedged or negated one, a right answer only in the reasoning,
and a wrong committed answer that later mentions the right one score 0.
"""

from __future__ import annotations

import pytest
from lighteval.models.model_output import ModelResponse

from suites import humaneval, sandbox
from tests.suites.test_paper import _mc_case, verdict
from tests.support.paper_data import HLE, HUMANEVAL, MATH500

REASONING = "<think>\nOkay, let me look at each option. A is the femur, a thigh bone. C is the tibia. B is the ulna.\n</think>\n\n"

# Multiple choice (MMLU-Redux and GPQA): the right option is B.
MC_RIGHT = {
    "qwen3-option-line-explained": REASONING + "B. ulna\n\nThe ulna is the forearm bone, because it forms the elbow "
    "with the humerus; A (femur) and C (tibia) are leg bones.",
    "qwen3-option-line-one-line": REASONING + "B. The ulna, because it runs along the forearm, unlike A and C.",
    "qwen3-option-line-no-think": "B. The ulna is right because it is in the forearm.\n\nA and C are in the leg.",
    "qwen3-prompt-opened-think": "Okay, A is the femur, so not A. The ulna fits.\n</think>\n\n**Answer: B**",
    "qwen3-bold-option-line": REASONING + "**B. ulna**\n\nThe femur (A) is in the thigh; the ulna is in the forearm.",
    "qwen3-correct-answer-bold": REASONING + "The correct answer is **B. ulna**.\n\nExplanation: the femur is A.",
    "qwen3-revised-to-right": REASONING + "Answer: A\n\nWait, the femur is a thigh bone and the question asks for "
    "the forearm. Correction:\n\nAnswer: B",
    "deepseek-bold-answer": "<think>\nAlright, the femur is A... wait, no, the forearm. I think it's B.\n</think>\n\n"
    "The ulna is one of the two forearm bones.\n\n**Answer: B**",
    "deepseek-boxed": REASONING + "The ulna is a bone of the forearm.\n\nThe answer is \\boxed{B}.",
    "deepseek-boxed-header": REASONING + "**Final Answer**\n\\boxed{B}",
    "deepseek-walk-then-answer": REASONING + "- **A. femur**: a thigh bone.\n- **B. ulna**: a forearm bone.\n"
    "- **C. tibia**: a leg bone.\n\n**Answer: B**",
    "deepseek-revised-in-prose": REASONING + "The answer is A. Wait, A is a thigh bone; actually, the answer is B.",
    "ouro-conclusion": "<think>\nThe ulna is in the forearm, so the answer is B.\n</think>\n\n"
    "Therefore, the correct answer is B.",
    "ouro-display-boxed": REASONING + "**Final Answer**\n\\[\n\\boxed{B}\n\\]",
    "ouro-option-line": REASONING + "B. ulna. It is the bone because it forms the elbow joint; D is the radius.",
    "ouro-parenthesised": "<think>\nA: femur, thigh. B: ulna, forearm. C: tibia, leg.\n</think>\n\nThe answer is (B).",
}
MC_WRONG = {
    "qwen3-wrong-line-mentions-right": REASONING + "A. femur\n\nThe femur is the longest bone, unlike B, the ulna, "
    "which is in the forearm.",
    "qwen3-wrong-one-line-mentions-right": REASONING + "A. The femur, because B is too short.",
    "qwen3-right-only-in-thinking": "<think>\nThe answer is B.\n</think>\n\n**Answer: C**",
    "qwen3-hedged": REASONING + "The answer is maybe A or C.",
    "qwen3-revised-to-wrong": REASONING + "Answer: B\n\nWait, the question asks for the leg. Correction:\n\nAnswer: A",
    "deepseek-either": "<think>\nI'm torn between B and D.\n</think>\n\nIt's either B or D; I cannot decide.",
    "deepseek-boxed-wrong": REASONING + "The answer is \\boxed{D}.",
    "deepseek-negated": REASONING + "**Answer: not B**",
    "deepseek-wrong-then-explains-right": REASONING + "**Answer: A**\n\nExplanation: the femur... B (the ulna) is a "
    "forearm bone.",
    "deepseek-probably": REASONING + "The answer is probably B.",
    "deepseek-revised-away": REASONING + "The answer is B. Wait, on second thought, the answer is D.",
    "ouro-unfinished-thinking": "<think>\nLet me see, B is the ulna, so the answer is B",
    "ouro-conclusion-wrong": REASONING + "Therefore, the correct answer is C.",
    "ouro-wrong-option-line": REASONING + "A. femur. The femur is the bone, because B is the ulna of the forearm.",
    "ouro-boxed-list": REASONING + "**Final Answer**\n\\[\n\\boxed{B, D}\n\\]",
    "ouro-revision-hedged": REASONING + "Answer: B. Hmm, maybe C.",
}


@pytest.mark.parametrize("task", ["mmlu_redux:anatomy", "gpqa_diamond"])
@pytest.mark.parametrize(
    ("reply", "expected"),
    [pytest.param(r, 1.0, id=f"right-{k}") for k, r in MC_RIGHT.items()]
    + [pytest.param(r, 0.0, id=f"wrong-{k}") for k, r in MC_WRONG.items()],
)
def test_multiple_choice_replies_in_model_styles(task: str, reply: str, expected: float):
    doc, fn = _mc_case(task)
    assert fn.compute(doc=doc, model_response=ModelResponse(text=[reply])) == expected


def _hle(gold: str) -> dict:
    return {**HLE[0], "answer": gold}


FIELDS = "Explanation: worked out above.\nAnswer: {}\nConfidence: 85%"
# HLE: (gold, reply). Judged by equivalence (math-verify for a gold with digits or LaTeX), not string equality.
HLE_RIGHT = {
    "qwen3-boxed-in-field": ("42", REASONING + FIELDS.format("\\boxed{42}")),
    "qwen3-latex-fraction": ("3/4", REASONING + FIELDS.format("$\\frac{3}{4}$")),
    "qwen3-decimal-for-fraction": ("3/4", REASONING + FIELDS.format("0.75")),
    "qwen3-unit-spelled": ("12 cm", REASONING + FIELDS.format("12 centimeters")),
    "qwen3-quoted-word": ("Paris", REASONING + FIELDS.format('"Paris"')),
    "deepseek-unit-in-latex": ("12 cm", REASONING + FIELDS.format("$12\\,\\text{cm}$")),
    "deepseek-x-equals": ("3", REASONING + FIELDS.format("x = 3")),
    "deepseek-dfrac-bold": ("3/4", REASONING + "Explanation: x.\n**Answer:** $\\boxed{\\dfrac{3}{4}}$"),
    "deepseek-two-fields": ("42", REASONING + FIELDS.format("42") + "\n\n**Final Answer:** $\\boxed{42}$"),
    "deepseek-fraction-and-decimal-fields": ("3/4", REASONING + "Answer: 0.75\n\nFinal Answer: \\frac{3}{4}"),
    "ouro-prose-sentence": ("42", REASONING + "Multiplying 6 by 7 gives the product, so the answer is 42."),
    "ouro-prose-word": ("Paris", REASONING + "The capital in question is Paris."),
    "ouro-display-boxed": ("42", REASONING + "**Final Answer**\n\\[\n\\boxed{42}\n\\]"),
    "ouro-boxed-word": ("Paris", REASONING + "Answer: \\boxed{\\text{Paris}}"),
    "ouro-boxed-pm": ("\\pm 2", REASONING + FIELDS.format("$x = \\pm 2$")),
    "ouro-name-with-number": ("Apollo 11", REASONING + FIELDS.format("**apollo 11**")),
    "ouro-sentence-in-field": ("42", REASONING + FIELDS.format("The answer is 42.")),
    "qwen3-word-sentence-in-field": ("Paris", REASONING + "**Answer:** The capital in question is Paris."),
    "qwen3-rate-unit": ("9.8 m/s^2", REASONING + FIELDS.format("$9.8\\,\\text{m/s}^2$")),
}
HLE_WRONG = {
    "qwen3-boxed-in-field": ("42", REASONING + FIELDS.format("\\boxed{41}")),
    "qwen3-wrong-fraction": ("3/4", REASONING + FIELDS.format("$\\frac{4}{3}$")),
    "qwen3-near-decimal": ("3/4", REASONING + FIELDS.format("0.7")),
    "qwen3-wrong-number-unit": ("12 cm", REASONING + FIELDS.format("13 centimeters")),
    "qwen3-quoted-wrong-word": ("Paris", REASONING + FIELDS.format('"Lyon"')),
    "qwen3-anagram": ("Paris", REASONING + FIELDS.format("Sirap")),
    "deepseek-x-equals-wrong": ("3", REASONING + FIELDS.format("x = 4")),
    "deepseek-hedged": ("42", REASONING + FIELDS.format("42 or 41")),
    "deepseek-maybe": ("42", REASONING + FIELDS.format("maybe 42")),
    "deepseek-negated": ("42", REASONING + FIELDS.format("not 42")),
    "deepseek-fields-disagree": ("42", REASONING + FIELDS.format("42") + "\n\n**Final Answer:** $\\boxed{41}$"),
    "deepseek-right-only-in-thinking": ("42", "<think>\nAnswer: 42\n</think>\n\n" + FIELDS.format("41")),
    "ouro-prose-wrong": ("42", REASONING + "Multiplying 6 by 7 gives the product, so the answer is 41."),
    "ouro-prose-retracted": ("42", REASONING + "I believe the answer: 42 is wrong; it is 41."),
    "ouro-unfinished-thinking": ("42", "<think>\nSo the answer is 42"),
    "ouro-one-sign": ("\\pm 2", REASONING + FIELDS.format("$x = 2$")),
    "ouro-sentence-in-field-wrong": ("42", REASONING + FIELDS.format("The answer is 41.")),
    "qwen3-word-sentence-in-field-wrong": ("Paris", REASONING + "**Answer:** The capital in question is Lyon."),
    "ouro-other-name-same-number": ("Apollo 11", REASONING + FIELDS.format("Gemini 11")),
    "qwen3-number-among-words": ("11", REASONING + FIELDS.format("Gemini 11")),
}


@pytest.mark.parametrize(
    ("gold", "reply", "expected"),
    [pytest.param(g, r, 1.0, id=f"right-{k}") for k, (g, r) in HLE_RIGHT.items()]
    + [pytest.param(g, r, 0.0, id=f"wrong-{k}") for k, (g, r) in HLE_WRONG.items()],
)
def test_hle_replies_in_model_styles(gold: str, reply: str, expected: float):
    assert verdict("hle", _hle(gold), reply) == expected


def _math_500(gold: str) -> dict:
    return {**MATH500[1], "solution": f"Solving, $x = \\boxed{{{gold}}}$.", "answer": gold}


# MATH-500: (gold, reply), answers with a plus-or-minus read as both signs on both sides.
MATH_RIGHT = {
    "qwen3-pm-line": ("1 \\pm \\sqrt{2}", REASONING + "The roots follow.\n\nANSWER: $1 \\pm \\sqrt{2}$"),
    "qwen3-unary-pm": ("\\pm 1", REASONING + "So $x^2 = 1$.\n\nANSWER: \\pm 1"),
    "deepseek-boxed-pm": ("\\pm\\frac{1}{2}", REASONING + "The answer is $\\boxed{\\pm\\frac{1}{2}}$."),
    "deepseek-both-listed": ("\\pm 1", REASONING + "ANSWER: $1, -1$"),
    "ouro-x-equals-pm": ("\\pm\\frac{1}{2}", REASONING + "**Final Answer**\n\\[\n\\boxed{x = \\pm\\frac{1}{2}}\n\\]"),
    "ouro-pm-boxed": ("1 \\pm \\sqrt{2}", REASONING + "Thus $\\boxed{x = 1 \\pm \\sqrt{2}}$."),
}
MATH_WRONG = {
    "qwen3-one-root": ("1 \\pm \\sqrt{2}", REASONING + "ANSWER: $1 + \\sqrt{2}$"),
    "qwen3-unary-one-sign": ("\\pm 1", REASONING + "ANSWER: 1"),
    "deepseek-boxed-one-sign": ("\\pm\\frac{1}{2}", REASONING + "The answer is $\\boxed{\\frac{1}{2}}$."),
    "deepseek-wrong-pm": ("1 \\pm \\sqrt{2}", REASONING + "ANSWER: $1 \\pm \\sqrt{3}$"),
    "ouro-negative-only": ("\\pm 1", REASONING + "**Final Answer**\n\\[\n\\boxed{-1}\n\\]"),
    "ouro-right-only-in-thinking": ("\\pm 1", "<think>\nANSWER: \\pm 1\n</think>\n\nANSWER: 1"),
}


@pytest.mark.parametrize(
    ("gold", "reply", "expected"),
    [pytest.param(g, r, 1.0, id=f"right-{k}") for k, (g, r) in MATH_RIGHT.items()]
    + [pytest.param(g, r, 0.0, id=f"wrong-{k}") for k, (g, r) in MATH_WRONG.items()],
)
def test_math_500_plus_or_minus_in_model_styles(gold: str, reply: str, expected: float):
    assert verdict("math_500", _math_500(gold), reply) == expected


RIGHT = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
WRONG = "def truncate_number(number: float) -> float:\n    return number - 1\n"
GUARDS = {
    "unittest": "import unittest\n\n\nclass TestTruncate(unittest.TestCase):\n    def test_half(self):\n"
    '        self.assertEqual(truncate_number(3.5), 0.5)\n\n\nif __name__ == "__main__":\n    unittest.main()\n',
    "input": "if __name__ == '__main__':\n    print(truncate_number(float(input())))\n",
    "sys-exit": 'import sys\n\nif __name__ == "__main__":\n    sys.exit(0 if truncate_number(3.5) == 0.5 else 1)\n',
}
SOLUTION = "### Approach\nThe decimal part is what is left after the integer part.\n\n### Solution Code\n"


def _code_replies(code: str) -> dict[str, str]:
    """One function (`code`, right or wrong) written the ways the three styles write code."""
    return {
        "qwen3-fenced-then-prose": REASONING + f"Here's the solution:\n\n```python\n{code}```\n\nIt takes the part.",
        "qwen3-tilde-fence": REASONING + f"~~~python\n{code}~~~\n",
        "qwen3-tag-python3": REASONING + f"```python3\n{code}```\n",
        "qwen3-unfenced-after-prose": REASONING + f"Here is the implementation:\n\n{code}\nThis uses modulo.",
        "qwen3-import-in-own-block": REASONING
        + "```python\nimport math\n```\n\n```python\n"
        + code.replace("number % 1.0", "number - math.floor(number)").replace("number - 1", "math.floor(number)")
        + "```",
        "deepseek-approach-layout": REASONING + f"{SOLUTION}```python\n{code}```\n\n### Explanation\nModulo 1.",
        **{f"ouro-main-guard-{name}": REASONING + f"```python\n{code}\n{guard}```" for name, guard in GUARDS.items()},
        "ouro-example-block-after": REASONING
        + f"```python\n{code}```\nExample:\n```python\nprint(truncate_number(3.5))\n```",
    }


def _helper_replies(right: bool) -> dict[str, str]:
    """A helper in a block of its own, right or wrong, the entry point calling it."""
    helper = "def _part(x):\n    return x % 1.0\n" if right else "def _part(x):\n    return round(x)\n"
    entry = "def truncate_number(number: float) -> float:\n    return _part(number)\n"
    return {
        "qwen3-helper-first-block": REASONING + f"```python\n{helper}```\n\nThen:\n\n```python\n{entry}```",
        "deepseek-helper-unlabelled-block": REASONING + f"```\n{helper}```\n```python\n{entry}```",
    }


HUMANEVAL_RIGHT = {
    **_code_replies(RIGHT),
    **_helper_replies(True),
    "deepseek-helper-in-later-block": REASONING + "```python\ndef truncate_number(number: float) -> float:\n"
    "    return _part(number)\n```\n\nwith the helper:\n\n```python\ndef _part(x):\n    return x % 1.0\n```",
    "completion-body-then-helper": "    return _part(number)\n\n\ndef _part(x):\n    return x % 1.0\n",
}
HUMANEVAL_WRONG = {
    **_code_replies(WRONG),
    **_helper_replies(False),
    "deepseek-helper-in-later-block": REASONING + "```python\ndef truncate_number(number: float) -> float:\n"
    "    return _part(number)\n```\n\nwith the helper:\n\n```python\ndef _part(x):\n    return x\n```",
    "qwen3-missing-import": REASONING
    + "```python\ndef truncate_number(number):\n    return number - math.floor(number)\n```",
    "ouro-right-only-in-thinking": f"<think>\n```python\n{RIGHT}```\n</think>\n\n```python\n{WRONG}```",
    "completion-body-then-helper": "    return _part(number)\n\n\ndef _part(x):\n    return x\n",
}
LIMITS = sandbox.Limits(wall_seconds=4, cpu_seconds=2)


@pytest.mark.parametrize(
    ("reply", "passes"),
    [pytest.param(r, True, id=f"right-{k}") for k, r in HUMANEVAL_RIGHT.items()]
    + [pytest.param(r, False, id=f"wrong-{k}") for k, r in HUMANEVAL_WRONG.items()],
)
def test_humaneval_programs_in_model_styles(reply: str, passes: bool):
    gold = humaneval.prompt(HUMANEVAL[1], "humaneval").choices[0]  # truncate_number
    outcome = sandbox.run_check(humaneval.program(reply, gold), gold.entry_point, humaneval.check(gold), LIMITS)
    assert outcome.passed == passes, outcome.output
