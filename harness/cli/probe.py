"""`loopeval probe MODEL`: what each loop does to the state (`adapters.engine.probes`), stored as a "probe" run.

The texts are the synthetic suite's test items (prompt and answer, as the zoo models were trained to
read them) or the lines of `--text-file`; each is cut to its first `--positions` tokens. The model
runs at r = the largest `--loops` value (default 2T, to see past the trained depth) and every loop
1..r is reported: for gated (MELT) models a loop's states depend on r through earlier chunks' rows,
so the values belong to that r.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import typer

from adapters.base import AdapterError
from adapters.files import MIB, read_text
from harness.cli.common import (
    DbOption,
    MkdirFlag,
    check_db_folder,
    ThreadsOption,
    model_params,
    parse_int_list,
    print_table,
    say_threads,
    use_threads,
)
from harness.errors import UserError
from harness.hints import env_command, with_db

PROBE_SUITES = ("synthetic",)  # suites whose texts ship with loopeval; others need --text-file
MAX_PROBE_LOOPS = 64  # the interaction needs one forward per skipped loop: r forwards of r loops per text
TEXT_FILE_LIMIT = 64 * MIB  # bytes of --text-file; only the first --positions tokens of each line are probed


def probe(
    model: str = typer.Argument(
        ..., help="Engine model spec with loops, e.g. zoo:ouro-tiny, preset:coreloop-tiny, ouro:/path."
    ),
    loops: str | None = typer.Option(
        None,
        "--loops",
        help="Loop counts or a range (1-12); the model runs at the largest, loops 1..r are reported. Default: 2T.",
    ),
    suite: str | None = typer.Option(
        None,
        "--suite",
        help=f"Suite whose test items are probed: {', '.join(PROBE_SUITES)} (default, unless --text-file).",
    ),
    tasks: str | None = typer.Option(None, "--tasks", help="Comma-separated tasks of the suite. Default: all."),
    text_file: Path | None = typer.Option(
        None, "--text-file", help="Probe these texts instead, one per non-empty line (UTF-8)."
    ),
    positions: int = typer.Option(64, "--positions", help="Tokens of each text probed (its first N)."),
    limit: int = typer.Option(4, "--limit", help="Texts per task (suite texts only)."),
    db: DbOption = None,
    mkdir: MkdirFlag = False,
    store: bool = typer.Option(True, "--store/--no-store", help="Store the values as a run of kind 'probe'."),
    threads: ThreadsOption = None,
) -> None:
    """Per loop: angular distance and relative update between successive states, normalised state variance,
    and computational interaction by lag (how much loop l's update changes when loop l - k is skipped)."""
    if positions < 1 or limit < 1:
        raise UserError(f"--positions and --limit must be positive integers, got {positions} and {limit}")
    if store:
        check_db_folder(db, mkdir)
    loop_list = parse_int_list(loops, "--loops")
    source, texts = _texts(suite, tasks, text_file, limit)
    adapter = _engine_adapter(model)
    r = max(loop_list) if loop_list else 2 * adapter.model.config.loops
    if r > MAX_PROBE_LOOPS:
        raise UserError(f"--loops: probe runs at most r = {MAX_PROBE_LOOPS} (its cost grows as r^2), got {r}")
    adapter.model.config.check_loops(r)
    chosen = use_threads(threads, model_params(model))
    results = _open_store(db) if store else None  # refused before measuring
    say_threads(chosen)
    try:
        began = time.perf_counter()
        values = _measure(adapter, texts, positions, r, model)
        run_id = (
            None if results is None else _store(results, model, adapter, source, r, values, time.perf_counter() - began)
        )
    finally:
        if results is not None:
            results.close()
    _print(values, r, adapter.model.config.loops)
    if run_id is not None:
        typer.echo(f"stored as probe run {run_id} (figure: {with_db(env_command('loopeval') + ' dashboard', db)})")


def _texts(suite: str | None, tasks: str | None, text_file: Path | None, limit: int) -> tuple[str, list[str]]:
    """(what was probed, the texts), validated before any model is loaded."""
    if text_file is not None:
        if suite is not None or tasks is not None:
            raise UserError("--text-file replaces --suite and --tasks: give one or the other")
        try:
            lines = [line for line in read_text(text_file, "--text-file", TEXT_FILE_LIMIT).splitlines() if line.strip()]
        except AdapterError as exc:
            raise UserError(str(exc)) from None
        if not lines:
            raise UserError(f"--text-file {text_file}: no non-empty line to probe")
        return f"text:{text_file.name}", lines
    suite = suite or PROBE_SUITES[0]
    if suite not in PROBE_SUITES:
        raise UserError(
            f"--suite {suite}: probe reads the texts of {', '.join(PROBE_SUITES)}; for other text use --text-file"
        )
    from suites import synthetic

    names = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else list(synthetic.TASKS)
    unknown = [t for t in names if t not in synthetic.TASKS]
    if unknown or not names:
        raise UserError(
            f"--tasks: unknown task {unknown[0] if unknown else tasks!r} of {suite} (tasks: {', '.join(synthetic.TASKS)})"
        )
    return suite, [
        synthetic.training_text(item) for task in names for item in synthetic.load_split(task, "test")[:limit]
    ]


def _engine_adapter(spec: str) -> Any:
    """The loaded adapter, which must run on the project's engine and loop (probes read its loop states)."""
    import adapters
    from adapters.engine.adapter import EngineAdapter

    adapter = adapters.load(spec, device="cpu", dtype="fp32")
    if not isinstance(adapter, EngineAdapter) or adapter.tokenizer is None:
        raise UserError(
            f"{spec}: probe needs a model on loopeval's engine with a tokenizer (zoo:, preset:*-tiny, ouro:, melt:, qwen3: checkpoints)"
        )
    if not adapter.model.shared:
        raise UserError(f"{spec}: has no shared layers, so there are no loops to probe")
    return adapter


def _open_store(db: str | None) -> Any:
    from db.store import Store

    return Store.open(db)


def _measure(adapter: Any, texts: list[str], positions: int, r: int, label: str) -> list[Any]:
    """The probe values, with a bar that counts each loop as it runs.

    Per text the probe runs all r loops once, then once per loop it may skip (`first_skip` on), the other
    r - 1 loops: r + skips x (r - 1) loops per text, where the interaction makes the cost grow as r^2.
    """
    import torch
    from rich.progress import Progress

    from adapters.engine.probes import first_skip, probe as probe_model
    from harness.progress import columns

    ids = [i for i in (torch.tensor(adapter.tokenizer.encode(text)[:positions]) for text in texts) if len(i)]
    skips = max(0, r - 1 - first_skip(adapter.model))
    with Progress(*columns(), transient=False) as bars:
        bar = bars.add_task(f"probe {label} r={r}, {len(ids)} texts: loops run", total=len(ids) * (r + skips * (r - 1)))
        return probe_model(adapter.model, ids, r, on_loop=lambda: bars.advance(bar))


def _store(results: Any, model: str, adapter: Any, source: str, r: int, values: list[Any], wall: float) -> int:
    """One finished run of kind "probe" holding every value; returns its id."""
    from db.record import PlannedRun
    from harness.execution.recorder import run_row

    adapter.loops = r
    run = PlannedRun(model, r, suite=source, tasks=(), sampling={}, seed=0, spec={"loops": r, "source": source})
    run_id = results.create_run(**run_row("probe", run, model_config=adapter.describe()))
    results.add_probe_values(
        run_id, [{"loop": v.loop, "metric": v.metric, "lag": v.lag, "value": v.value} for v in values]
    )
    results.finish_run(run_id, "finished", wall_seconds=wall)
    return run_id


def _print(values: list[Any], r: int, trained: int) -> None:
    """One row per loop: the three per-loop metrics and the interaction at lags 1 and 2."""
    table = {(v.loop, v.metric, v.lag): v.value for v in values}
    columns = [
        "loop",
        "angular distance / pi",
        "relative update",
        "state variance",
        "interaction lag 1",
        "interaction lag 2",
    ]
    keys = [
        ("angular_distance", None),
        ("relative_update", None),
        ("state_variance", None),
        ("interaction", 1),
        ("interaction", 2),
    ]

    def cell(value: float | None) -> str:
        return "-" if value is None else "n/a" if math.isnan(value) else f"{value:.4f}"

    rows = [
        [f"{l}{' *' if l > trained else ''}", *(cell(table.get((l, m, k))) for m, k in keys)] for l in range(1, r + 1)
    ]
    print_table(
        f"loop probes, r = {r}", columns, rows, right=tuple(columns), caption=f"* beyond the trained T = {trained}"
    )
