"""The synthetic generator: deterministic, correct answers, committed data equal to it, splits disjoint."""

from __future__ import annotations

import re

import pytest

from suites import SuiteError
from suites import synthetic as syn


def run_automaton(rule: int, steps: int, cells: list[int], causal: bool = False) -> list[int]:
    """Elementary CA written from the rule's truth table rather than bit arithmetic: on a ring, or
    causal (cell i reads cells i-2, i-1, i; cells before the first read as 0)."""
    table = {
        (l, c, r): int(bit)
        for (l, c, r), bit in zip(
            [(1, 1, 1), (1, 1, 0), (1, 0, 1), (1, 0, 0), (0, 1, 1), (0, 1, 0), (0, 0, 1), (0, 0, 0)], f"{rule:08b}"
        )
    }
    n = len(cells)
    for _ in range(steps):
        if causal:
            line = [0, 0] + cells  # line[i + 2] is cell i
            cells = [table[line[i], line[i + 1], line[i + 2]] for i in range(n)]
        else:
            cells = [table[cells[(i - 1) % n], cells[i], cells[(i + 1) % n]] for i in range(n)]
    return cells


def solve(prompt: str) -> str:
    """An independent solver for the four prompt shapes (addition, chain, lookup, automaton)."""
    automaton = re.fullmatch(r"([rc])(\d+) k(\d+) ([01]+):", prompt)
    if automaton:
        rule, steps, cells = int(automaton[2]), int(automaton[3]), [int(c) for c in automaton[4]]
        return "".join(map(str, run_automaton(rule, steps, cells, causal=automaton[1] == "c")))
    if prompt.endswith("="):
        a, b = prompt[:-1].split("+")
        return str(int(a) + int(b))
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
    return str(env[question[:-2]])


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
            assert item["answer"] == solve(item["prompt"]), item
            text = syn.training_text(item)
            assert text.endswith(syn.STOP) and all(32 <= ord(c) <= 126 for c in text[:-1])
            assert len(item["answer"]) + 1 <= syn.generation_size(task) <= syn.GENERATION_SIZE
        total_bytes += syn.data_path(task, "test").stat().st_size + syn.data_path(task, "train").stat().st_size
    assert total_bytes < 10_000_000


def test_tasks_have_their_shape():
    chain_hops = {
        task: len(syn.generate_split(task, "test", 1)[0]["prompt"].split(";")) - 2
        for task in ("chain2", "chain3", "chain4")
    }
    assert chain_hops == {"chain2": 2, "chain3": 3, "chain4": 4}
    for item in syn.generate_split("addition", "test", 100):
        a, b = item["prompt"][:-1].split("+")
        assert any(int(x) + int(y) >= 10 for x, y in zip(a[::-1], b[::-1])), "every addition needs a carry"


def test_automaton_tasks_state_rule_and_depth():
    assert syn.DEPTH_TASKS == (
        "r30k3",
        "r30k4",
        "r30k5",
        "r30k6",
        "r30k8",
        "r110k4",
        "c30k2",
        "c30k4",
        "c30k6",
        "c30k8",
        "c150k2",
        "c150k3",
        "c150k5",
        "c150k7",
    )
    for task in syn.DEPTH_TASKS:
        for item in syn.generate_split(task, "test", 20):
            assert item["prompt"].startswith(f"{task[0]}{task[1:].split('k')[0]} k{task.split('k')[1]} ")
            assert len(item["answer"]) == syn.CA_CELLS and set(item["answer"]) <= {"0", "1"}
    # rule 30 grows a single live cell into the familiar 111 / 11001 rows
    assert syn.ca_step("0000000100000000", 30) == "0000001110000000"
    assert syn.ca_step("0000001110000000", 30) == "0000011001000000"
    # each output bit depends on the 2k + 1 cells around it: flipping a cell 5 away leaves bit 0 alone at k = 4
    base = "0110100111010001"
    flipped = base[:5] + str(1 - int(base[5])) + base[6:]
    assert run_automaton(30, 4, [int(c) for c in base])[0] == run_automaton(30, 4, [int(c) for c in flipped])[0]


def test_causal_automaton_reads_only_cells_before():
    # causal rule 30: cell i reads i-2, i-1, i, so a live cell spreads rightwards only
    assert syn.ca_step("0000000100000000", 30, causal=True) == "0000000111000000"
    assert syn.ca_step("1000000000000000", 30, causal=True) == "1110000000000000"
    # bit i after k steps depends on cells i-2k..i: flipping cell 3 leaves bits 0-2 alone and, through
    # rule 30's XOR with the cell two back, always flips bit 3 + 2k = 15 at k = 6
    base = [int(c) for c in "0110100111010001"]
    flipped = base[:3] + [1 - base[3]] + base[4:]
    before, after = run_automaton(30, 6, base, causal=True), run_automaton(30, 6, flipped, causal=True)
    assert before[:3] == after[:3] and before[15] != after[15]
    # ... and a cell 2k + 1 = 13 before bit 15 does not reach it in 6 steps
    far = base[:2] + [1 - base[2]] + base[3:]
    assert run_automaton(30, 6, far, causal=True)[15] == before[15]
    # rule 150 is linear: after 3 steps bit i is the parity of cells i, i-1, i-3, i-5, i-6 ((1 + x + x^2)^3 mod 2)
    cells = [int(c) for c in "0110100111010001"]
    expected = [sum(cells[i - d] for d in (0, 1, 3, 5, 6) if i - d >= 0) % 2 for i in range(16)]
    assert run_automaton(150, 3, cells, causal=True) == expected


def test_default_tasks_are_the_chains_and_the_causal_rule_30_depths():
    assert syn.DEFAULT_TASKS == ("chain2", "chain3", "chain4", "c30k2", "c30k4", "c30k6", "c30k8")
    assert syn.TASKS == syn.NUMERIC_TASKS + syn.DEPTH_TASKS
    assert [t for t in syn.TASKS if t in syn.DEFAULT_TASKS] == list(syn.DEFAULT_TASKS)  # in suite order


def test_bad_requests_raise_suite_error():
    with pytest.raises(SuiteError, match="unknown synthetic task 'mult'.*addition"):
        syn.generate_split("mult", "test", 5)
    with pytest.raises(SuiteError, match="unknown split 'dev'"):
        syn.generate_split("addition", "dev", 5)
    with pytest.raises(SuiteError, match="at most 200"):
        syn.generate_split("addition", "test", 201)
