"""HumanEval (`openai/openai_humaneval`): the prompt, the program a reply makes, and its sandboxed check.

LightEval 0.13 has no HumanEval task. A row holds `task_id`, `prompt` (imports, signature and
docstring), `canonical_solution` (the body), `test` (a `check(candidate)` function) and
`entry_point`. The model is asked for the completed function; its reply becomes a program:
- the code is read from the reply after its reasoning (`answers.after_thinking`): of its fenced blocks
  (``` or ~~~, any language tag), the last that defines the entry point (`def <entry_point>(` at its top
  level, once the block is dedented), since a later definition is the model's corrected or final version
  and blocks that only call the function are examples; with no fence at all, the code that follows the
  reply's prose (from its first top-level `def`, `class`, `import` or decorator, up to the longest run
  of lines that parses), or the whole reply when no such line starts one;
- when that code defines `entry_point`, the program is the prompt, then what the reply's other blocks
  lend it (their top-level imports, functions, classes and constants, never another version of the
  entry point: a helper or an import in a block of its own), then that code (the new definition
  replaces the prompt's, whose imports and helper functions stay); otherwise the first Python (else
  the first) block, or the unfenced reply, is taken as the body that continues the prompt, as in the
  original HumanEval protocol;
- the program runs as a module named `program`, not `__main__`: its `if __name__ == "__main__":`
  block (unittest, input(), sys.exit) is a demo, left out as when the function is imported.
The program runs in one sandbox and the item's tests in another (`suites.sandbox`): the prompt with
its canonical solution (for the helper functions some tests call, such as `poly`), the `test`, the
entry point rebound to the stand-in that calls the program, and `check(entry_point)`. The program
passes only when that check runs to its end; its exit status and output count for nothing.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from typing import TYPE_CHECKING, Any

from suites import SuiteError, answers, sandbox

if TYPE_CHECKING:
    from lighteval.models.model_output import ModelResponse
    from lighteval.tasks.requests import Doc

PROMPT = (
    "Complete the following Python function. Reply with the complete function, in one ```python code block.\n\n"
    "```python\n{prompt}```"
)
# A fence line: three or more backticks or tildes, then an optional language tag (or attributes) on the opening one.
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*\{?\.?([\w+-]*)[^`]*$")
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


def code_blocks(reply: str) -> list[tuple[str, str]]:
    """The reply's fenced blocks (``` or ~~~, any language tag) as (tag, code), in order; an unclosed last block runs
    to the end.

    Fences are read line by line and a block closes only at a fence of its own kind, so the closing fence of a
    ```bash block never opens a Python one; a closing fence at the end of a code line (`return x```) closes the
    block there.
    """
    blocks: list[tuple[str, str]] = []
    opened: tuple[str, str] | None = None  # the open block's fence and tag
    lines: list[str] = []
    for line in reply.splitlines():
        fence = _FENCE.match(line)
        if opened is None:
            if fence is not None:
                opened, lines = (fence.group(1), fence.group(2).lower()), []
            continue
        closes_alone = fence is not None and fence.group(1)[0] == opened[0][0] and not fence.group(2)
        closes_on_code = not closes_alone and line.rstrip().endswith(opened[0])
        if not closes_alone:
            lines.append(line.rstrip()[: -len(opened[0])] if closes_on_code else line)
        if closes_alone or closes_on_code:
            blocks.append((opened[1], "\n".join(lines) + "\n"))
            opened = None
    if opened is not None:
        blocks.append((opened[1], "\n".join(lines) + "\n"))
    return blocks


def _definition(code: str, entry_point: str) -> str | None:
    """`code` dedented when it defines `entry_point` at its top level, else None (a block indented in a list counts)."""
    code = textwrap.dedent(code)
    return code if re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) else None


_SUPPORT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _support(code: str, entry_point: str) -> str:
    """What another block lends the program: its top-level imports, functions and classes (never the entry point)
    and constant assignments (`MOD = 10**9 + 7`); examples, prints and tests that call the function stay out."""
    code = textwrap.dedent(code)
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a doctest transcript, a shell command, prose
        return ""
    lines = code.splitlines()
    kept = []
    for node in tree.body:
        named = getattr(node, "name", None)
        constant = isinstance(node, ast.Assign | ast.AnnAssign) and not any(
            isinstance(inner, ast.Call) for inner in ast.walk(node)
        )
        if (isinstance(node, _SUPPORT) and named != entry_point) or constant:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            kept.append("\n".join(lines[first - 1 : node.end_lineno]) + "\n")
    return "".join(kept)


# A line that starts a Python program at its top level: where unfenced code begins after the reply's prose.
_CODE_START = re.compile(r"^(?:(?:async[ \t]+)?def[ \t]|class[ \t]|import[ \t]|from[ \t]+\S+[ \t]+import[ \t]|@\w)")
_TRIM_TRIES = 64  # trailing lines tried off unfenced code to leave out the prose after it


def _unfenced(reply: str) -> str:
    """The code of a reply with no fence: after its prose, from the first line that starts a program, up to the longest
    run of lines that parses (the prose after it left out); the reply unchanged where no prose comes first or no line
    starts a program (a body that continues the prompt, as in HumanEval's completion protocol, helpers after it)."""
    lines = reply.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    before = [line for line in lines[:start] if line.strip()]
    if start is None or not before or before[0][0] in " \t":  # no prose first: a body, perhaps with its helpers
        return reply
    for end in range(len(lines), max(start, len(lines) - _TRIM_TRIES), -1):
        code = "\n".join(lines[start:end]) + "\n"
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        return code
    return "\n".join(lines[start:]) + "\n"


def program(reply: str, gold: Gold) -> str:
    """The program `reply` makes (see the module docstring); it holds no test."""
    reply = answers.after_thinking(reply)
    blocks = code_blocks(reply)
    candidates = [code for _, code in blocks] or [_unfenced(reply)]
    defining = [i for i, code in enumerate(candidates) if _definition(code, gold.entry_point) is not None]
    if defining:
        final = defining[-1]
        support = "".join(_support(code, gold.entry_point) for i, code in enumerate(candidates) if i != final)
        return f"{gold.prompt}\n\n{support}{_definition(candidates[final], gold.entry_point)}\n"
    bodies = [code for tag, code in blocks if tag in _PYTHON] or candidates
    return f"{gold.prompt}{bodies[0]}\n"


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
