"""HumanEval (`openai/openai_humaneval`): the prompt, the program a reply makes, and its sandboxed check.

LightEval 0.13 has no HumanEval task. A row holds `task_id`, `prompt` (imports, signature and
docstring), `canonical_solution` (the body), `test` (a `check(candidate)` function) and
`entry_point`. The model is asked for the completed function; its reply becomes a program:
- the code is the last ```python (or bare ```) block of the reply after any `</think>`, else the
  whole reply after it;
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
from typing import TYPE_CHECKING

from suites import SuiteError, sandbox

if TYPE_CHECKING:
    from lighteval.models.model_output import ModelResponse
    from lighteval.tasks.requests import Doc

PROMPT = (
    "Complete the following Python function. Reply with the complete function, in one ```python code block.\n\n"
    "```python\n{prompt}```"
)
_FENCED = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


class Gold(str):
    """The canonical solution (what the store shows as the gold), carrying what the check needs.

    LightEval's pass@k hands its per-sample check a new Doc with the golds only, so the prompt,
    tests and entry point travel on the gold string itself.
    """

    def __new__(cls, solution: str, prompt: str, test: str, entry_point: str) -> Gold:
        gold = super().__new__(cls, solution)
        gold.prompt, gold.test, gold.entry_point = prompt, test, entry_point
        return gold

    def __getnewargs__(self) -> tuple[str, str, str, str]:  # copies and pickles keep the fields
        return str(self), self.prompt, self.test, self.entry_point


def prompt(line: dict, task_name: str | None = None) -> "Doc":
    """LightEval prompt function for one `openai_humaneval` row."""
    from lighteval.tasks.requests import Doc

    gold = Gold(line["canonical_solution"], line["prompt"], line["test"], line["entry_point"])
    return Doc(task_name=task_name or "", query=PROMPT.format(prompt=line["prompt"]), choices=[gold], gold_index=0)


def program(reply: str, gold: Gold) -> str:
    """The program `reply` makes (see the module docstring); it holds no test."""
    reply = reply.rsplit("</think>", 1)[-1]
    blocks = _FENCED.findall(reply)
    code = blocks[-1] if blocks else reply
    if re.search(rf"^def\s+{re.escape(gold.entry_point)}\s*\(", code, re.MULTILINE):
        body = f"{gold.prompt}\n\n{code}"
    else:
        body = gold.prompt + code
    return f"{body}\n"


def check(gold: Gold) -> str:
    """The source of the item's check, run apart from the program (see the module docstring)."""
    entry = gold.entry_point
    return f"{gold.prompt}{gold}\n\n{gold.test}\n\n{entry} = {sandbox.STAND_IN}\ncheck({entry})\n"


@functools.lru_cache(maxsize=4096)
def _passes(source: str, entry_point: str, check_source: str) -> bool:
    """One sandboxed check per distinct program: LightEval and the bridge both ask for each sample."""
    return sandbox.run_check(source, entry_point, check_source).passed


def passes(doc: "Doc", model_response: "ModelResponse") -> float:
    """1.0 when the reply's program passes the item's tests in the sandbox, else 0.0."""
    gold = doc.get_golds()[0]
    if not isinstance(gold, Gold):
        raise SuiteError("humaneval: the gold lost its tests on the way to the metric; cannot score")
    return float(_passes(program(model_response.final_text[0], gold), gold.entry_point, check(gold)))
