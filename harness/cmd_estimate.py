"""`loopeval estimate`: weights, KV and total bytes of a preset or config at a context length, from the config alone.

Imports only the analytic memory model and the config reader (no torch, lighteval, dash or vllm),
so it runs anywhere, the GPU machine included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from harness.errors import UserError

GB = 1e9  # decimal gigabytes, as the MELT paper reports them


def estimate(
    model: str = typer.Argument(..., help="A preset name (qwen3-1.7b, ouro-1.4b, melt-1.6b, ...-tiny) or a config.json / checkpoint directory."),
    tokens: int = typer.Option(..., "--tokens", help="Context length: prompt + generated tokens per sequence."),
    batch: int = typer.Option(1, "--batch", help="Sequences held at once."),
    loops: Optional[int] = typer.Option(None, "--loops", help="Loops at inference (r); default the trained loop count."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (params, weights_bytes, kv_bytes, total_bytes)."),
) -> None:
    """Predict memory: weights from the parameter shapes, KV for (tokens, batch, loops, dtype)."""
    from adapters.config import PRESETS, preset, read_config
    from adapters.memory import dtype_bytes
    from adapters.memory import estimate as analytic

    if dtype not in ("bf16", "fp16", "fp32"):
        raise UserError(f"--dtype must be one of bf16, fp16, fp32, got {dtype!r}")
    dtype_bytes(dtype)
    if tokens < 1:
        raise UserError(f"--tokens must be >= 1, got {tokens}")
    if batch < 1:
        raise UserError(f"--batch must be >= 1, got {batch}")
    if loops is not None and loops < 1:
        raise UserError(f"--loops must be >= 1, got {loops}")
    if model in PRESETS:
        config = preset(model)
    elif Path(model).exists() or "/" in model or model.endswith(".json"):
        config = read_config(model)
    else:
        raise UserError(f"unknown preset {model!r} (presets: {', '.join(PRESETS)}; or give a config.json or checkpoint directory)")
    result = analytic(config, tokens, batch=batch, loops=loops, dtype=dtype)
    if as_json:
        print(json.dumps({"params": result.params, "weights_bytes": result.weights_bytes, "kv_bytes": result.kv_bytes, "total_bytes": result.total_bytes}))
        return
    from rich.console import Console
    from rich.table import Table

    r = config.loops if loops is None else loops
    table = Table(title=f"{model}: {tokens} tokens x batch {batch}, loops {r}, {dtype} ({config.kv_strategy} KV)")
    table.add_column("measure")
    table.add_column("bytes", justify="right")
    table.add_column("GB (1e9 bytes)", justify="right")
    table.add_row("parameters", f"{result.params:,}", "")
    for name, value in (("weights", result.weights_bytes), ("KV cache", result.kv_bytes), ("total", result.total_bytes)):
        table.add_row(name, f"{value:,}", f"{value / GB:.3f}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
