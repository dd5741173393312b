"""`loopeval run`: evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

Options, or a sweep file (`--config`, see `harness.planning.sweep`), are validated by `RunSpec.build` before
anything is loaded or written; torch, lighteval, sqlalchemy and Ray are imported inside the command
so `loopeval --help` stays instant. The job itself, on the executor `--executor` names, is
`harness.execution.executor.run_job`'s.
"""

from __future__ import annotations

import logging
from typing import Any

import typer

from adapters.base import EXIT_CRITERIA, PAPER_PROTOCOL
from harness.cli.common import (AdaptersDirOption, DbOption, ThreadsOption, TrustRemoteCodeFlag, parse_int_list, print_answer,
                                print_sentence, report_path)
from harness.hints import env_command, with_db
from harness.planning.spec import DEFAULT_EXIT_CRITERION, DEFAULTS, EMA, KV_DTYPES, KV_POLICIES, SUITE_SAMPLING

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
    from harness.execution.executor import run_job
    from harness.planning.sweep import build_request, float_list, string_list

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
        executor=executor, ray_address=ray_address, gpus_per_run=gpus_per_run, workers=workers,
    )
    request = build_request(flags, config)
    with run_job(request, resume, rerun, threads, adapters_dir or [], typer.echo) as job:
        return _summarise(job.store, job.outcomes, request.db, report)


def _summarise(store: Any, outcomes: list[Any], db: str | None, report: bool) -> int:
    """The table of this sweep's runs, where they are stored, the report; exit 1 naming the runs that did not finish."""
    from db.session import resolve_db_url
    from harness.execution.runner import failure_summary

    try:
        for line in store.hide_damaged():  # the store only reads from here on: runs damaged by hand are named, not read
            typer.echo(line, err=True)
        ids = {o.run_id for o in outcomes}
        sentence = print_answer(store, [r for r in store.run_summaries() if r["id"] in ids], db=db)
        typer.echo(f"results: {store.url}  (show them: {with_db(env_command('loopeval') + ' results', db)})")
    finally:
        store.close()
    if report:
        from dashboards.report import write_report

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
