"""`loopeval profile MODEL --lengths ...`: memory and speed against context length, stored as a "profile" run."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import typer

from adapters.engine.kv.policies import KV_DTYPES, POLICIES_TEXT
from measures import byte_text
from harness.cli.common import (
    DbOption,
    JsonFlag,
    MkdirFlag,
    ThreadsOption,
    check_db_folder,
    parse_int_list,
    say_threads,
    use_threads,
)
from harness.errors import UserError
from harness.measurement.profiling import DECODE_STEPS, decode_sampling, plan_profile, profile_model


def profile(
    model: str = typer.Argument(
        ..., help="Model spec, e.g. zoo:melt-tiny, ouro-1.4b or ouro:/path/to/checkpoint (see `loopeval models`)."
    ),
    lengths: str = typer.Option(
        ...,
        "--lengths",
        help="Comma-separated context lengths to prefill, e.g. 64,256,448; each plus --decode-steps must fit the model's context.",
    ),
    loops: str | None = typer.Option(
        None,
        "--loops",
        help="Comma-separated loop counts or ranges such as 1-12 (looped models only). Default: the model's own.",
    ),
    batch: int = typer.Option(1, "--batch", help="Sequences per point."),
    decode_steps: int = typer.Option(DECODE_STEPS, "--decode-steps", help="Greedy decode steps after each prefill."),
    seed: int = typer.Option(0, "--seed", help="Seed for random preset weights and the prompt tokens."),
    kv_policy: str | None = typer.Option(
        None,
        "--kv-policy",
        help=f"The KV policy to profile under: {POLICIES_TEXT}. Default: the model's own.",
    ),
    kv_dtype: str | None = typer.Option(
        None, "--kv-dtype", help=f"The KV cache dtype: {', '.join(KV_DTYPES)}. Default: auto (the model's dtype)."
    ),
    as_json: JsonFlag = False,
    db: DbOption = None,
    mkdir: MkdirFlag = False,
    store: bool = typer.Option(True, "--store/--no-store", help="Store the points as a run of kind 'profile'."),
    threads: ThreadsOption = None,
) -> None:
    """Prefill to each length and decode a few steps: memory measures (decimal units, 1 GB = 1e9 bytes) beside the analytic KV."""
    if decode_steps < 1:
        raise UserError(f"--decode-steps must be a positive integer, got {decode_steps}")
    if store:
        check_db_folder(db, mkdir)
    loop_list = parse_int_list(loops, "--loops")
    plan = plan_profile(
        model,
        parse_int_list(lengths, "--lengths") or [],
        loop_list,
        batch,
        seed=seed,
        decode_steps=decode_steps,
        kv_policy=kv_policy,
        kv_dtype=kv_dtype,
    )
    chosen = use_threads(threads, plan.params)
    results = None
    if store:  # opened (a new file created) only once every option and point is checked, and before measuring
        from db.store import Store

        results = Store.open(db)
    say_threads(chosen)
    began = time.perf_counter()
    try:
        result = profile_model(plan, on_point=(lambda point: None) if as_json else _print_point)
        settings = {"lengths": plan.lengths, "loops": loop_list, "batch": batch, "decode_steps": decode_steps}
        run_id = None if results is None else _store(results, plan, result, settings, time.perf_counter() - began)
    finally:
        if results is not None:
            results.close()
    if as_json:
        typer.echo(json.dumps({"run_id": run_id, **dataclasses.asdict(result)}, indent=2))
    elif run_id is not None:
        typer.echo(f"stored as profile run {run_id}")


def _store(results: Any, plan: Any, result: Any, settings: dict[str, Any], wall: float) -> int:
    """Store the points as one finished run of kind "profile" (with the settings that made them, its KV policy and
    dtype where given); returns its id."""
    from db.record import PlannedRun
    from harness.execution.recorder import run_row

    loops = settings["loops"]
    run = PlannedRun(
        plan.spec,
        loops[0] if loops and len(loops) == 1 else None,
        suite="profile",
        tasks=(),
        sampling=dataclasses.asdict(decode_sampling(settings["decode_steps"])),
        seed=plan.seed,
        spec=settings,
        **plan.kv,
    )
    run_id = results.create_run(**run_row("profile", run, model_config=result.description))
    results.add_profile_points(run_id, result.points)
    results.set_memory_peaks(run_id, result.peaks)
    results.finish_run(run_id, "finished", wall_seconds=wall)
    return run_id


def _print_point(point: dict[str, Any]) -> None:
    loops = "-" if point["loops"] is None else point["loops"]
    typer.echo(
        f"tokens {point['context_tokens']:>7} batch {point['batch']} loops {loops}: "
        f"KV analytic {byte_text(point['kv_bytes_analytic'])}, allocated {byte_text(point['kv_bytes_allocated'])}, "
        f"torch peak {byte_text(point['torch_allocated'])}, NVML process {byte_text(point['nvml_process'])}, "
        f"RSS {byte_text(point['rss'])}, prefill {point['prefill_seconds']:.3f} s, "
        f"decode {point['decode_tokens_per_second'] or 0:.1f} tok/s"
    )
