"""The synthetic generator: deterministic, correct answers, committed data equal to it, splits disjoint."""

from __future__ import annotations

import re

import pytest

from suites import SuiteError
from suites import synthetic as syn


def solve(prompt: str) -> int:
    """An independent solver for the three prompt shapes (addition, chain, lookup)."""
    if prompt.endswith("="):
        a, b = prompt[:-1].split("+")
        return int(a) + int(b)
    *statements, question = prompt.split(";")
    assert question.endswith("=?")
    env: dict[str, int] = {}
    for statement in statements:
        name, expr = statement.split("=")
        match = re.fullmatch(r"([a-z])([-+*])(\d+)", expr)
        if match is None:
            env[name] = int(expr)
        else:
            var, op, operand = match.group(1), match.group(2), int(match.group(3))
            env[name] = {"+": env[var] + operand, "-": env[var] - operand, "*": env[var] * operand}[op]
    return env[question[:-2]]


def test_generator_is_deterministic_and_seeded():
    for task in syn.TASKS:
        assert syn.generate_split(task, "test", 50, seed=7) == syn.generate_split(task, "test", 50, seed=7)
        assert syn.generate_split(task, "test", 50, seed=7) != syn.generate_split(task, "test", 50, seed=8)
    # a longer train split extends a shorter one: the split is a prefix of one stream
    assert syn.generate_split("chain3", "train", 300)[:100] == syn.generate_split("chain3", "train", 100)


def test_committed_data_is_the_generators_output():
    for task in syn.TASKS:
        assert syn.load_split(task, "test") == syn.generate_split(task, "test", syn.TEST_SIZE)
        assert syn.load_split(task, "train") == syn.generate_split(task, "train", syn.TRAIN_SIZE)


def test_splits_disjoint_answers_correct_and_tokenizer_friendly():
    total_bytes = 0
    for task in syn.TASKS:
        test, train = syn.load_split(task, "test"), syn.load_split(task, "train")
        assert len(test) == syn.TEST_SIZE <= 200
        assert len(train) == syn.TRAIN_SIZE
        test_prompts, train_prompts = {i["prompt"] for i in test}, {i["prompt"] for i in train}
        assert len(test_prompts) == len(test) and len(train_prompts) == len(train)  # no repeats inside a split
        assert not test_prompts & train_prompts
        for item in test + train:
            assert int(item["answer"]) == solve(item["prompt"]), item
            text = syn.training_text(item)
            assert text.endswith(syn.STOP) and all(32 <= ord(c) <= 126 for c in text[:-1])
            assert len(item["answer"]) + 1 <= syn.GENERATION_SIZE
        total_bytes += syn.data_path(task, "test").stat().st_size + syn.data_path(task, "train").stat().st_size
    assert total_bytes < 4_000_000


def test_tasks_have_their_shape():
    chain_hops = {task: len(syn.generate_split(task, "test", 1)[0]["prompt"].split(";")) - 2 for task in ("chain2", "chain3", "chain4")}
    assert chain_hops == {"chain2": 2, "chain3": 3, "chain4": 4}
    for item in syn.generate_split("addition", "test", 100):
        a, b = item["prompt"][:-1].split("+")
        assert any(int(x) + int(y) >= 10 for x, y in zip(a[::-1], b[::-1])), "every addition needs a carry"


def test_bad_requests_raise_suite_error():
    with pytest.raises(SuiteError, match="unknown synthetic task 'mult'.*addition"):
        syn.generate_split("mult", "test", 5)
    with pytest.raises(SuiteError, match="unknown split 'dev'"):
        syn.generate_split("addition", "dev", 5)
    with pytest.raises(SuiteError, match="at most 200"):
        syn.generate_split("addition", "test", 201)
