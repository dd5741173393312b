"""`loopeval run`: evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

Options are parsed here and validated by `RunSpec.build` before anything is loaded or written;
torch, lighteval and sqlalchemy are imported inside the command so `loopeval --help` stays instant.
"""

from __future__ import annotations

import logging
from typing import Optional

import typer

from harness.cli.common import AdaptersDirOption, DbOption, TrustRemoteCodeFlag, parse_int_list, print_runs, progress, report_path
from harness.spec import DEFAULTS, SUITE_SAMPLING

_SYNTHETIC = SUITE_SAMPLING[DEFAULTS.suite]


def run(
    model: Optional[list[str]] = typer.Option(None, "--model", help=f"Model spec, repeatable (see `loopeval models`). Default: {', '.join(DEFAULTS.models)}."),
    suite: Optional[str] = typer.Option(None, "--suite", help=f"Suite name (see `loopeval suites`). Default: {DEFAULTS.suite}."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task names of the suite. Default: all."),
    loops: Optional[str] = typer.Option(None, "--loops", help=f"Comma-separated loop counts for looped models. Default: {','.join(map(str, DEFAULTS.loops))}."),
    samples: Optional[int] = typer.Option(None, "--samples", help=f"Samples per problem (pass@1 is their mean). Default: the suite's ({_SYNTHETIC['n']} on {DEFAULTS.suite})."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help=f"Sampling temperature, >= 0 (0 = greedy). Default: the suite's ({_SYNTHETIC['temperature']} on {DEFAULTS.suite})."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help=f"Nucleus top-p in (0, 1]. Default: the suite's ({_SYNTHETIC['top_p']} on {DEFAULTS.suite})."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help=f"New tokens per sample. Default: the suite's ({_SYNTHETIC['max_new_tokens']} on {DEFAULTS.suite}, 32768 on paper)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Docs per task. Default: all."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=f"Prompts per generate call. Default: {DEFAULTS.batch_size}."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights of random presets and for sampling."),
    db: DbOption = None,
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Directory with local copies of suite datasets (JSONL or parquet)."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue the stopped run RUN_ID with its stored settings (other options are ignored)."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the HTML report beside the database at the end."),
    trust_remote_code: TrustRemoteCodeFlag = False,
    adapters_dir: AdaptersDirOption = None,
) -> None:
    """Evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

    With no arguments: the tiny zoo on the synthetic suite, loops 1,2,4,8 for looped models,
    paper sampling (temperature 1.0, top-p 0.7).
    """
    from harness.runner import failure_summary, prepare_sweep, resume_run, run_sweep
    from harness.spec import RunSpec

    # LightEval warns on every run that --limit makes numbers partial; the table says what was run.
    logging.getLogger("lighteval").setLevel(logging.ERROR)
    if adapters_dir:
        from adapters.registry import load_plugins

        load_plugins(adapters_dir)  # before --model is resolved, so plugin prefixes are known

    spec = RunSpec.build(
        models=model, suite=suite, tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        loops=parse_int_list(loops, "--loops"), samples=samples, temperature=temperature, top_p=top_p,
        max_new_tokens=max_new_tokens, limit=limit, batch_size=batch_size, seed=seed, db_url=db, data_dir=data_dir,
        trust_remote_code=trust_remote_code,
    )
    from db.session import resolve_db_url
    from db.store import Store

    if resume is not None:
        store = Store.read(db)  # resuming never creates a database
    else:
        plan = prepare_sweep(spec)  # unknown suite, task or model fails here, before the database opens
        store = Store.open(db)
    # Closed on every way out: an open SQLite connection leaves -wal and -shm files beside the database.
    try:
        with progress() as bars:
            def log(line: str) -> None:  # names models and errors: plain text, never console markup
                bars.console.print(line, markup=False)

            if resume is not None:
                outcomes = resume_run(resume, store, db, progress=bars, log=log)
            else:
                outcomes = run_sweep(spec, plan, store, progress=bars, log=log)
        ids = {o.run_id for o in outcomes}
        print_runs([r for r in store.run_summaries() if r["id"] in ids])
        typer.echo(f"results: {store.url}  (show them: loopeval results{'' if db is None else f' --db {db}'})")
    finally:
        store.close()
    url = resolve_db_url(db)
    if report:
        from dashboards.report import write_report

        typer.echo(f"report: {write_report(url, report_path(url))}")
    failed = failure_summary(outcomes)
    if failed:
        typer.echo("\n".join(failed), err=True)
        raise typer.Exit(1)
