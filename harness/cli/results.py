"""`loopeval results`: how much accuracy per gigabyte, one evaluation set at a time.

The table answers the project's question for the latest sweep's evaluation set (`db.sets`), or the
one `--set` names: per point (model, loops, exit threshold, configuration), pass@1 with its 95% interval, memory
in auto-scaled decimal units, accuracy per GB, best first (or as `--rank` says), the Pareto frontier marked, and
under the same ranks what a generated token cost, then the answer in one sentence. Filters narrow the runs first;
`--tasks` shows each benchmark, `--profiles` the `loopeval profile` runs, and `--json` every field
of every matching run.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from harness.cli.common import DbOption, JsonFlag, console, print_answer, print_sentence, print_table
from harness.errors import UserError
from harness.hints import env_command, with_db


def results(
    db: DbOption = None,
    as_json: JsonFlag = False,
    sweep: str | None = typer.Option(None, "--sweep", help="Only the runs of this sweep (its id, or the start of it)."),
    model: list[str] | None = typer.Option(None, "--model", help="Only this model spec, repeatable."),
    suite: str | None = typer.Option(None, "--suite", help="Only runs of this suite."),
    last: int | None = typer.Option(
        None, "--last", min=1, help="Only the N most recently stored runs (after the other filters)."
    ),
    set_id: str | None = typer.Option(
        None,
        "--set",
        help="The evaluation set to show (its id, listed under the table). Default: the newest scored run's.",
    ),
    measure: str | None = typer.Option(
        None,
        "--measure",
        help="Memory measure (each run's peak): kv_bytes_allocated, 'weights_bytes + kv_bytes_allocated', nvml_process, ... "
        "Names before 0007 (kv_bytes_peak, ...) still work. Default: what the model holds, the process's NVML total on a GPU, "
        "else weights + KV cache peak.",
    ),
    rank: str | None = typer.Option(
        None,
        "--rank",
        help="What orders the rows, best first: per-gb (pass@1 per GB, the default), "
        "accuracy, per-layer-pass (pass@1 per layer pass per generated token), speed (tokens/s).",
    ),
    tasks: bool = typer.Option(False, "--tasks", help="pass@1 of each benchmark instead of memory."),
    metric: str | None = typer.Option(
        None,
        "--metric",
        help="What the rows score, from the stored samples: pass@K (unbiased, K up to the samples per problem n), "
        "maj@N (the majority answer of the first N samples) or avg@N. Default: the stored pass@1.",
    ),
    by_length: bool = typer.Option(
        False,
        "--by-length",
        help="pass@1 binned by generated length per row, and where each lever's outputs leave its reference's.",
    ),
    profiles: bool = typer.Option(
        False, "--profiles", help="The `loopeval profile` runs: memory against context length."
    ),
) -> None:
    """How much accuracy per gigabyte: per point (model, loops, exit threshold, configuration), pass@1 ± 95%, memory
    and pass@1 per GB, frontier marked; then what a generated token cost (loops and layer passes per token, tokens/s),
    and the best point, the frontier and the measure in one sentence."""
    from analysis.runs import run_records, with_per_kj
    from db.store import Store

    store = Store.read(db)
    try:
        for line in store.hide_damaged():  # on stderr: --json's output stays JSON
            typer.echo(line, err=True)
        runs = _filtered(run_records(store.engine), sweep, model, suite, last)
        if set_id is not None and all(r["set_id"] != set_id for r in runs):
            sets = sorted({r["set_id"] for r in runs if r["set_id"]})
            raise UserError(
                f"--set {set_id}: no such evaluation set among these runs (sets: {', '.join(sets) or 'none'})"
            )
        if as_json:  # every field of every run: its summary (`Store.run_summaries`)
            shown = {r["run_id"] for r in runs if set_id is None or r["set_id"] == set_id}
            typer.echo(json.dumps([with_per_kj(r) for r in store.run_summaries() if r["id"] in shown], indent=2))
        elif profiles:
            _print_profiles(store, [r["run_id"] for r in runs if r["kind"] == "profile"], db)
        elif by_length:
            _print_by_length(store.engine, runs, set_id)
        else:
            sentence = print_answer(
                store.engine, runs, set_id, measure, per_task=tasks, db=db, rank=rank, metric=metric
            )
            count = sum(r["kind"] == "profile" for r in runs)
            if count:
                console().print(
                    f"{count} profile run{'s' * (count > 1)}: {with_db(env_command('loopeval') + ' results --profiles', db)}",
                    markup=False,
                    highlight=False,
                )
            print_sentence(sentence)
    finally:
        store.close()


def _filtered(
    runs: list[dict[str, Any]], sweep: str | None, models: list[str] | None, suite: str | None, last: int | None
) -> list[dict[str, Any]]:
    """The runs the filters keep, oldest first; UserError when a filter names nothing stored."""
    if sweep is not None:
        runs = [r for r in runs if r["sweep_id"].startswith(sweep)]
        if not runs:
            raise UserError(f"--sweep {sweep}: no stored sweep has that id")
    if models:
        unknown = sorted(set(models) - {r["model"] for r in runs})
        if unknown:
            raise UserError(f"--model {unknown[0]}: no stored run of that model" + (" in that sweep" if sweep else ""))
        runs = [r for r in runs if r["model"] in models]
    if suite is not None:
        runs = [r for r in runs if r["suite"] == suite]
        if not runs:
            raise UserError(f"--suite {suite}: no stored run of that suite matches")
    return runs[-last:] if last is not None else runs


def _print_profiles(store: Any, run_ids: list[int], db: str | None) -> None:
    """One row per profiled (run, loops, batch) at its longest context: the analytic KV beside the measured peaks."""
    from analysis.names import PROFILE_EXAMPLE
    from db import queries
    from measures import byte_text

    points = queries.profile_points(store.engine)
    points = points[points["run_id"].isin(run_ids)]
    if points.empty:
        example = PROFILE_EXAMPLE.replace("loopeval", env_command("loopeval"), 1)
        typer.echo(f"no profile runs match; try `{with_db(example, db)}`")
        return
    rows = []
    for (run_id, loops, batch), group in points.groupby(["run_id", "loops", "batch"], dropna=False, sort=True):
        longest = group.sort_values("context_tokens").iloc[-1]
        peak = next((m for m in ("nvml_process", "torch_allocated", "rss") if longest[m] == longest[m]), None)
        rows.append(
            [
                str(run_id),
                longest["model"],
                "-" if loops != loops else str(int(loops)),
                str(int(batch)),
                f"{int(group['context_tokens'].min())}-{int(longest['context_tokens'])}",
                byte_text(longest["weights_bytes"]),
                byte_text(longest["kv_bytes_analytic"]),
                byte_text(longest["kv_bytes_allocated"]),
                "n/a" if peak is None else f"{byte_text(longest[peak])} {peak}",
            ]
        )
    print_table(
        None,
        ["run", "model", "r", "batch", "tokens", "weights", "KV analytic", "KV allocated", "peak"],
        rows,
        right=("run", "r", "batch", "weights", "KV analytic", "KV allocated"),
        fold=("model",),
        caption="at the longest context profiled; decimal units (1 GB = 1e9 bytes). "
        f"All points: {with_db(env_command('loopeval') + ' dashboard', db)} (memory against context length).",
    )


def _print_by_length(engine: Any, runs: list[dict[str, Any]], set_id: str | None) -> None:
    """Per row of the set, pass@1 of its samples in each generated-length bin (`analysis.items.by_length`), then, per
    lever row with its reference in the set (`analysis.claims.lever_pairs`), where its outputs leave the reference's
    under the same seed (`analysis.claims.divergence_summary`)."""
    from analysis.claims import SampleBook, divergence_summary, length_table
    from analysis.points import accuracy_points
    from analysis.runs import ordered_sets

    sets = ordered_sets([r for r in runs if r["kind"] == "eval"])
    if not sets:
        typer.echo("no evaluation runs match")
        return
    chosen = set_id or next(iter(sets))
    in_set = [r["run_id"] for r in runs if r["set_id"] == chosen]
    points = accuracy_points(engine, chosen, run_ids=in_set)
    book = SampleBook(engine, [i for ids in points["run_ids"] for i in ids])
    table = length_table(points, book)
    bins = list(dict.fromkeys(table.sort_values("low")["bin"]))
    rows = []
    for name, rows_of in table.groupby("name", sort=False):
        cells = {row.bin: f"{row.pass_at_1:.3f} ({row.samples})" for row in rows_of.itertuples()}
        rows.append([name, *(cells.get(b, "") for b in bins)])
    console().print(sets[chosen], markup=False, highlight=False)
    print_table(
        None,
        ["point", *bins],
        rows,
        right=tuple(bins),
        fold=("point",),
        caption="pass@1 of the samples whose output was that many generated tokens long (samples in brackets), "
        "each sample on its own.",
    )
    levers = divergence_summary(points, book)
    if not levers:
        return

    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    print_table(
        None,
        ["lever", "against", "paired", "left", "at char", "pass@1 left", "pass@1 same"],
        [
            [
                row["lever"],
                row["reference"],
                str(row["paired"]),
                share(row["diverged"]),
                "n/a" if row["median_position"] is None else f"{row['median_position']:g}",
                share(row["pass_at_1_diverged"]),
                share(row["pass_at_1_same"]),
            ]
            for row in levers
        ],
        right=("paired", "left", "at char", "pass@1 left", "pass@1 same"),
        fold=("lever", "against"),
        caption="each lever row against its reference (same model, r and set without the lever: the model's own KV, "
        "or fixed depth), its samples paired by seed, task, doc and sample index. left: the share whose output "
        "leaves the reference's; at char: the median first character that differs (a character is a token on the "
        "zoo's character tokenizer); pass@1 of the samples that left and of those that did not.",
    )
