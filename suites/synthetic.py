"""The bundled `synthetic` suite: small arithmetic and variable-chain problems, a lookup control,
and cellular-automaton steps that need depth.

Every item is a short printable-ASCII prompt and a short answer, followed by the stop sequence
"\\n", so that character-level tiny models can learn them in a few CPU minutes:

    addition   "47+385="                     -> "432"   (2-3 digit operands, at least one carry)
    chain2     "q=3;f=q+4;k=f*2;k=?"          -> "14"    (the value flows through 2 hops)
    chain3     "..."                         3 hops
    chain4     "..."                         4 hops
    lookup     "k=7;m=2;q=5;m=?"             -> "2"     (one-step retrieval: the control task)
    r30k4      "r30 k4 0110100111010001:"    -> 16 bits (rule 30 run 4 steps on a ring of 16 cells)
    r30k3, r30k5, r30k6, r30k8               the same at other depths; r110k4 with rule 110
    c30k2, c30k4, c30k6, c30k8  "c30 k6 0110...:" -> 16 bits (rule 30 read causally: cell i reads cells
                                i-2, i-1, i of a line, zeros before the first cell)
    c150k2, c150k3, c150k5, c150k7  the same with rule 150 (the XOR of the three cells: after k steps
                                bit i is the parity of up to 2k + 1 input cells)

The chains are stated in order, so each operand sits at a fixed offset before the question: one
attention layer can gather them all and the feed-forward layers compose the operations, which a
2-layer model does well (docs/findings.md, the zoo). They test composing 2-4 operations, not following
names by content; `lookup` is a single retrieval by name.

The cellular-automaton tasks close that shortcut: every step is local and the same at every cell,
so output bit i after k steps depends on the 2k + 1 input bits around it, and each step costs the
model some depth. k is stated in the prompt. On the ring a causal model cannot run the steps on the
prompt (cell i needs cell i+1, which comes after it), so the steps have to happen at the answer;
the causal tasks (`c30k*`, `c150k*`) read only cells at or before i, so every prompt position can
hold its cell's state after each layer (or loop), one step at a time.

The suite's default task list (`DEFAULT_TASKS`, what a run without --tasks evaluates, and what the
shipped zoo is trained on) is the chains, the "no depth needed" contrast, and rule 30 read causally
at k = 2, 4, 6, 8: the tiny looped models run 4 loops, so k = 6 and 8 ask for more steps than the
trained depth (docs/zoo-trials.md, sections 6-10, has the trials that chose them). `addition` and
`lookup`, which no zoo model learned, and the other automata stay selectable by name.

The items come from a seeded generator (`generate_split`) and are committed under
`suites/data/synthetic/{task}.{split}.jsonl`, so that evaluation never depends on the generator's
code staying byte-for-byte the same; a test checks that the committed files equal the generator's
output. For each task the generator draws one stream of distinct items: the test split is its first
`TEST_SIZE` items, the train split the items after them, so train and test never overlap.

This module does not import lighteval (the trainer reads the train split without paying for it);
`task_configs` imports it when the suite is loaded.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suites import SuiteError

if TYPE_CHECKING:
    from lighteval.tasks.lighteval_task import LightevalTaskConfig
    from lighteval.tasks.requests import Doc

DATA_DIR = Path(__file__).parent / "data" / "synthetic"
NUMERIC_TASKS: tuple[str, ...] = ("addition", "chain2", "chain3", "chain4", "lookup")  # answers are numbers
# (neighbourhood, rule, steps): "r" reads cells i-1, i, i+1 on a ring; "c" (causal) reads i-2, i-1, i on a line
CA_TASKS: tuple[tuple[str, int, int], ...] = (
    ("r", 30, 3),
    ("r", 30, 4),
    ("r", 30, 5),
    ("r", 30, 6),
    ("r", 30, 8),
    ("r", 110, 4),
    ("c", 30, 2),
    ("c", 30, 4),
    ("c", 30, 6),
    ("c", 30, 8),
    ("c", 150, 2),
    ("c", 150, 3),
    ("c", 150, 5),
    ("c", 150, 7),
)
DEPTH_TASKS: tuple[str, ...] = tuple(f"{kind}{rule}k{steps}" for kind, rule, steps in CA_TASKS)
TASKS: tuple[str, ...] = NUMERIC_TASKS + DEPTH_TASKS  # every selectable task
DEFAULT_TASKS: tuple[str, ...] = (
    "chain2",
    "chain3",
    "chain4",
    "c30k2",
    "c30k4",
    "c30k6",
    "c30k8",
)  # a run without --tasks
CONFIG_NAMES = TASKS  # the name of every task config `task_configs` builds: one per task
COLUMNS: dict[str, dict[str, str]] = {
    task: {"prompt": "prompt", "answer": "text"} for task in TASKS
}  # read by the prompt
SPLITS: tuple[str, ...] = ("train", "test")
TEST_SIZE = 200  # items per task in the committed test split
TRAIN_SIZE = 8000  # items per task in the committed train split (19 tasks: 156k items, about 9.6 MB)
SEED = 0
STOP = "\n"  # every answer ends here; also the evaluation stop sequence
GENERATION_SIZE = 20  # new tokens a run allows: the longest answer is 16 characters (a CA state), plus the stop


def generation_size(task: str) -> int:
    """New tokens a task's docs allow: 8 for the numeric tasks (answers of at most 4 characters), 20
    for the automata. A cap per task keeps a sample that never stops from costing 20 tokens on the chains."""
    return GENERATION_SIZE if task in DEPTH_TASKS else 8


_NAMES = "abcdefghijklmnopqrstuvwxyz"
_MAX_VALUE = 99  # chain values stay in 0..99 so that answers are at most two digits


def _addition(rng: random.Random) -> tuple[str, str]:
    """Two operands of 2-3 digits whose sum needs at least one carry."""
    while True:
        a = rng.randint(10, 10 ** rng.randint(2, 3) - 1)
        b = rng.randint(10, 10 ** rng.randint(2, 3) - 1)
        if any(int(x) + int(y) >= 10 for x, y in zip(str(a)[::-1], str(b)[::-1])):
            return f"{a}+{b}=", str(a + b)


def _chain(hops: int) -> Callable[[random.Random], tuple[str, str]]:
    """`hops` assignments, each reading the previous variable: a=3;b=a+4;c=b*2;c=?"""

    def make(rng: random.Random) -> tuple[str, str]:
        names = rng.sample(_NAMES, hops + 1)
        value = rng.randint(0, 9)
        statements = [f"{names[0]}={value}"]
        for previous, name in zip(names, names[1:]):
            ops = [("+", d) for d in range(1, 10) if value + d <= _MAX_VALUE]
            ops += [("-", d) for d in range(1, 10) if value - d >= 0]
            ops += [("*", 2)] if 0 < value <= _MAX_VALUE // 2 else []
            op, operand = rng.choice(ops)
            value = value + operand if op == "+" else value - operand if op == "-" else value * operand
            statements.append(f"{name}={previous}{op}{operand}")
        return ";".join(statements) + f";{names[-1]}=?", str(value)

    return make


def _lookup(rng: random.Random) -> tuple[str, str]:
    """3-5 constant assignments and a question about one of them: one retrieval step, no computation."""
    names = rng.sample(_NAMES, rng.randint(3, 5))
    values = [rng.randint(0, _MAX_VALUE) for _ in names]
    asked = rng.randrange(len(names))
    pairs = ";".join(f"{n}={v}" for n, v in zip(names, values))
    return f"{pairs};{names[asked]}=?", str(values[asked])


CA_CELLS = 16  # cells of the cellular-automaton tasks (ring or line)


def ca_step(cells: str, rule: int, causal: bool = False) -> str:
    """One step of an elementary cellular automaton (Wolfram numbering).

    On a ring cell i reads cells i-1, i, i+1. Causal: cell i reads cells i-2, i-1, i of a line whose
    cells before the first are 0, so every cell depends only on cells at or before it, and a causal
    model can run the steps on the prompt itself, one step per layer (or loop).
    """
    n = len(cells)
    if causal:
        padded = "00" + cells
        return "".join(str(rule >> int(padded[i : i + 3], 2) & 1) for i in range(n))
    return "".join(str(rule >> int(cells[i - 1] + cells[i] + cells[(i + 1) % n], 2) & 1) for i in range(n))


def _automaton(kind: str, rule: int, steps: int) -> Callable[[random.Random], tuple[str, str]]:
    """Random CA_CELLS bits and their state after `steps` steps of `rule`: `r30 k4 0110...:` -> 16 bits.

    Every step is local and the same everywhere: output bit i depends on the 2k + 1 input bits
    around it, so k steps need depth that grows with k, and no single attention layer can gather
    the answer.
    """

    def make(rng: random.Random) -> tuple[str, str]:
        cells = "".join(rng.choice("01") for _ in range(CA_CELLS))
        state = cells
        for _ in range(steps):
            state = ca_step(state, rule, causal=kind == "c")
        return f"{kind}{rule} k{steps} {cells}:", state

    return make


_MAKERS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "addition": _addition,
    "chain2": _chain(2),
    "chain3": _chain(3),
    "chain4": _chain(4),
    "lookup": _lookup,
    **{task: _automaton(*spec) for task, spec in zip(DEPTH_TASKS, CA_TASKS)},
}


def _check_task(task: str) -> None:
    if task not in _MAKERS:
        raise SuiteError(f"unknown synthetic task {task!r} (tasks: {', '.join(TASKS)})")


def _stream(task: str, seed: int) -> Iterator[dict[str, str]]:
    """Distinct items of one task, in a fixed order for a given seed."""
    rng = random.Random(f"{task}:{seed}")  # string seeds hash deterministically (not salted)
    seen: set[str] = set()
    make = _MAKERS[task]
    while True:
        prompt, answer = make(rng)
        if prompt not in seen:
            seen.add(prompt)
            yield {"prompt": prompt, "answer": answer}


def generate_split(task: str, split: str, n: int, seed: int = SEED) -> list[dict[str, str]]:
    """The first `n` items of a split: dicts with "prompt" and "answer" (no stop sequence).

    Test items are the first `TEST_SIZE` items of the task's stream and train items the ones after,
    so any train size is disjoint from the test split.
    """
    _check_task(task)
    if split not in SPLITS:
        raise SuiteError(f"unknown split {split!r} (splits: {', '.join(SPLITS)})")
    if split == "test" and n > TEST_SIZE:
        raise SuiteError(f"the test split holds at most {TEST_SIZE} items per task, asked for {n}")
    start = 0 if split == "test" else TEST_SIZE
    stream = _stream(task, seed)
    items = [next(stream) for _ in range(start + n)]
    return items[start:]


def data_path(task: str, split: str) -> Path:
    """Where the committed split lives."""
    return DATA_DIR / f"{task}.{split}.jsonl"


def load_split(task: str, split: str = "train") -> list[dict[str, str]]:
    """The committed items of one split (the trainer reads "train"); each has "prompt" and "answer"."""
    _check_task(task)
    path = data_path(task, split)
    if not path.is_file():
        raise SuiteError(f"missing synthetic data file {path}; rebuild it with `python -m suites.synthetic`")
    with path.open(encoding="ascii") as f:
        return [json.loads(line) for line in f if line.strip()]


def training_text(item: dict[str, str]) -> str:
    """One training example exactly as the model sees it at evaluation: prompt, answer, stop."""
    return item["prompt"] + item["answer"] + STOP


def write_data(out_dir: Path = DATA_DIR, seed: int = SEED) -> list[Path]:
    """Regenerate the committed JSONL files (compact, one item per line)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for task in TASKS:
        for split, n in (("test", TEST_SIZE), ("train", TRAIN_SIZE)):
            path = out_dir / f"{task}.{split}.jsonl"
            with path.open("w", encoding="ascii", newline="\n") as f:
                for item in generate_split(task, split, n, seed):
                    f.write(json.dumps(item, separators=(",", ":")) + "\n")
            written.append(path)
    return written


def synthetic_prompt(line: dict[str, Any], task_name: str | None = None) -> Doc:
    """LightEval prompt function: the prompt as query, the answer as the only (gold) choice."""
    from lighteval.tasks.requests import Doc

    return Doc(task_name=task_name or "", query=line["prompt"], choices=[line["answer"]], gold_index=0)


def task_configs() -> list[LightevalTaskConfig]:
    """One LightEval task per synthetic task (all of TASKS), reading the committed test split.

    Scored with LightEval's pass@k at k=1 (over the run's n samples, set by `suites.loader.with_samples`), whose per-sample check is
    LightEval's exact match on the stripped output (the answers are bare numbers or bit strings, so extraction
    would only add ways to be lenient); with one sample it is plain exact match.
    """
    from lighteval.metrics.metrics import Metrics
    from lighteval.tasks.lighteval_task import LightevalTaskConfig

    return [
        LightevalTaskConfig(
            name=task,
            prompt_function=synthetic_prompt,
            hf_repo=str(data_path(task, "test")),
            hf_subset="default",
            hf_avail_splits=["test"],
            evaluation_splits=["test"],
            few_shots_split="test",  # unused (no few-shot); naming it keeps LightEval from warning
            generation_size=generation_size(task),
            stop_sequence=[STOP],
            metrics=[Metrics.pass_at_k(sample_params={"k": 1, "n": 1})],
            version=0,
        )
        for task in TASKS
    ]


if __name__ == "__main__":
    for written_path in write_data():
        print(written_path)
