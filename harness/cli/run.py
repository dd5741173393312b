"""`loopeval run`: evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

Options, or a sweep file (`--config`, see `harness.planning.sweep`), are validated by `RunSpec.build` before
anything is loaded or written; torch, lighteval, sqlalchemy and Ray are imported inside the command
so `loopeval --help` stays instant. The job itself, on the executor `--executor` names, is
`harness.execution.executor.run_job`'s.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import typer

from harness.cli.common import (
    AdaptersDirOption,
    DbOption,
    MkdirFlag,
    ThreadsOption,
    TrustRemoteCodeFlag,
    check_db_folder,
    print_answer,
    print_sentence,
    report_path,
)
from harness.hints import env_command, with_db
from harness.planning.options import OPTIONS, RunOption, given

# The flags `loopeval run` shares with other commands: their typer options are harness.cli.common's.
SHARED = {"db": DbOption, "trust_remote_code": TrustRemoteCodeFlag}


def _parameter(option: RunOption) -> inspect.Parameter:
    """The typer parameter of a row of the options table (not given: None, or a shared flag's own default)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    if option.help is None:
        default = False if option.type is bool else None
        return inspect.Parameter(option.key, keyword, default=default, annotation=SHARED[option.key])
    return inspect.Parameter(
        option.key, keyword, annotation=option.type | None, default=typer.Option(None, option.flag, help=option.help)
    )


def _with_options(command: Callable[..., int]) -> Callable[..., int]:
    """`command` declaring a typer option for every flag of the options table (`harness.planning.options.OPTIONS`),
    then its own; typer passes the table's as `**flags`."""
    parameters = inspect.signature(command, eval_str=True).parameters.values()
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in parameters
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    table = [_parameter(option) for option in OPTIONS if option.type is not None]
    command.__signature__ = inspect.Signature([*table, *own], return_annotation=int)  # type: ignore[attr-defined]
    return command


@_with_options
def run(
    resume: int | None = typer.Option(
        None,
        "--resume",
        help="Continue the stopped run RUN_ID with its stored settings (other sweep options are ignored).",
    ),
    rerun: bool = typer.Option(
        False,
        "--rerun",
        help="Run again what is already stored finished (same model, overrides, loops, evaluation set and seed); by default it is reported and skipped.",
    ),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Write the HTML report beside the database at the end."
    ),
    adapters_dir: AdaptersDirOption = None,
    config: str | None = typer.Option(
        None,
        "--config",
        help="Sweep file (TOML) with the same settings as these options, plus per-model overrides; an option given beside it overrides its key.",
    ),
    threads: ThreadsOption = None,
    mkdir: MkdirFlag = False,
    **flags: Any,
) -> int:
    """Evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

    With no options choosing what runs: the tiny zoo on the synthetic suite, loops 1,2,4,8 for looped
    models, paper sampling (temperature 1.0, top-p 0.7), after the recurrence lab's depth sweep (the lab
    zoo at r = 1-12, greedy, 20 docs per task; a set of its own) and before the exit sweep (ouro-tiny and
    melt-tiny at r = 4, exit thresholds 0.5, 0.7, 0.9; in the headline's set, whose r = 4 runs end each line) and the
    memory levers (ouro-tiny at r = 4 under shared-last and shared-mean KV, each at auto and int8; ouro-tiny, melt-tiny
    and qwen3-tiny-small at int8 under their own KV; in the headline's set).
    """
    from harness.execution.executor import NOTHING_STORED, run_job
    from harness.planning.sweep import build_request, planning_line

    # LightEval warns on every run that --limit makes numbers partial; the table says what was run.
    logging.getLogger("lighteval").setLevel(logging.ERROR)
    try:
        typer.echo(planning_line(given(flags), config, resume))
        if adapters_dir:
            from adapters.registry import load_plugins

            load_plugins(adapters_dir)  # before --model is resolved, so plugin prefixes are known
        request = build_request(given(flags), config)  # resolving the models imports torch: seconds
    except KeyboardInterrupt:
        typer.echo(NOTHING_STORED)
        raise
    check_db_folder(request.db, mkdir)
    with run_job(request, resume, rerun, threads, adapters_dir or [], typer.echo) as job:
        return _summarise(job.store, job.outcomes, request.db, report)


def _summarise(store: Any, outcomes: list[Any], db: str | None, report: bool) -> int:
    """The table of this sweep's runs, where they are stored, the report; exit 1 naming the runs that did not finish."""
    from analysis.runs import run_records
    from db.session import resolve_db_url
    from harness.execution.runner import failure_summary

    try:
        for line in store.hide_damaged():  # the store only reads from here on: runs damaged by hand are named, not read
            typer.echo(line, err=True)
        ids = {o.run_id for o in outcomes}
        sentence = print_answer(store.engine, run_records(store.engine, sorted(ids)), db=db)
        typer.echo(f"results: {store.url}  (show them: {with_db(env_command('loopeval') + ' results', db)})")
    finally:
        store.close()
    if report:
        from harness.report import write_report

        url = resolve_db_url(db)
        typer.echo(f"report: {write_report(url, report_path(url))}")
    print_sentence(sentence)
    unfinished = [str(o.run_id) for o in outcomes if o.status != "finished"]
    if not unfinished:
        return 0
    resume = with_db(f"{env_command('loopeval')} run --resume RUN_ID", db)
    lines = failure_summary(outcomes) + [f"runs {', '.join(unfinished)} did not finish; continue with: {resume}"]
    typer.echo("\n".join(lines), err=True)
    return 1
