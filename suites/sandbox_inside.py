"""What runs inside the two sandboxes of one check (`suites.sandbox`). Standard library only.

It is passed to `python -I -B -c` as text, never imported by the harness, and runs in two roles:
- `serve ENTRY REQUESTS ANSWERS`: the program. Executes /sandbox/program.py as a module named
  `program`, not `__main__`, so that its `if __name__ == "__main__":` block (a demo that runs unittest,
  reads input() or calls sys.exit) does not run, as when the function is imported to be tested; then
  answers each call read from the REQUESTS pipe by calling ENTRY and writing the result to the
  ANSWERS pipe. Nothing in this process is trusted: the program may replace any of it.
- `check REQUESTS ANSWERS NONCE`: the harness's check, in a sandbox of its own (its own PID
  namespace: the program cannot see it, signal it or read its memory). It reads the check's source
  and the run's nonce from stdin, runs the source with `loopeval_program` bound to a stand-in that
  calls the program through the pipes, and as its last act writes the nonce to the NONCE pipe,
  which only this process holds. Answers are read with `ast.literal_eval`, so no object of the
  program's (no `__eq__` that always agrees, no `__del__`, no patched builtin) ever exists here.

Every message is one line: the `repr` of `(args, kwargs)` one way, of `("value", result)` or
`("error", "Type: message")` the other. A result that is not a Python literal cannot travel and
fails the call, as does a program that ends, answers garbage or never answers.
"""

import ast
import json
import os
import sys
import types
from collections.abc import Callable
from typing import IO, Any

ANSWER_CHARS = 16 << 20  # a longer answer line is refused, not parsed


class ProgramError(Exception):
    """A call to the program did not return a value: it raised, ended, or answered something unreadable."""


def _error(error: BaseException) -> str:
    try:
        return f"{type(error).__name__}: {error}"[:1000]
    except BaseException:  # a program's exception whose __str__ raises
        return "an exception that cannot be printed"


def serve(entry: str, requests: int, answers: int) -> None:
    """Run the program, then answer calls to its `entry` function until the check closes the pipe."""
    module = types.ModuleType("program")  # registered, as an import would be: dataclasses and pickle look it up
    sys.modules["program"] = module
    with open("program.py", encoding="utf-8") as source:
        exec(compile(source.read(), "program.py", "exec"), module.__dict__)
    function = module.__dict__[entry]
    with open(requests, encoding="utf-8") as calls, open(answers, "w", encoding="utf-8") as replies:
        for line in calls:
            try:
                args, kwargs = ast.literal_eval(line)
                reply = repr(("value", function(*args, **kwargs)))
            except BaseException as error:  # SystemExit and KeyboardInterrupt too: the check hears of it
                reply = repr(("error", _error(error)))
            replies.write(reply + "\n")
            replies.flush()


def _send(fd: int, text: str) -> None:
    data = text.encode("utf-8")
    while data:
        data = data[os.write(fd, data) :]


def _stand_in(calls: int, replies: IO[str]) -> Callable[..., Any]:
    """The function the check calls in place of the program's: a call over the pipes, a literal back."""

    def loopeval_program(*args: Any, **kwargs: Any) -> Any:
        try:
            _send(calls, repr((args, kwargs)) + "\n")
        except BrokenPipeError:
            raise ProgramError("the program ended before answering") from None
        line = replies.readline(ANSWER_CHARS)
        if not line.endswith("\n"):
            raise ProgramError("the program ended (or its answer was too long) before answering")
        try:
            kind, value = ast.literal_eval(line)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
            raise ProgramError("the program's answer is not a Python literal") from error
        if kind == "error":
            raise ProgramError(f"the program raised {value}")
        if kind != "value":
            raise ProgramError("the program's answer is malformed")
        return value

    return loopeval_program


def check(requests: int, answers: int, nonce: int) -> None:
    """Run the check's source against the program; write the nonce only when it ran to its end."""
    spec = json.loads(sys.stdin.read())
    with open(answers, encoding="utf-8") as replies:
        namespace: dict[str, Any] = {"__name__": "__main__", "loopeval_program": _stand_in(requests, replies)}
        exec(compile(spec["source"], "check.py", "exec"), namespace)
    os.write(nonce, spec["nonce"].encode("ascii"))


if __name__ == "__main__":
    role, *arguments = sys.argv[1:]
    if role == "serve":
        serve(arguments[0], int(arguments[1]), int(arguments[2]))
    else:
        check(*(int(a) for a in arguments))
