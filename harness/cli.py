"""The `loopeval` command line.

Each command lives in its own module under `harness/` and registers itself with `register(app)`;
command modules import heavy libraries (torch, lighteval, dash) inside the command body only, so
`loopeval estimate` stays fast and runs where lighteval is not installed.

Every error the user can fix ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer.exceptions import TyperException

from adapters.base import AdapterError
from db import ResultsError
from suites import SuiteError

COMMAND_MODULES: tuple[str, ...] = (
    "harness.cmd_dashboard",
    "harness.cmd_estimate",
    "harness.cmd_run",
    "harness.cmd_profile",
    "harness.cmd_zoo",
    "harness.cmd_adapter",
)

app = typer.Typer(
    name="loopeval",
    help="Accuracy per gigabyte for looped language models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def fail(message: str) -> "typer.Exit":
    """Print one error line and return the exit to raise (code 2)."""
    print(f"loopeval: error: {message}", file=sys.stderr)
    return typer.Exit(2)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the app and turns usage and user errors into one line + exit 2."""
    try:
        result = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("loopeval: interrupted", file=sys.stderr)
        return 130
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.ctx.get_help() if getattr(exc, "ctx", None) else "loopeval --help")
            return 0
        print(f"loopeval: error: {exc.format_message()}", file=sys.stderr)
        return 2
    except (AdapterError, ResultsError, SuiteError) as exc:  # includes harness.errors.UserError
        print(f"loopeval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("loopeval: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
