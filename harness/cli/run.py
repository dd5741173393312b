"""`loopeval run`: evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

Options, or a sweep file (`--config`, see `harness.sweep`), are validated by `RunSpec.build` before
anything is loaded or written; torch, lighteval, sqlalchemy and Ray are imported inside the command
so `loopeval --help` stays instant. `--executor local` (the default) runs the sweep in this process;
`--executor ray` submits each run as a Ray task (`harness.ray_executor`).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import typer

from harness.cli.common import AdaptersDirOption, DbOption, TrustRemoteCodeFlag, parse_int_list, print_answer, progress, report_path
from harness.hints import env_command, with_db
from harness.spec import DEFAULTS, SUITE_SAMPLING

_SYNTHETIC = SUITE_SAMPLING[DEFAULTS.suite]


def run(
    model: Optional[list[str]] = typer.Option(None, "--model", help=f"Model spec, repeatable (see `loopeval models`). Default: {', '.join(DEFAULTS.models)}."),
    suite: Optional[str] = typer.Option(None, "--suite", help=f"Suite name (see `loopeval suites`). Default: {DEFAULTS.suite}."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task names of the suite. Default: the suite's default tasks (synthetic: the chains and c30k2-c30k8)."),
    loops: Optional[str] = typer.Option(None, "--loops", help=f"Comma-separated loop counts for looped models; ranges too (1-12: depth extrapolation). Default: {','.join(map(str, DEFAULTS.loops))}."),
    samples: Optional[int] = typer.Option(None, "--samples", help=f"Samples per problem (pass@1 is their mean). Default: the suite's ({_SYNTHETIC['n']} on {DEFAULTS.suite})."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help=f"Sampling temperature, >= 0 (0 = greedy). Default: the suite's ({_SYNTHETIC['temperature']} on {DEFAULTS.suite})."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help=f"Nucleus top-p in (0, 1]. Default: the suite's ({_SYNTHETIC['top_p']} on {DEFAULTS.suite})."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help=f"New tokens per sample. Default: the suite's ({_SYNTHETIC['max_new_tokens']} on {DEFAULTS.suite}, 32768 on paper)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Docs per task. Default: all."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=f"Prompts per generate call, and docs per log-likelihood forward. The engine schedules its own batches: it takes each task's docs at once and decodes its max_batch override's sequences together. Default: {DEFAULTS.batch_size}."),
    seed: Optional[str] = typer.Option(None, "--seed", help="Seed for weights of random presets and for sampling; comma-separated seeds run the sweep once per seed. Default: 0."),
    db: DbOption = None,
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Directory with local copies of suite datasets (JSONL or parquet)."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue the stopped run RUN_ID with its stored settings (other sweep options are ignored)."),
    rerun: bool = typer.Option(False, "--rerun", help="Run again what is already stored finished (same model, overrides, loops, evaluation set and seed); by default it is reported and skipped."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the HTML report beside the database at the end."),
    trust_remote_code: TrustRemoteCodeFlag = False,
    adapters_dir: AdaptersDirOption = None,
    config: Optional[str] = typer.Option(None, "--config", help="Sweep file (TOML) with the same settings as these options, plus per-model overrides; an option given beside it overrides its key."),
    executor: Optional[str] = typer.Option(None, "--executor", help="local: the runs one after another in this process (default). ray: each run a Ray task."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to submit to (--executor ray). Default: $RAY_ADDRESS, else a new local Ray instance."),
    gpus_per_run: Optional[float] = typer.Option(None, "--gpus-per-run", help="GPUs each run requests (--executor ray; a fraction shares a GPU). Default: 1 on a cluster with GPUs, else one CPU per run."),
) -> int:
    """Evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

    With no options choosing what runs: the tiny zoo on the synthetic suite, loops 1,2,4,8 for looped
    models, paper sampling (temperature 1.0, top-p 0.7), after the recurrence lab's depth sweep (the lab
    zoo at r = 1-12, greedy, 20 docs per task; a set of its own).
    """
    from harness.sweep import build_request

    # LightEval warns on every run that --limit makes numbers partial; the table says what was run.
    logging.getLogger("lighteval").setLevel(logging.ERROR)
    if adapters_dir:
        from adapters.registry import load_plugins

        load_plugins(adapters_dir)  # before --model is resolved, so plugin prefixes are known

    flags = dict(
        models=model, suite=suite, tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        loops=parse_int_list(loops, "--loops"), samples=samples, temperature=temperature, top_p=top_p,
        max_new_tokens=max_new_tokens, limit=limit, batch_size=batch_size, seeds=parse_int_list(seed, "--seed", minimum=0),
        db_url=db, data_dir=data_dir, trust_remote_code=trust_remote_code or None,
        executor=executor, ray_address=ray_address, gpus_per_run=gpus_per_run,
    )
    request = build_request(flags, config)
    if request.executor == "ray":
        store, outcomes = _on_ray(request, resume, adapters_dir or [], rerun)
    else:
        store, outcomes = _here(request, resume, rerun)
    return _summarise(store, outcomes, request.db, report)


def _plain_log(bars: Any) -> Any:
    """A log line printer for the progress console: lines name models and errors, so plain text, never markup."""
    return lambda line: bars.console.print(line, markup=False)


def _skip_stored(request: Any, plans: list[Any], store: Any, rerun: bool) -> list[Any]:
    """Take runs already stored finished out of the plans (unless --rerun); their outcomes, for the summary."""
    from harness.runner import skip_stored

    if rerun:
        return []
    return [outcome for spec, plan in zip(request.specs, plans) for outcome in skip_stored(spec, plan, store, typer.echo)]


def _here(request: Any, resume: int | None, rerun: bool) -> tuple[Any, list[Any]]:
    """The local executor: every run in this process, one after another, each model loaded once.

    `--resume` completes every unfinished run of the resumed run's sweep and never creates a database.
    """
    from db.store import Store
    from harness.runner import new_sweep_id, prepare_sweep, resume_run, run_sweep

    plans = [] if resume is not None else [prepare_sweep(spec) for spec in request.specs]  # bad names fail here
    store = Store.read(request.db) if resume is not None else Store.open(request.db)
    try:
        skipped = _skip_stored(request, plans, store, rerun)
        with progress() as bars:
            if resume is not None:
                return store, resume_run(resume, store, request.db, progress=bars, log=_plain_log(bars))
            sweep_id = new_sweep_id()
            parts = [plan for plan in plans if plan.runs]
            bars.start_job(sum(len(plan.runs) for plan in parts), len(parts))
            return store, skipped + [
                outcome
                for spec, plan in zip(request.specs, plans) if plan.runs  # none left when all were stored
                for outcome in run_sweep(spec, plan, store, progress=bars, log=_plain_log(bars), sweep_id=sweep_id)
            ]
    except BaseException:
        store.close()  # an open SQLite connection would leave -wal and -shm files beside the database
        raise


def _on_ray(request: Any, resume: int | None, plugin_dirs: list[str], rerun: bool) -> tuple[Any, list[Any]]:
    """The Ray executor: plan here, then every run as a Ray task writing to the shared store."""
    from db.store import Store
    from harness.ray_executor import RayExecutor, worker_db_url
    from harness.runner import prepare_sweep

    plans = [] if resume is not None else [prepare_sweep(spec) for spec in request.specs]
    url = worker_db_url(request.db)
    with RayExecutor.connect(request.ray_address, plugin_dirs) as ray:
        ray.check_store(url)  # a SQLite file other machines cannot see fails here, before it is written
        store = Store.read(request.db) if resume is not None else Store.open(request.db)
        try:
            skipped = _skip_stored(request, plans, store, rerun)
            with progress() as bars:
                if resume is not None:
                    return store, ray.resume(resume, store, url, request.gpus_per_run, progress=bars, log=_plain_log(bars))
                return store, skipped + ray.run_sweep(request, plans, store, url, progress=bars, log=_plain_log(bars))
        except BaseException:
            store.close()
            raise


def _summarise(store: Any, outcomes: list[Any], db: str | None, report: bool) -> int:
    """The table of this sweep's runs, where they are stored, the report; exit 1 naming the runs that did not finish."""
    from db.session import resolve_db_url
    from harness.runner import failure_summary

    try:
        ids = {o.run_id for o in outcomes}
        print_answer(store, [r for r in store.run_summaries() if r["id"] in ids], db=db)
        typer.echo(f"results: {store.url}  (show them: {with_db(env_command('loopeval') + ' results', db)})")
    finally:
        store.close()
    if report:
        from dashboards.report import write_report

        url = resolve_db_url(db)
        typer.echo(f"report: {write_report(url, report_path(url))}")
    unfinished = [str(o.run_id) for o in outcomes if o.status != "finished"]
    if not unfinished:
        return 0
    resume = with_db(f"{env_command('loopeval')} run --resume RUN_ID", db)
    lines = failure_summary(outcomes) + [f"runs {', '.join(unfinished)} did not finish; continue with: {resume}"]
    typer.echo("\n".join(lines), err=True)
    return 1
