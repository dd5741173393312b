"""What several commands share: option definitions, number parsing, byte formatting and tables.

Command modules import from here and never from each other, so each command reads on its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from adapters.threads import ENV_VAR as THREADS_ENV
from adapters.threads import SMALL_MODEL_PARAMS
from harness.errors import UserError
from harness.hints import env_command, with_db


DbOption = Annotated[
    Optional[str],
    typer.Option(
        "--db",
        help="Results database: a SQLAlchemy URL or a SQLite file path. "
        "Default: $LOOPEVAL_DB, else results/loopeval.sqlite under the working directory.",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
AdaptersDirOption = Annotated[
    Optional[list[str]],
    typer.Option("--adapters-dir", help="Folder of adapter plugin modules, repeatable (also LOOPEVAL_ADAPTERS)."),
]
TrustRemoteCodeFlag = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Let transformers:/vllm: models run code shipped in their directory (prints a warning)."),
]
DeviceOption = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
ThreadsOption = Annotated[
    Optional[int],
    typer.Option("--threads", help=f"torch CPU threads. Default: ${THREADS_ENV}, else 1 for models under "
                 f"{SMALL_MODEL_PARAMS // 1_000_000}M parameters (runs go side by side, one per core), else the cores this process may use."),
]


def parse_int_list(value: str | None, option: str, minimum: int = 1) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4], ranges included ('1-12'); UserError naming the option on anything else."""
    from harness.sweep import int_ranges

    return None if value is None else int_ranges(value, option, minimum)


def report_path(db_url: str) -> Path:
    """The HTML report goes beside a SQLite database file, else to results/report.html."""
    from db.session import DEFAULT_DB_PATH, sqlite_path

    path = sqlite_path(db_url)
    return (path.parent if path is not None else DEFAULT_DB_PATH.parent) / "report.html"


def check_device(device: str) -> None:
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")


def check_out_dir(path: Path, option: str) -> None:
    """UserError when `path` cannot become a writable folder; checked before training starts, creating nothing."""
    existing = path
    while not existing.exists():  # the nearest ancestor that exists ("." and "/" always do)
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {existing} is not writable")


def model_params(spec: str) -> int | None:
    """A model's parameters from its config, without loading it (None where its adapter can tell only once loaded)."""
    import adapters

    facts = adapters.inspect(spec)
    return None if facts is None else facts.get("params")


def use_threads(requested: int | None, params: int | None) -> Any:
    """Choose and apply torch's thread count for models of up to `params` parameters (None: unknown, treated
    as large; `adapters.threads`); a bad --threads or LOOPEVAL_THREADS is refused here, before any write."""
    from adapters.threads import apply, choose

    return apply(choose(params, requested))


def say_threads(chosen: Any) -> None:
    """The count, said once when the command starts its work (stderr: --json output stays JSON)."""
    typer.echo(f"threads: {chosen}", err=True)


def progress() -> Any:
    """The live view of a `loopeval run` job (`harness.progress.JobProgress`): the job, the sweep and run running now."""
    from harness.progress import JobProgress

    return JobProgress()


def console() -> Any:
    """The console tables print to: the terminal's width, or $COLUMNS; piped output without $COLUMNS gets
    the whole table (220 columns), not one squeezed to 80."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 220)


def print_table(title: str | None, columns: list[str], rows: list[list[str]], right: tuple[str, ...] = (),
                caption: str | None = None, fold: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> None:
    """A rich table. Columns in `fold` wrap long values onto more lines instead of cutting them to `zoo:…`;
    columns in `keep` never wrap, so a figure such as `0.670 ± 0.060` stays on one line on a narrow terminal.

    Cells and title are `Text`, not markup: a stored model name such as `[/bold]` is printed as written
    instead of styling the table or failing it with a MarkupError.
    """
    from rich.table import Table
    from rich.text import Text

    table = Table(title=None if title is None else Text(title), caption=caption, caption_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left",
                         overflow="fold" if column in fold else "ellipsis", no_wrap=column in keep)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console().print(table)


Z95 = 1.96  # the accuracy interval printed is the normal 95% interval, accuracy ± 1.96 standard errors


def _accuracy_text(accuracy: float | None, stderr: float | None) -> str:
    from db.headline import rounded

    if accuracy is None or accuracy != accuracy:
        return "n/a"
    return rounded(accuracy) + ("" if stderr is None or stderr != stderr else f" ± {rounded(Z95 * stderr)}")


def _per_gb_text(value: float) -> str:
    if value != value:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _loops(run: dict[str, Any]) -> int:
    return run["loops"] or 1  # a plain model runs once, as db.queries reads it


def _order_sets(runs: list[dict[str, Any]]) -> dict[str, str]:
    """set id -> label for the evaluation sets of `runs`, the default first: the set of the newest run with
    scores, as `db.queries.eval_sets` orders them."""
    return {r["set_id"]: r["set_label"] for r in sorted(runs, key=lambda r: (bool(r["metrics"]), r["id"]), reverse=True)}


def print_answer(store: Any, runs: list[dict[str, Any]], set_id: str | None = None, measure: str | None = None,
                 per_task: bool = False, db: str | None = None) -> None:
    """How much accuracy per gigabyte: one evaluation set of `runs` (run summaries, already filtered).

    Per (model, loops), its runs of the set with their seeds pooled (`db.queries.pooled_metrics`): the
    seed count, pass@1 (suite mean) with its 95% interval over every seed's items, memory at `measure`
    (default: the first measure the runs have, as the report's), accuracy per decimal GB, best first,
    the Pareto frontier marked, the runs. `per_task` prints each benchmark's pass@1 instead.
    Only runs of one set are compared (`db.sets`); the others are listed below the table. `db` is the
    database the user named, for the hints.
    """
    from dashboards import figures
    from dashboards.data import accuracy_points, ranked
    from db import queries
    from measures import canonical

    evals = [r for r in runs if r["kind"] == "eval"]
    sets = _order_sets(evals)
    measure = None if measure is None else canonical(measure)
    if measure is not None and measure not in figures.MEMORY_MEASURES:
        raise UserError(f"--measure must be one of {', '.join(figures.MEMORY_MEASURES)}, got {measure!r}")
    if not evals:
        typer.echo("no evaluation runs match" + ("" if runs else f"; try `{with_db(env_command('loopeval') + ' run', db)}`"))
        return
    chosen = set_id or next(iter(sets))
    in_set = {r["id"]: r for r in evals if r["set_id"] == chosen}
    points = accuracy_points(store.engine, chosen, run_ids=list(in_set))
    measure = measure or figures.default_measure(points)
    table = ranked(points, measure)
    shown = {(row.model, int(row.loops)) for row in table.itertuples()}
    unscored: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in in_set.values():
        if (run["model"], _loops(run)) not in shown:
            unscored.setdefault((run["model"], _loops(run)), []).append(run)

    # KV per token as the run summaries carry it (`Store.run_summaries`: the adapter's describe()), newest run's
    per_token = {(run["model"], _loops(run)): run["kv_bytes_per_token"] for run in in_set.values()}
    out = console()
    out.print(sets[chosen], markup=False, highlight=False)
    if per_task:
        pooled = queries.pooled_metrics(store.engine, chosen, run_ids=list(in_set))
        print_table(None, ["model", "r", "seeds", "task", "pass@1 ±95%", "runs"], _task_rows(table, pooled),
                    right=("r", "seeds", "pass@1 ±95%"), fold=("model", "runs"), keep=("pass@1 ±95%",), caption=POOLED_CAPTION)
    else:
        print_table(None, ["#", "model", "r", "seeds", "pass@1 ±95%", "memory", "KV/token", "pass@1/GB", "front", "runs"],
                    _ranking_rows(table, unscored, measure, per_token),
                    right=("#", "r", "seeds", "pass@1 ±95%", "memory", "KV/token", "pass@1/GB"), fold=("model", "runs"), keep=("pass@1 ±95%",),
                    caption=f"memory: {figures.measure_label(measure)}, decimal units (1 GB = 1e9 bytes); n/a = unavailable "
                            "here. KV/token: what one more token of context adds to the KV cache at r (the engine's analytic "
                            "count). ± is the 95% interval; * marks the Pareto frontier (no point has less memory and more "
                            f"accuracy). {POOLED_CAPTION} Memory is the largest peak of the row's runs.")
    counts = {other: sum(r["set_id"] == other for r in evals) for other in sets}
    others = [f"  {label} ({counts[other]} run{'s' * (counts[other] > 1)})" for other, label in sets.items() if other != chosen]
    if others:
        out.print(f"other evaluation sets, never mixed with this one ({with_db(env_command('loopeval') + ' results --set ID', db)}):\n"
                  + "\n".join(others),
                  markup=False, highlight=False)


POOLED_CAPTION = "A row pools its seeds: pass@1 and its interval are over every item of all of them."


def _ranking_rows(table: Any, unscored: dict[tuple[str, int], list[dict[str, Any]]], measure: str,
                  per_token: dict[tuple[str, int], int | None]) -> list[list[str]]:
    """`dashboards.data.ranked` rows, ranked where accuracy per GB is known, then (model, loops) of the set without a score.
    `per_token`: (model, loops) -> KV bytes per token (None: the adapter did not say)."""
    from db.sets import id_ranges
    from measures import byte_text

    rows = [[str(rank) if row.per_gb == row.per_gb else "", row.model, str(int(row.loops)), str(row.seeds),
             _accuracy_text(row.accuracy, row.stderr), byte_text(row.memory), byte_text(per_token.get((row.model, int(row.loops)))),
             _per_gb_text(row.per_gb), "*" if row.frontier else "", id_ranges(row.run_ids)] for rank, row in enumerate(table.itertuples(), 1)]
    for (model, loops), runs in unscored.items():
        newest = runs[-1]
        rows.append(["", model, str(loops), str(len({r["seed"] for r in runs})), newest["status"],
                     byte_text(newest["memory"].get(measure)), byte_text(per_token.get((model, loops))), "n/a", "",
                     id_ranges([r["id"] for r in runs])])
    return rows


def _task_rows(table: Any, pooled: Any) -> list[list[str]]:
    """Per ranked (model, loops): each benchmark's pass@1 with its interval (`db.headline`) from its seeds' pooled
    per-task values, each task group's mean (`db.headline.TASK_GROUPS`, `GROUP_PATTERNS`), then the suite mean."""
    from db.headline import SUITE, benchmark_stderrs, headline
    from db.sets import id_ranges

    rows = []
    for row in table.itertuples():
        tasks = pooled[(pooled["model"] == row.model) & (pooled["loops"] == row.loops) & (pooled["task"] != SUITE)]
        values: dict[str, dict[str, float | None]] = {}
        stderrs: dict[str, dict[str, float | None]] = {}
        for task in tasks.itertuples():
            values.setdefault(task.task, {})[task.metric] = task.value
            stderrs.setdefault(task.task, {})[task.metric] = None if task.stderr != task.stderr else task.stderr
        result, errors = headline(values, row.suite), benchmark_stderrs(stderrs)
        for index, (name, value) in enumerate(result.benchmarks.items()):
            first = index == 0
            rows.append([row.model if first else "", str(int(row.loops)) if first else "", str(row.seeds) if first else "",
                         name, _accuracy_text(value, errors.get(name)), id_ranges(row.run_ids) if first else ""])
        rows += [["", "", "", f"[{name}]", _accuracy_text(value, None), ""] for name, value in result.groups.items()]
        rows.append(["", "", "", "mean", _accuracy_text(row.accuracy, row.stderr), ""])
    return rows
