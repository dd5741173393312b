"""`loopeval run`, `loopeval results`, `loopeval suites`, `loopeval models`.

Options are parsed here and validated by `RunSpec.build`; heavy libraries (torch, lighteval,
sqlalchemy) are imported inside the commands so `loopeval --help` stays instant.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from harness.errors import UserError
from harness.runner import DEFAULTS

DB_HELP = (
    "Results database: a SQLAlchemy URL or a SQLite file path. "
    "Default: $LOOPEVAL_DB, else results/loopeval.sqlite under the working directory."
)
GB = 1e9  # decimal gigabytes, as the MELT paper reports them


def parse_int_list(value: str | None, option: str) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4]; UserError naming the option on anything else."""
    if value is None:
        return None
    try:
        items = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option} must be comma-separated positive integers, got {value!r}") from None
    if not items or any(item < 1 for item in items):
        raise UserError(f"{option} must be comma-separated positive integers, got {value!r}")
    return items


def report_path(db_url: str) -> Path:
    """The HTML report goes beside a SQLite database file, else to results/report.html."""
    from db.session import DEFAULT_DB_PATH, _sqlite_path

    path = _sqlite_path(db_url)
    return (path.parent if path is not None else DEFAULT_DB_PATH.parent) / "report.html"


def gigabytes(value: int | float | None) -> str:
    """Decimal GB with 4 significant digits, so tiny models' megabytes still show."""
    return "n/a" if value is None else f"{value / GB:.4g}"


def run(
    model: Optional[list[str]] = typer.Option(None, "--model", help=f"Model spec, repeatable (see `loopeval models`). Default: {', '.join(DEFAULTS.models)}."),
    suite: Optional[str] = typer.Option(None, "--suite", help=f"Suite name (see `loopeval suites`). Default: {DEFAULTS.suite}."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task names of the suite. Default: all."),
    loops: Optional[str] = typer.Option(None, "--loops", help=f"Comma-separated loop counts for looped models. Default: {','.join(map(str, DEFAULTS.loops))}."),
    samples: Optional[int] = typer.Option(None, "--samples", help=f"Samples per problem (pass@1 is their mean). Default: {DEFAULTS.samples} on synthetic, the suite's own elsewhere."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help=f"Sampling temperature, >= 0 (0 = greedy). Default: {DEFAULTS.temperature} on synthetic, the suite's own elsewhere."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help=f"Nucleus top-p in (0, 1]. Default: {DEFAULTS.top_p} on synthetic, the suite's own elsewhere."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help=f"New tokens per sample. Default: {DEFAULTS.max_new_tokens} on synthetic, the suite's own elsewhere (32768 for paper)."),
    limit: Optional[int] = typer.Option(None, "--limit", help=f"Docs per task. Default: {DEFAULTS.limit or 'all'} on synthetic, all elsewhere."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=f"Prompts per generate call. Default: {DEFAULTS.batch_size}."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights of random presets and for sampling."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Directory with local copies of suite datasets (JSONL or parquet)."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue the stopped run RUN_ID with its stored settings (other options are ignored)."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the HTML report beside the database at the end."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Let transformers:/vllm: models run code shipped in their directory (prints a warning)."),
    adapters_dir: Optional[list[str]] = typer.Option(None, "--adapters-dir", help="Folder of adapter plugin modules, repeatable (also LOOPEVAL_ADAPTERS)."),
) -> None:
    """Evaluate models x loop counts on a suite, storing every sample, metric and memory trace.

    With no arguments: the tiny models on the synthetic suite, loops 1,2,4,8 for looped models,
    paper sampling (temperature 1.0, top-p 0.7).
    """
    from harness.runner import RunSpec, failure_summary, prepare_sweep, resume_run, run_sweep

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
        store = Store.open(db)
        with _progress() as progress:
            outcomes = [resume_run(resume, store, db, progress=progress, log=progress.console.print)]
    else:
        plan = prepare_sweep(spec)  # unknown suite, task or model fails here, before the database opens
        store = Store.open(db)
        with _progress() as progress:
            outcomes = run_sweep(spec, plan, store, progress=progress, log=progress.console.print)
    ids = {o.run_id for o in outcomes}
    _print_table([r for r in store.run_summaries() if r["id"] in ids])
    url = resolve_db_url(db)
    typer.echo(f"results: {store.url}  (show them: loopeval results{'' if db is None else f' --db {db}'})")
    store.close()
    if report:
        from dashboards.report import write_report

        typer.echo(f"report: {write_report(url, report_path(url))}")
    failed = failure_summary(outcomes)
    if failed:
        typer.echo("\n".join(failed), err=True)
        raise typer.Exit(1)


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False)


def results(
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of runs instead of a table."),
) -> None:
    """Stored runs with sweep, model, loops, suite, status, samples, metrics and memory peaks (GB = 1e9 bytes)."""
    from db.store import Store
    from harness.sampler import MEASURES

    store = Store.open(db)
    runs = store.run_summaries()
    store.close()
    for summary in runs:
        summary["memory"] = {name: summary["memory"].get(name) for name in MEASURES}
    if as_json:
        typer.echo(json.dumps(runs, indent=2))
    elif runs:
        _print_table(runs)
    else:
        typer.echo("no runs stored yet: try `loopeval run`")


def _headline(pass_at_1: dict[str, Any]) -> str:
    """The suite mean of pass@1 over benchmarks, then one line per benchmark (see db.headline)."""
    lines = [f"mean {'n/a' if pass_at_1['mean'] is None else format(pass_at_1['mean'], '.3f')}"]
    lines += [f"{name} {'n/a' if value is None else f'{value:.3f}'}" for name, value in pass_at_1["benchmarks"].items()]
    return "\n".join(lines)


def _print_table(runs: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(caption="memory in GB = 1e9 bytes; n/a = source unavailable here")
    for column in ("id", "sweep", "model", "loops", "suite", "status", "samples", "pass@1 (suite mean; per benchmark)",
                   "weights", "kv peak", "torch alloc peak", "nvml proc peak", "rss peak"):
        table.add_column(column, justify="right" if column in ("id", "loops", "samples") else "left")
    for r in runs:
        memory = r["memory"]
        table.add_row(
            str(r["id"]), r["sweep_id"], r["model"], "-" if r["loops"] is None else str(r["loops"]), r["suite"],
            r["status"], str(r["n_samples"]), _headline(r["pass_at_1"]), gigabytes(memory.get("weights_bytes")),
            gigabytes(memory.get("kv_bytes_peak")), gigabytes(memory.get("torch_allocated_peak")),
            gigabytes(memory.get("nvml_process_peak")), gigabytes(memory.get("rss_peak")),
        )
    # Piped output would be cut to 80 columns and every cell truncated; let it be as wide as it needs.
    Console(width=None if sys.stdout.isatty() else 220).print(table)


def suites() -> None:
    """The suites `loopeval run --suite` accepts, one per line."""
    from suites.registry import list_suites

    for name, description in list_suites().items():
        typer.echo(f"{name}  {description}")


def models() -> None:
    """Model specs `loopeval run --model` accepts: adapter prefixes and built-in presets, one per line."""
    import adapters
    from adapters.config import PRESETS

    for entry in adapters.available():
        typer.echo(f"{entry.prefix}:...  {entry.description}")
    for name, config in PRESETS.items():
        typer.echo(f"preset:{name}  {config.family}, {config.num_layers} layers, loops {config.loops}, {config.kv_strategy} KV")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("results")(results)
    app.command("suites")(suites)
    app.command("models")(models)
