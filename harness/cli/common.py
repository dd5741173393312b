"""What several commands share: option definitions, number parsing, byte formatting and tables.

Command modules import from here and never from each other, so each command reads on its own.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from adapters.threads import ENV_VAR as THREADS_ENV
from adapters.threads import SMALL_MODEL_PARAMS
from measures import MEMORY_MEASURES
from harness.errors import UserError
from harness.hints import env_command, with_db

if TYPE_CHECKING:
    from analysis.points import Key, Point


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Results database: a SQLAlchemy URL or a SQLite file path. "
        "Default: $LOOPEVAL_DB, else results/loopeval.sqlite under the working directory.",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
MkdirFlag = Annotated[
    bool,
    typer.Option(
        "--mkdir",
        help="Create the folder --db (or --out) names when it does not exist; without it a missing folder is "
        "refused (results/ under the working directory is always created).",
    ),
]
AdaptersDirOption = Annotated[
    list[str] | None,
    typer.Option("--adapters-dir", help="Folder of adapter plugin modules, repeatable (also LOOPEVAL_ADAPTERS)."),
]
TrustRemoteCodeFlag = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Let transformers:/vllm: models run code shipped in their directory (prints a warning).",
    ),
]
DeviceOption = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help=f"torch CPU threads. Default: ${THREADS_ENV}, else 1 for models under "
        f"{SMALL_MODEL_PARAMS // 1_000_000}M parameters (runs go side by side, one per core), else the cores this process may use.",
    ),
]


def parse_int_list(value: str | None, option: str, minimum: int = 1) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4], ranges included ('1-12'); UserError naming the option on anything else."""
    from harness.planning.options import int_ranges

    return None if value is None else int_ranges(value, option, minimum)


def report_path(db_url: str) -> Path:
    """The HTML report goes beside a SQLite database file, else to results/report.html."""
    from db.session import DEFAULT_DB_PATH, sqlite_path

    path = sqlite_path(db_url)
    return (path.parent if path is not None else DEFAULT_DB_PATH.parent) / "report.html"


def check_folder(path: Path, option: str, mkdir: bool, named: str | None = None) -> None:
    """UserError when the folder `path` goes into does not exist and --mkdir was not given, creating nothing.

    A typo in a folder name (`--db reslts/x.sqlite`) would otherwise start a new store where `loopeval results`
    never looks; --mkdir says the new folder is meant."""
    folder = path.expanduser().parent
    if not mkdir and not folder.exists():
        raise UserError(f"{option} {named or path}: the folder {folder} does not exist; create it, or pass --mkdir")


def check_db_folder(db: str | None, mkdir: bool) -> None:
    """`check_folder` for the SQLite file a run stores into: --db, else $LOOPEVAL_DB; the default results/ folder is
    created, as is anything over a server URL (a Postgres database has no folder)."""
    from db import DB_ENV
    from db.session import resolve_db_url, sqlite_path

    named = db or os.environ.get(DB_ENV)
    path = None if named is None else sqlite_path(resolve_db_url(named))
    if path is not None:
        check_folder(path, "--db" if db else DB_ENV, mkdir, named)


def check_device(device: str) -> None:
    from harness.planning.spec import checked_device

    checked_device("--device", device)


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


def console() -> Any:
    """The console tables print to: the terminal's width, or $COLUMNS; piped output without $COLUMNS gets
    the whole table (220 columns), not one squeezed to 80."""
    from rich.console import Console

    return Console(width=None if not piped() else 220)


def piped() -> bool:
    """Output to a pipe or a file with no $COLUMNS: lines of prose go whole (a log greps them as one line)."""
    return not sys.stdout.isatty() and "COLUMNS" not in os.environ


def print_table(
    title: str | None,
    columns: list[str],
    rows: list[list[str]],
    right: tuple[str, ...] = (),
    caption: str | None = None,
    fold: tuple[str, ...] = (),
    keep: tuple[str, ...] = (),
) -> None:
    """A rich table. Columns in `fold` wrap long values onto more lines instead of cutting them to `zoo:…`;
    columns in `keep` never wrap, so a figure such as `0.670 ± 0.060` stays on one line on a narrow terminal.

    Cells and title are `Text`, not markup: a stored model name such as `[/bold]` is printed as written
    instead of styling the table or failing it with a MarkupError. The title is printed above the table, not
    as its title, which rich wraps to the table's width (`loopeval estimate`'s title over three narrow columns).
    """
    from rich.table import Table
    from rich.text import Text

    table = Table(caption=caption, caption_justify="left")
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in right else "left",
            overflow="fold" if column in fold else "ellipsis",
            no_wrap=column in keep,
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out = console()
    if title is not None:
        out.print(Text(title), soft_wrap=piped())
    out.print(table)


def _accuracy_text(accuracy: float | None, stderr: float | None) -> str:
    """pass@1 with its 95% interval (`analysis.points.Z95` standard errors); n/a where unknown."""
    from analysis.points import Z95
    from db.headline import rounded

    if accuracy is None or accuracy != accuracy:
        return "n/a"
    return rounded(accuracy) + ("" if stderr is None or stderr != stderr else f" ± {rounded(Z95 * stderr)}")


def _per_gb_text(value: float | None) -> str:
    if value is None or value != value:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def print_answer(
    engine: Any,
    runs: list[dict[str, Any]],
    set_id: str | None = None,
    measure: str | None = None,
    per_task: bool = False,
    db: str | None = None,
    rank: str | None = None,
    metric: str | None = None,
) -> str | None:
    """How much accuracy per gigabyte: one evaluation set of `runs` (`analysis.runs.run_records`, already filtered).

    Per point (`analysis.points`: model, loops, exit threshold, configuration), its runs of the set with their seeds
    pooled: the seed count, pass@1 (suite mean) with its 95% interval over every seed's items, memory at `measure`
    (default as the report's, `analysis.names.default_measure`: what the model holds), accuracy per decimal GB and,
    where NVML counted the energy, per kJ, ranked by `rank` (`analysis.ranking.RANKINGS`; default accuracy per GB),
    the Pareto frontier marked; then, in a second table under the same ranks (two tables stay readable at 80
    columns), what a generated token cost. `per_task` prints each benchmark's pass@1 instead. Only runs of one set
    are compared (`db.sets`); the others are listed below the table. Returns the answer in one sentence
    (`analysis.answer.answer`, as the report's; None where nothing is scored), which the command prints last
    (`print_sentence`). `db` is the database the user named, for the hints. `metric` (pass@K, maj@N, avg@N; default
    the stored pass@1) is read from the samples instead (`analysis.claims.with_samples`), which also give each row's
    share of samples the token budget cut off, a column where any was.
    """
    from analysis.answer import answer
    from analysis.claims import SampleBook, with_samples
    from analysis.items import parse_metric
    from analysis.names import default_measure
    from analysis.points import accuracy_points, point_key
    from analysis.ranking import DEFAULT_RANKING, RANKINGS, ranked_points
    from analysis.runs import ordered_sets
    from db import queries
    from measures import canonical

    evals = [run for run in runs if run["kind"] == "eval"]
    sets = ordered_sets(evals)
    measure = None if measure is None else canonical(measure)
    if measure is not None and measure not in MEMORY_MEASURES:
        raise UserError(f"--measure must be one of {', '.join(MEMORY_MEASURES)}, got {measure!r}")
    rank = rank or DEFAULT_RANKING
    if rank not in RANKINGS:
        raise UserError(f"--rank must be one of {', '.join(RANKINGS)}, got {rank!r}")
    if metric is not None:
        try:
            parse_metric(metric)
        except ValueError as exc:
            raise UserError(f"--metric {exc}") from None
        if per_task:
            raise UserError("--metric ranks the points; --tasks shows each benchmark's stored pass@1: drop one")
    if not evals:
        hint = "" if runs else f"; try `{with_db(env_command('loopeval') + ' run', db)}`"
        typer.echo("no evaluation runs match" + hint)
        return None
    chosen = set_id or next(iter(sets))
    in_set = [run for run in evals if run["set_id"] == chosen]
    points = accuracy_points(engine, chosen, run_ids=[run["run_id"] for run in in_set])
    try:
        points = with_samples(points, SampleBook(engine, [i for ids in points["run_ids"] for i in ids]), metric)
    except ValueError as exc:
        raise UserError(f"--metric {exc}") from None
    measure = measure or default_measure(points)
    table = ranked_points(points, measure, rank)
    shown = {point.key for point in table}
    unscored: dict[Key, list[dict[str, Any]]] = {}
    for run in in_set:
        if point_key(run) not in shown:
            unscored.setdefault(point_key(run), []).append(run)

    per_token = {
        point_key(run): run["kv_bytes_per_token"] for run in in_set
    }  # the newest run's, as it described itself
    configs = _config_cells([*(point.key for point in table), *unscored])
    out = console()
    out.print(sets[chosen], markup=False, highlight=False)
    if per_task:
        pooled = queries.pooled_metrics(engine, chosen, run_ids=[run["run_id"] for run in in_set])
        print_table(
            None,
            ["model", "r", "seeds", "task", "pass@1 ±95%", "runs"],
            _task_rows(table, pooled, configs),
            right=("r", "seeds", "pass@1 ±95%"),
            fold=("model", "r", "runs"),
            keep=("pass@1 ±95%",),
            caption=POOLED_CAPTION,
        )
    else:
        _print_ranking(table, unscored, measure, rank, per_token, configs)
    counts = Counter(run["set_id"] for run in evals)
    others = [
        f"  {label} ({counts[other]} run{'s' * (counts[other] > 1)})"
        for other, label in sets.items()
        if other != chosen
    ]
    if others:
        out.print(
            f"other evaluation sets, never mixed with this one ({with_db(env_command('loopeval') + ' results --set ID', db)}):\n"
            + "\n".join(others),
            markup=False,
            highlight=False,
        )
    return None if points.empty else answer(points, measure, rank)


def print_sentence(sentence: str | None) -> None:
    """The answer, a command's last line: wrapped between words to a terminal (`console`) or $COLUMNS; whole, on one
    line, into a pipe or a file (`piped`), where a wrap at 220 columns would split a value from its unit."""
    if sentence is not None:
        console().print(sentence, markup=False, highlight=False, soft_wrap=piped())


def _config_cells(keys: list[Key]) -> dict[Key, str]:
    """Each row's configuration as far as it tells the row apart (`analysis.names.config_labels`), scored rows
    and rows without a score alike."""
    import pandas as pd

    from analysis.names import config_labels
    from analysis.points import POINT

    return dict(zip(keys, config_labels(pd.DataFrame(keys, columns=POINT))))


POOLED_CAPTION = "A row pools its seeds: pass@1 and its interval are over every item of all of them."
EXIT_CAPTION = "exit: the per-token exit threshold (--exit-threshold), of the exit gate unless a criterion is named; - = the model's own policy."
CONFIG_CAPTION = (
    "config: what tells a model's rows apart: its KV policy and dtype (--kv-policy, --kv-dtype) and per-model "
    "overrides (a sweep file's); blank = none."
)
COMPUTE_CAPTION = (
    "what one generated token cost, same rows. KV/token: what one more token of context adds to the KV cache "
    "at r (the engine's analytic count). loops/tok: loops run per generated token, its mean (below r where "
    "tokens exit early). layers/tok: decoder-layer passes per generated token (prelude + coda + shared x loops; "
    "n/a where the adapter does not give its layers). tokens/s: generated tokens per second inside generate, "
    "prefill included."
)
CUT_CAPTION = (
    "cut off: the share of the row's samples the new-token budget (or the context) ended, which score 0 "
    "for a reason no accuracy shows."
)
ENERGY_CAPTION = (
    "pass@1/kJ: pass@1 per kJ of the GPU energy one of the row's runs drew (NVML's counter; the device's, so "
    "other processes on it count too); energy/run: that energy."
)


def _print_ranking(
    table: list[Point],
    unscored: dict[Key, list[dict[str, Any]]],
    measure: str,
    rank: str,
    per_token: dict[Key, int | None],
    configs: dict[Key, str],
) -> None:
    """The ranking and, under the same ranks, what a generated token cost: two tables, so each stays readable at 80
    columns. The exit column appears only where the set sweeps the exit axis, the config column only where a model
    has rows of several configurations, the seeds column only where a row pools several seeds."""
    from analysis.names import NOT_MEASURED, measure_words
    from analysis.ranking import RANKINGS

    swept = any(key[2] is not None for key in (*(point.key for point in table), *unscored))
    shown = _Columns(swept, any(configs.values()), any(point.energy_joules is not None for point in table))
    shown = replace(shown, cut=any((point.cut or 0) > 0 for point in table))
    energy = ["pass@1/kJ"] * shown.energy
    metric = table[0].metric if table else "pass@1"
    scored, per_gb = f"{metric} ±95%", f"{metric}/GB"
    cut = ["cut off"] * shown.cut
    seeds = any(point.seeds > 1 for point in table) or any(
        len({r["seed"] for r in runs}) > 1 for runs in unscored.values()
    )
    key = ["#", "model", "r", *(["exit"] * shown.exit), *(["config"] * shown.config)]
    column = RANKINGS[rank][0]
    print_table(
        None,
        [*key, *(["seeds"] * seeds), scored, *cut, "memory", per_gb, *energy, "runs"],
        _ranking_rows(table, column, unscored, measure, shown, seeds, configs),
        right=("#", "r", "exit", "seeds", scored, *cut, "memory", per_gb, *energy),
        fold=("model", "config", "runs"),
        keep=(scored,),
        caption=f"ranked by {RANKINGS[rank][1]}; * marks the Pareto frontier (no point has less memory and more "
        f"accuracy). memory: {measure_words(measure)}, the largest peak of the row's runs, decimal "
        f"units (1 GB = 1e9 bytes); n/a = unavailable here. ± is the 95% interval. "
        + (POOLED_CAPTION if seeds else "One seed a row.")
        + (f" {EXIT_CAPTION}" if swept else "")
        + (f" {CONFIG_CAPTION}" if shown.config else "")
        + (f" {ENERGY_CAPTION}" if shown.energy else f" pass@1 per kJ of GPU energy: {NOT_MEASURED}.")
        + (f" {CUT_CAPTION}" if shown.cut else ""),
    )
    print_table(
        None,
        [*key, "KV/token", "loops/tok", "layers/tok", "tokens/s", *["energy/run"] * shown.energy],
        _compute_rows(table, column, unscored, per_token, shown, configs),
        right=("#", "r", "exit", "KV/token", "loops/tok", "layers/tok", "tokens/s", "energy/run"),
        fold=("model", "config"),
        caption=COMPUTE_CAPTION,
    )


@dataclass(frozen=True)
class _Columns:
    """Which of the optional columns the tables show: the exit and config keys, the energy (where NVML counted it)."""

    exit: bool
    config: bool
    energy: bool
    cut: bool = False


def _rank_text(rank: int, point: Point, column: str) -> str:
    """The point's rank, '*' on the Pareto frontier; blank where the ranking's value is unknown (listed last)."""
    return "" if getattr(point, column) is None else f"{rank}{'*' if point.frontier else ''}"


def _exit_cell(threshold: float | None, criterion: str | None) -> str:
    """The exit column: the gate's threshold alone ('0.5'), another criterion's named ('kl 0.1'), '-' off the axis."""
    from analysis.names import exit_label
    from harness.planning.defaults import DEFAULT_EXIT_CRITERION

    return exit_label(threshold, None if criterion == DEFAULT_EXIT_CRITERION else criterion)


def _key_cells(key: Key, shown: _Columns, configs: dict[Key, str]) -> list[str]:
    return [key[0], str(key[1]), *([_exit_cell(key[2], key[3])] * shown.exit), *([configs[key]] * shown.config)]


def _ranking_rows(
    table: list[Point],
    column: str,
    unscored: dict[Key, list[dict[str, Any]]],
    measure: str,
    shown: _Columns,
    seeds: bool,
    configs: dict[Key, str],
) -> list[list[str]]:
    """The ranked points in their order, then the points of the set without a score; the seed count only where
    `seeds`, pass@1 per kJ only where `shown.energy` ("not measured" in a row whose runs had no counter)."""
    from db.sets import id_ranges
    from measures import byte_text

    def per_kj(value: float | None) -> list[str]:
        return [("not measured" if value is None else _per_gb_text(value))] * shown.energy

    rows = [
        [
            _rank_text(rank, point, column),
            *_key_cells(point.key, shown, configs),
            *[str(point.seeds)] * seeds,
            _accuracy_text(point.accuracy, point.stderr),
            *[_share_text(point.cut)] * shown.cut,
            byte_text(point.memory),
            _per_gb_text(point.per_gb),
            *per_kj(point.per_kj),
            id_ranges(list(point.run_ids)),
        ]
        for rank, point in enumerate(table, 1)
    ]
    for key, runs in unscored.items():
        newest = runs[-1]
        rows.append(
            [
                "",
                *_key_cells(key, shown, configs),
                *[str(len({r["seed"] for r in runs}))] * seeds,
                newest["status"],
                *["n/a"] * shown.cut,
                byte_text(newest.get(measure)),
                "n/a",
                *["n/a"] * shown.energy,
                id_ranges([r["run_id"] for r in runs]),
            ]
        )
    return rows


def _compute_rows(
    table: list[Point],
    column: str,
    unscored: dict[Key, list[dict[str, Any]]],
    per_token: dict[Key, int | None],
    shown: _Columns,
    configs: dict[Key, str],
) -> list[list[str]]:
    """The same rows as `_ranking_rows`, with what a generated token cost (`measures.COMPUTE_MEASURES`)."""
    from measures import byte_text, energy_text

    rows = [
        [
            _rank_text(rank, point, column),
            *_key_cells(point.key, shown, configs),
            byte_text(per_token.get(point.key)),
            _number_text(point.loops_per_token),
            _number_text(point.layer_passes_per_token),
            _number_text(point.tokens_per_second),
            *[energy_text(point.energy_joules)] * shown.energy,
        ]
        for rank, point in enumerate(table, 1)
    ]
    rows += [
        [
            "",
            *_key_cells(key, shown, configs),
            byte_text(per_token.get(key)),
            "n/a",
            "n/a",
            "n/a",
            *["n/a"] * shown.energy,
        ]
        for key in unscored
    ]
    return rows


def _share_text(value: float | None) -> str:
    """A share as a percentage; n/a where unknown."""
    return "n/a" if value is None or value != value else f"{value:.0%}"


def _number_text(value: float | None) -> str:
    """3 significant digits, thousands grouped; n/a where unknown."""
    if value is None or value != value:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _task_rows(table: list[Point], pooled: Any, configs: dict[Key, str]) -> list[list[str]]:
    """Per ranked point: each benchmark's pass@1 with its interval (`db.headline`) from its seeds' pooled
    per-task values, each task group's mean (`db.headline.TASK_GROUPS`, `GROUP_PATTERNS`), then the suite mean."""
    from analysis.points import POINT, point_key
    from db.headline import SUITE, benchmark_stderrs, headline
    from db.sets import id_ranges

    rows = []
    for row in table:
        same = pooled[POINT].apply(lambda point, row=row: point_key(point) == row.key, axis=1)
        tasks = pooled[same & (pooled["task"] != SUITE)]
        values: dict[str, dict[str, float | None]] = {}
        stderrs: dict[str, dict[str, float | None]] = {}
        for task in tasks.itertuples():
            values.setdefault(task.task, {})[task.metric] = task.value
            stderrs.setdefault(task.task, {})[task.metric] = None if task.stderr != task.stderr else task.stderr
        result, errors = headline(values, row.suite), benchmark_stderrs(stderrs)
        for index, (name, value) in enumerate(result.benchmarks.items()):
            first = index == 0
            key = row.key
            exit_at = "" if key[2] is None else f"exit {_exit_cell(key[2], key[3])}"
            r = " ".join(part for part in (str(key[1]), exit_at, configs[key]) if part)
            rows.append(
                [
                    row.model if first else "",
                    r if first else "",
                    str(row.seeds) if first else "",
                    name,
                    _accuracy_text(value, errors.get(name)),
                    id_ranges(list(row.run_ids)) if first else "",
                ]
            )
        rows += [["", "", "", f"[{name}]", _accuracy_text(value, None), ""] for name, value in result.groups.items()]
        rows.append(["", "", "", "mean", _accuracy_text(row.accuracy, row.stderr), ""])
    return rows
