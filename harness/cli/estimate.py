"""`loopeval estimate`: weights, KV and total bytes of a preset or config at a context length, from the config alone.

Imports only the analytic memory model and the config reader (no lighteval, dash or vllm),
so it runs anywhere, the GPU machine included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from harness.cli.common import GB, JsonFlag, print_table
from harness.errors import UserError


def estimate(
    model: str = typer.Argument(..., help="A preset name (qwen3-1.7b, ouro-1.4b, melt-1.6b, ...-tiny) or a config.json / checkpoint directory."),
    tokens: int = typer.Option(..., "--tokens", help="Context length: prompt + generated tokens per sequence."),
    batch: int = typer.Option(1, "--batch", help="Sequences held at once."),
    loops: Optional[int] = typer.Option(None, "--loops", help="Loops at inference (r); default the trained loop count."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
    as_json: JsonFlag = False,
) -> None:
    """Predict memory: weights from the parameter shapes, KV for (tokens, batch, loops, dtype)."""
    from adapters.engine.presets import PRESETS, preset
    from adapters.base import MODEL_DTYPES
    from adapters.engine.memory import estimate as analytic

    if dtype not in MODEL_DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(MODEL_DTYPES)}, got {dtype!r}")
    if tokens < 1:
        raise UserError(f"--tokens must be >= 1, got {tokens}")
    if batch < 1:
        raise UserError(f"--batch must be >= 1, got {batch}")
    if loops is not None and loops < 1:
        raise UserError(f"--loops must be >= 1, got {loops}")
    if model in PRESETS:
        config = preset(model)
    elif Path(model).exists() or "/" in model or model.endswith(".json"):
        from adapters.engine.checkpoint import read_config  # torch only for files, not presets

        config = read_config(model)
    else:
        raise UserError(f"unknown preset {model!r} (presets: {', '.join(PRESETS)}; or give a config.json or checkpoint directory)")
    result = analytic(config, tokens, batch=batch, loops=loops, dtype=dtype)
    if as_json:
        print(json.dumps({"params": result.params, "weights_bytes": result.weights_bytes, "kv_bytes": result.kv_bytes, "total_bytes": result.total_bytes}))
        return
    r = config.loops if loops is None else loops
    rows = [["parameters", f"{result.params:,}", ""]]
    rows += [[name, f"{value:,}", f"{value / GB:.3f}"] for name, value in
             (("weights", result.weights_bytes), ("KV cache", result.kv_bytes), ("total", result.total_bytes))]
    title = f"{model}: {tokens} tokens x batch {batch}, loops {r}, {dtype} ({config.kv_strategy} KV)"
    print_table(title, ["measure", "bytes", "GB (1e9 bytes)"], rows, right=("bytes", "GB (1e9 bytes)"))
