"""HumanEval (`openai/openai_humaneval`): the prompt, the program a reply makes, and its sandboxed check.

LightEval 0.13 has no HumanEval task. A row holds `task_id`, `prompt` (imports, signature and
docstring), `canonical_solution` (the body), `test` (a `check(candidate)` function) and
`entry_point`. The model is asked for the completed function; its reply becomes a program:
- the code is read from the reply after any `</think>`: of its ```python (or ```py, or bare ```)
  blocks, the last that defines the entry point (`def <entry_point>(` at its top level, once the block
  is dedented), since a later definition is the model's corrected or final version and blocks that only
  call the function are examples; when no block defines it, the first block (replies give the code,
  then examples); with no block at all, the whole reply;
- when that code defines `entry_point`, the program is the prompt followed by that code (the new
  definition replaces the prompt's, whose imports and helper functions stay); otherwise the code is
  taken as the body that continues the prompt, as in the original HumanEval protocol;
The program runs in one sandbox and the item's tests in another (`suites.sandbox`): the prompt with
its canonical solution (for the helper functions some tests call, such as `poly`), the `test`, the
entry point rebound to the stand-in that calls the program, and `check(entry_point)`. The program
passes only when that check runs to its end; its exit status and output count for nothing.
"""

from __future__ import annotations

import functools
import re
import textwrap
from typing import TYPE_CHECKING, Any

from suites import SuiteError, sandbox

if TYPE_CHECKING:
    from lighteval.models.model_output import ModelResponse
    from lighteval.tasks.requests import Doc

PROMPT = (
    "Complete the following Python function. Reply with the complete function, in one ```python code block.\n\n"
    "```python\n{prompt}```"
)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[ \t]*$")
_PYTHON = ("", "python", "py", "python3")


class Gold(str):
    """The canonical solution (what the store shows as the gold), carrying what the check needs.

    LightEval's pass@k hands its per-sample check a new Doc with the golds only, so the prompt,
    tests and entry point travel on the gold string itself.
    """

    prompt: str
    test: str
    entry_point: str

    def __new__(cls, solution: str, prompt: str, test: str, entry_point: str) -> Gold:
        gold = super().__new__(cls, solution)
        gold.prompt, gold.test, gold.entry_point = prompt, test, entry_point
        return gold

    def __reduce__(self) -> tuple[type[Gold], tuple[str, str, str, str]]:  # copies and pickles keep the fields
        return Gold, (str(self), self.prompt, self.test, self.entry_point)


def prompt(line: dict[str, Any], task_name: str | None = None) -> Doc:
    """LightEval prompt function for one `openai_humaneval` row."""
    from lighteval.tasks.requests import Doc

    gold = Gold(line["canonical_solution"], line["prompt"], line["test"], line["entry_point"])
    return Doc(task_name=task_name or "", query=PROMPT.format(prompt=line["prompt"]), choices=[gold], gold_index=0)


def python_blocks(reply: str) -> list[str]:
    """The reply's fenced Python (or unlabelled) blocks, in order; an unclosed last block runs to the end.

    Fences are read line by line, so the closing fence of a ```bash block never opens a Python one; a
    closing fence at the end of a code line (`return x```) closes the block there.
    """
    blocks: list[str] = []
    language: str | None = None
    lines: list[str] = []
    for line in reply.splitlines():
        fence = _FENCE.match(line)
        if language is None:
            if fence is not None:
                language, lines = fence.group(1).lower(), []
            continue
        closes = fence is not None or line.rstrip().endswith("```")
        if fence is None:
            lines.append(line.rstrip()[:-3] if closes else line)
        if closes:
            if language in _PYTHON:
                blocks.append("\n".join(lines) + "\n")
            language = None
    if language in _PYTHON:
        blocks.append("\n".join(lines) + "\n")
    return blocks


def _definition(code: str, entry_point: str) -> str | None:
    """`code` dedented when it defines `entry_point` at its top level, else None (a block indented in a list counts)."""
    code = textwrap.dedent(code)
    return code if re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) else None


def program(reply: str, gold: Gold) -> str:
    """The program `reply` makes (see the module docstring); it holds no test."""
    reply = reply.rsplit("</think>", 1)[-1]
    candidates = python_blocks(reply) or [reply]
    definitions = [code for code in (_definition(c, gold.entry_point) for c in candidates) if code is not None]
    if definitions:
        return f"{gold.prompt}\n\n{definitions[-1]}\n"
    return f"{gold.prompt}{candidates[0]}\n"


def check(gold: Gold) -> str:
    """The source of the item's check, run apart from the program (see the module docstring)."""
    entry = gold.entry_point
    return f"{gold.prompt}{gold}\n\n{gold.test}\n\n{entry} = {sandbox.STAND_IN}\ncheck({entry})\n"


@functools.lru_cache(maxsize=4096)
def _passes(source: str, entry_point: str, check_source: str) -> bool:
    """One sandboxed check per distinct program: LightEval and the bridge both ask for each sample."""
    return sandbox.run_check(source, entry_point, check_source).passed


def passes(doc: Doc, model_response: ModelResponse) -> float:
    """1.0 when the reply's program passes the item's tests in the sandbox, else 0.0."""
    gold = doc.get_golds()[0]  # type: ignore[no-untyped-call]  # LightEval's Doc leaves it unannotated
    if not isinstance(gold, Gold):
        raise SuiteError("humaneval: the gold lost its tests on the way to the metric; cannot score")
    return float(_passes(program(model_response.final_text[0], gold), gold.entry_point, check(gold)))
