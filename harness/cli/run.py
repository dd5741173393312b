"""`loopeval run`: evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

Options, or a sweep file (`--config`, see `harness.sweep`), are validated by `RunSpec.build` before
anything is loaded or written; torch, lighteval, sqlalchemy and Ray are imported inside the command
so `loopeval --help` stays instant. `--executor local` (the default) runs the sweep in this process;
`--executor ray` submits each run as a Ray task (`harness.ray_executor`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import Any

import typer

from adapters.base import EXIT_CRITERIA, PAPER_PROTOCOL
from harness.cli.common import (AdaptersDirOption, DbOption, ThreadsOption, TrustRemoteCodeFlag, parse_int_list, print_answer,
                                print_sentence, progress, report_path, use_threads)
from harness.hints import env_command, with_db
from harness.spec import DEFAULT_EXIT_CRITERION, DEFAULTS, EMA, KV_DTYPES, KV_POLICIES, SUITE_SAMPLING

_SYNTHETIC = SUITE_SAMPLING[DEFAULTS.suite]


def run(
    model: list[str] | None = typer.Option(None, "--model", help=f"Model spec, repeatable (see `loopeval models`). Default: {', '.join(DEFAULTS.models)}."),
    suite: str | None = typer.Option(None, "--suite", help=f"Suite name (see `loopeval suites`). Default: {DEFAULTS.suite}."),
    tasks: str | None = typer.Option(None, "--tasks", help="Comma-separated task names of the suite. Default: the suite's default tasks (synthetic: the chains and c30k2-c30k8)."),
    loops: str | None = typer.Option(None, "--loops", help=f"Comma-separated loop counts for looped models; ranges too (1-12: depth extrapolation). Default: {','.join(map(str, DEFAULTS.loops))}."),
    exit_threshold: str | None = typer.Option(None, "--exit-threshold", help="Comma-separated per-token early-exit thresholds: each looped engine model runs once per threshold (and loop count), a token stopping its loops once the exit criterion reaches it. Gate: in [0, 1] (0 = one loop, 1 = all r); kl, entropy: >= 0. Default: not swept (each model's own exit policy)."),
    exit_criterion: str | None = typer.Option(None, "--exit-criterion", help=f"What --exit-threshold is compared with: {', '.join(EXIT_CRITERIA)}. Default: {DEFAULT_EXIT_CRITERION} (Ouro's learned exit gate)."),
    kv_policy: str | None = typer.Option(None, "--kv-policy", help=f"Comma-separated KV policies: each looped engine model runs once per policy (a plain model keeps its standard cache): {', '.join(KV_POLICIES)} ({EMA}:ALPHA, ALPHA in (0, 1)). A policy a model's family cannot take is refused. Default: not swept (each model's own)."),
    kv_dtype: str | None = typer.Option(None, "--kv-dtype", help=f"Comma-separated KV cache dtypes, each model run once per dtype: {', '.join(KV_DTYPES)} (auto: the model's dtype; int8 and fp8 keep a scale per token and head). Default: not swept (auto)."),
    samples: int | None = typer.Option(None, "--samples", help=f"Samples per problem (pass@1 is their mean). Default: the suite's ({_SYNTHETIC.n} on {DEFAULTS.suite})."),
    temperature: float | None = typer.Option(None, "--temperature", help=f"Sampling temperature, >= 0 (0 = greedy). Default: the suite's ({_SYNTHETIC.temperature} on {DEFAULTS.suite})."),
    top_p: float | None = typer.Option(None, "--top-p", help=f"Nucleus top-p in (0, 1]. Default: the suite's ({_SYNTHETIC.top_p} on {DEFAULTS.suite})."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help=f"New tokens per sample. Default: the suite's ({_SYNTHETIC.max_new_tokens} on {DEFAULTS.suite}, {PAPER_PROTOCOL.max_new_tokens} on paper)."),
    limit: int | None = typer.Option(None, "--limit", help="Docs per task. Default: all."),
    batch_size: int | None = typer.Option(None, "--batch-size", help=f"Prompts per generate call, and docs per log-likelihood forward. The engine schedules its own batches: it takes each task's docs at once and decodes its max_batch override's sequences together. Default: {DEFAULTS.batch_size}."),
    seed: str | None = typer.Option(None, "--seed", help="Seed for weights of random presets and for sampling; comma-separated seeds run the sweep once per seed. Default: 0."),
    db: DbOption = None,
    data_dir: str | None = typer.Option(None, "--data-dir", help="Directory with local copies of suite datasets (JSONL or parquet)."),
    resume: int | None = typer.Option(None, "--resume", help="Continue the stopped run RUN_ID with its stored settings (other sweep options are ignored)."),
    rerun: bool = typer.Option(False, "--rerun", help="Run again what is already stored finished (same model, overrides, loops, evaluation set and seed); by default it is reported and skipped."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the HTML report beside the database at the end."),
    trust_remote_code: TrustRemoteCodeFlag = False,
    adapters_dir: AdaptersDirOption = None,
    config: str | None = typer.Option(None, "--config", help="Sweep file (TOML) with the same settings as these options, plus per-model overrides; an option given beside it overrides its key."),
    executor: str | None = typer.Option(None, "--executor", help="local: the runs one after another in this process (default). ray: each run a Ray task."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to submit to (--executor ray). Default: $RAY_ADDRESS, else a new local Ray instance."),
    gpus_per_run: float | None = typer.Option(None, "--gpus-per-run", help="GPUs each run requests (--executor ray; a fraction shares a GPU). Default: 1 on a cluster with GPUs, else one CPU per run."),
    threads: ThreadsOption = None,
    device: str | None = typer.Option(None, "--device", help="Where every model computes: cpu or cuda (a model's own device override in a sweep file wins). Default: each model's own (the engine's: cuda where torch sees one, else cpu)."),
    workers: int | None = typer.Option(None, "--workers", help="Runs side by side in worker processes (--executor local). Default: the cores this process may use over each run's threads, 1 on a GPU."),
) -> int:
    """Evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

    With no options choosing what runs: the tiny zoo on the synthetic suite, loops 1,2,4,8 for looped
    models, paper sampling (temperature 1.0, top-p 0.7), after the recurrence lab's depth sweep (the lab
    zoo at r = 1-12, greedy, 20 docs per task; a set of its own) and before the exit sweep (ouro-tiny and
    melt-tiny at r = 4, exit thresholds 0.5, 0.7, 0.9; in the headline's set, whose r = 4 runs end each line) and the
    memory levers (ouro-tiny at r = 4 under shared-last and shared-mean KV, each at auto and int8; ouro-tiny, melt-tiny
    and qwen3-tiny-small at int8 under their own KV; in the headline's set).
    """
    from harness.sweep import build_request, float_list, string_list

    # LightEval warns on every run that --limit makes numbers partial; the table says what was run.
    logging.getLogger("lighteval").setLevel(logging.ERROR)
    if adapters_dir:
        from adapters.registry import load_plugins

        load_plugins(adapters_dir)  # before --model is resolved, so plugin prefixes are known

    flags = dict(
        models=model, suite=suite, tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        loops=parse_int_list(loops, "--loops"), exit_thresholds=None if exit_threshold is None else float_list(exit_threshold, "--exit-threshold"),
        exit_criterion=exit_criterion, kv_policies=None if kv_policy is None else string_list(kv_policy, "--kv-policy"),
        kv_dtypes=None if kv_dtype is None else string_list(kv_dtype, "--kv-dtype"), samples=samples, temperature=temperature, top_p=top_p,
        max_new_tokens=max_new_tokens, limit=limit, batch_size=batch_size, seeds=parse_int_list(seed, "--seed", minimum=0),
        db_url=db, data_dir=data_dir, trust_remote_code=trust_remote_code or None,
        executor=executor, ray_address=ray_address, gpus_per_run=gpus_per_run, workers=workers, device=device,
    )
    request = build_request(flags, config)
    try:
        if request.executor == "ray":
            store, outcomes = _on_ray(request, resume, adapters_dir or [], rerun, threads)
        else:
            store, outcomes = _here(request, resume, rerun, threads)
        return _summarise(store, outcomes, request.db, report)
    finally:
        gc.unfreeze()  # what `_planning` froze is collectable again once the command is done (tests call it in-process)


@contextlib.contextmanager
def _planning() -> Iterator[None]:
    """Plan with Python's cyclic collector paused, then freeze what planning built (`gc.freeze`) until `run` ends.

    Planning imports LightEval, torch and transformers, whose objects live as long as the command, and the
    collector's full passes over them as they grew took most of its time to the first generated token.
    Frozen, no later pass walks them, here or in the worker processes forked after: the use of `gc.freeze` its
    documentation gives, before a fork."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _plain_log(bars: Any, threads: Any) -> Any:
    """A log line printer for the progress console: lines name models and errors, so plain text, never markup.
    The first line the work logs is preceded by the thread count, said once (a refusal before any work says only itself).
    Output that is not a terminal (a file, a pipe, CI) gets each line whole: rich would break it at 80 columns there,
    and a run's line split in two no longer greps as one."""
    said, whole = False, not bars.console.is_terminal

    def log(line: str) -> None:
        nonlocal said
        if not said:
            bars.console.print(f"threads: {threads}", markup=False, soft_wrap=whole)
            said = True
        bars.console.print(line, markup=False, soft_wrap=whole)

    return log


def _skip_stored(request: Any, plans: list[Any], store: Any, rerun: bool) -> list[Any]:
    """Take runs already stored finished out of the plans (unless --rerun); their outcomes, for the summary."""
    from harness.runner import skip_stored

    if rerun:
        return []
    return [outcome for spec, plan in zip(request.specs, plans) for outcome in skip_stored(spec, plan, store, typer.echo)]


def _open_store(request: Any, plans: list[Any], resume: int | None, requested: int | None) -> tuple[Any, Any]:
    """The results store (read only to resume: it is never created then) and the thread count of this
    invocation, decided from its largest model (`adapters.threads`) and checked before anything is written."""
    from db.store import Store
    from harness.runner import largest_model, resumable_run, stored_params

    if resume is not None:
        store = Store.read(request.db, write=True)
        try:
            resumable_run(store, resume)  # a run that cannot resume is refused before anything else is said
            chosen = use_threads(requested, largest_model(stored_params(store, resume)))
        except BaseException:
            store.close()
            raise
    else:
        chosen = use_threads(requested, largest_model([p for plan in plans for p in plan.params.values()]))
        store = Store.open(request.db)
    return store, chosen


def _here(request: Any, resume: int | None, rerun: bool, threads: int | None) -> tuple[Any, list[Any]]:
    """The local executor: the runs in this process one after another, each model loaded once, or in worker
    processes side by side when the cores allow (`harness.pool`).

    `--resume` completes every unfinished run of the resumed run's sweep, in this process, and never creates a database.
    """
    from harness.recorder import new_sweep_id
    from harness.runner import prepare_sweep, resume_run, run_stored, store_sweep

    with _planning():
        plans = [] if resume is not None else [prepare_sweep(spec) for spec in request.specs]  # bad names fail here
    store, chosen = _open_store(request, plans, resume, threads)
    try:
        skipped = _skip_stored(request, plans, store, rerun)
        if resume is not None:
            with progress() as bars:
                return store, resume_run(resume, store, request.db, progress=bars, log=_plain_log(bars, chosen))
        sweep_id = new_sweep_id()
        stored = [(spec, plan, store_sweep(spec, plan, store, sweep_id)) for spec, plan in zip(request.specs, plans) if plan.runs]
        workers = _start_workers(request, stored, chosen.count)  # forked before any thread starts here
        with progress() as bars:
            log = _plain_log(bars, chosen)
            if workers is not None:
                return store, skipped + workers.wait(store, bars, log, len(stored))
            bars.start_job(sum(len(runs) for _, _, runs in stored), len(stored))
            return store, skipped + [outcome for spec, plan, runs in stored
                                     for outcome in run_stored(spec, runs, plan.task_configs, store, bars, log, plan.loaded)]
    except BaseException:
        store.close()  # an open SQLite connection would leave -wal and -shm files beside the database
        raise


def _start_workers(request: Any, stored: list[Any], threads: int) -> Any:
    """Worker processes for the stored runs when more than one would run (`harness.pool`), else None: one group
    of runs (one model), one core to spare per run, or --workers 1 run in this process."""
    from adapters.threads import cores
    from db.session import resolve_db_url
    from harness.pool import Workers, default_workers, groups

    devices = [device for _, plan, _ in stored for device in plan.devices.values()]
    wanted = request.workers or default_workers(threads, cores(), devices)
    run_groups = [group for spec, plan, runs in stored for group in groups(spec, plan, runs)] if wanted > 1 else []
    if len(run_groups) < 2:
        return None
    return Workers.start(run_groups, resolve_db_url(request.db), min(wanted, len(run_groups)))


def _on_ray(request: Any, resume: int | None, plugin_dirs: list[str], rerun: bool, threads: int | None) -> tuple[Any, list[Any]]:
    """The Ray executor: plan here, then every run as a Ray task writing to the shared store."""
    from harness.ray_executor import RayExecutor, worker_db_url
    from harness.runner import prepare_sweep

    RayExecutor.preflight(request.ray_address)  # Ray missing or the address wrong: told before the seconds of planning
    with _planning():
        plans = [] if resume is not None else [prepare_sweep(spec) for spec in request.specs]
    url = worker_db_url(request.db)
    with RayExecutor.connect(request.ray_address, plugin_dirs) as ray:
        ray.check_store(url)  # a SQLite file other machines cannot see fails here, before it is written
        store, chosen = _open_store(request, plans, resume, threads)  # each CPU run asks Ray for as many CPUs as it has threads
        try:
            skipped = _skip_stored(request, plans, store, rerun)
            with progress() as bars:
                log = _plain_log(bars, chosen)
                if resume is not None:
                    return store, ray.resume(resume, store, url, request.gpus_per_run, chosen.count, progress=bars, log=log)
                return store, skipped + ray.run_sweep(request, plans, store, url, chosen.count, progress=bars, log=log)
        except BaseException:
            store.close()
            raise


def _summarise(store: Any, outcomes: list[Any], db: str | None, report: bool) -> int:
    """The table of this sweep's runs, where they are stored, the report; exit 1 naming the runs that did not finish."""
    from analysis.runs import run_records
    from db.session import resolve_db_url
    from harness.runner import failure_summary

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
