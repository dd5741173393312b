"""The `loopeval` command line: one module per command, every command registered here.

Command modules import heavy libraries (torch, lighteval, dash) inside the command body only, so
`loopeval --help` is instant and `loopeval estimate` runs where lighteval is not installed. What
several commands share (option definitions, parsing, tables) is in `harness.cli.common`; no command
module imports another.

Every error the user can fix ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import gc
import sys
from typing import cast

import typer
import typer.core
from typer.exceptions import TyperException

from adapters.base import MAX_STORED_INT, AdapterError, interrupts_counted
from db import ResultsError
from harness.cli import (
    adapter,
    compare,
    dashboard,
    estimate,
    probe,
    profile,
    results,
    run,
    show_models,
    show_suites,
    zoo,
)
from suites import SuiteError

app = typer.Typer(
    name="loopeval",
    help="Accuracy per gigabyte for looped language models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("run")(run.run)
app.command("results")(results.results)
app.command("compare")(compare.compare)
app.command("suites")(show_suites.suites)
app.command("models")(show_models.models)
app.command("estimate")(estimate.estimate)
app.command("profile")(profile.profile)
app.command("probe")(probe.probe)
app.command("dashboard")(dashboard.dashboard)

zoo_app = typer.Typer(help="The tiny model zoo: list, retrain, convert a LoopLM to MELT.", no_args_is_help=True)
zoo_app.command("list")(zoo.list_models)
zoo_app.command("train")(zoo.train)
zoo_app.command("convert")(zoo.convert)
app.add_typer(zoo_app, name="zoo")

adapter_app = typer.Typer(help="Add and check model adapters.", no_args_is_help=True, add_completion=False)
adapter_app.command("new")(adapter.new)
adapter_app.command("check")(adapter.check)
app.add_typer(adapter_app, name="adapter")


Command = typer.core.TyperCommand | typer.core.TyperGroup


def bounded_ints(command: Command) -> Command:
    """`command` with every integer option and argument that has no upper bound bounded by MAX_STORED_INT (a database's
    integer column; the commands' own bounds, `harness.planning.spec.BOUNDS`, are tighter): a value of 400 digits is a usage
    error, one line, never an overflow where it meets a float, a tensor or SQLite."""
    for param in command.params:
        described = param.type_descriptor  # type: ignore[attr-defined]  # typer's options carry it; click's type does not
        info = described.parameter_info
        if described.annotation is int and info.max is None:
            info.max = MAX_STORED_INT
    for sub in getattr(command, "commands", {}).values():
        bounded_ints(sub)
    return command


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the app and turns usage and user errors into one line + exit 2."""
    try:
        with interrupts_counted():  # a plugin raising KeyboardInterrupt is told apart from the user's Ctrl-C
            result = bounded_ints(cast(Command, typer.main.get_command(app))).main(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("loopeval: interrupted", file=sys.stderr)
        return 130
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            ctx = getattr(exc, "ctx", None)
            print(ctx.get_help() if ctx else "loopeval --help")
            return 0
        print(f"loopeval: error: {exc.format_message()}", file=sys.stderr)
        return 2
    except (AdapterError, ResultsError, SuiteError) as exc:  # includes harness.errors.UserError
        print(f"loopeval: error: {exc}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


def entry() -> None:
    """The `loopeval` console script: `main`, then exit with its code.

    The objects made so far are frozen first (`gc.freeze`): the interpreter's last collections would otherwise
    walk everything LightEval, torch and transformers built, seconds at the end of every command on a 2-core
    machine (docs/benchmarks.md, "Figures behind choices in the code"), to free memory the exit returns anyway."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
