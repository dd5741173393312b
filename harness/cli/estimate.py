"""`loopeval estimate`: weights, KV and total bytes of a model at a context length, from its config alone.

It takes the model specs every command takes (`adapters.resolve`: `preset:ouro-1.4b`, bare
`ouro-1.4b`, `zoo:melt-tiny`, `ouro:/ckpt`) and reads the engine config through `adapters.inspect`,
without loading weights; no lighteval, dash or vllm is imported, so it runs anywhere, the GPU
machine included.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

from adapters.engine.kv.policies import KV_DTYPES, POLICIES_TEXT
from harness.cli.common import JsonFlag, print_table
from measures import GB
from harness.errors import UserError

if TYPE_CHECKING:
    from adapters.engine.config import LoopConfig


def estimate(
    model: str = typer.Argument(
        ...,
        help="Model spec: ouro-1.4b, preset:melt-1.6b, zoo:melt-tiny, ouro:/path/to/checkpoint ... (see `loopeval models`).",
    ),
    tokens: int = typer.Option(
        ...,
        "--tokens",
        help="Context length: prompt + generated tokens per sequence (beyond the model's context, the figure is printed with a note that a run could not reach it).",
    ),
    batch: int = typer.Option(1, "--batch", help="Sequences held at once."),
    loops: int | None = typer.Option(None, "--loops", help="Loops at inference (r); default the trained loop count."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
    kv_policy: str | None = typer.Option(
        None,
        "--kv-policy",
        help=f"KV policy: {POLICIES_TEXT}; default the model's own.",
    ),
    kv_dtype: str = typer.Option(
        "auto",
        "--kv-dtype",
        help=f"KV storage: {', '.join(KV_DTYPES)} (auto: the model's dtype; int8 and fp8 keep a float32 scale per token and head).",
    ),
    as_json: JsonFlag = False,
) -> None:
    """Predict memory: weights from the parameter shapes, KV for (tokens, batch, loops, dtype, KV policy and dtype)."""
    import adapters
    from adapters.base import MAX_CONTEXT, MODEL_DTYPES
    from adapters.engine.config import MAX_LOOPS, LoopConfig
    from adapters.engine.memory import estimate as analytic
    from harness.measurement.capacity import context_excess

    if dtype not in MODEL_DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(MODEL_DTYPES)}, got {dtype!r}")
    if not 1 <= tokens <= MAX_CONTEXT:
        raise UserError(f"--tokens must be from 1 to {MAX_CONTEXT} (beyond any model's context), got {tokens}")
    if batch < 1:
        raise UserError(f"--batch must be >= 1, got {batch}")
    if loops is not None and not 1 <= loops <= MAX_LOOPS:
        raise UserError(f"--loops must be an integer from 1 to {MAX_LOOPS}, got {loops}")
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    spec = adapters.resolve(model)
    overrides = {"loops": loops, "dtype": dtype, "kv_policy": kv_policy, "kv_dtype": kv_dtype}
    facts = adapters.inspect(spec, **{k: v for k, v in overrides.items() if v is not None})
    if facts is None or "config" not in facts:
        raise UserError(
            f"{spec}: estimate reads an engine config (preset:, zoo:, qwen3:, ouro:, melt:, huginn:, retrofit: specs); this adapter has none"
        )
    config = LoopConfig.from_dict(facts["config"])
    result = analytic(config, tokens, batch=batch, loops=loops, dtype=dtype)
    excess = context_excess(spec, facts, "--tokens", tokens)
    note = None if excess is None else f"{excess}: a run could not reach it (the figures are the analytic model's)"
    if as_json:
        print(
            json.dumps(
                {
                    "params": result.params,
                    "weights_bytes": result.weights_bytes,
                    "kv_bytes": result.kv_bytes,
                    "total_bytes": result.total_bytes,
                    "kv_policy": facts["kv_policy"],
                    "kv_dtype": facts["kv_dtype"],
                    "kv_bytes_per_token": facts["kv_bytes_per_token"],
                }
            )
        )
        if note is not None:
            print(note, file=sys.stderr)
        return
    r = config.loops if loops is None else loops
    rows = [["parameters", f"{result.params:,}", ""]]
    rows += [
        [name, f"{value:,}", f"{value / GB:.3f}"]
        for name, value in (
            ("weights", result.weights_bytes),
            ("KV cache", result.kv_bytes),
            ("total", result.total_bytes),
        )
    ]
    title = (
        f"{spec}: {tokens} tokens x batch {batch}, loops {r}, {dtype} ({facts['kv_policy']} KV in {config.kv_dtype})"
    )
    print_table(title, ["measure", "bytes", "GB (1e9 bytes)"], rows, right=("bytes", "GB (1e9 bytes)"))
    print(kv_terms(config, r, dtype))
    if note is not None:
        print(note)


def kv_terms(config: LoopConfig, loops: int, dtype: str) -> str:
    """The KV line's terms: bytes per token as K and V x entries x heads x one row's bytes, and where the entries come from."""
    from adapters.engine.kv.layouts import layout_of
    from adapters.engine.memory import analytic_terms, dtype_bytes

    layout = layout_of(config)
    entries = layout.entries(config, loops)
    source = (
        f"{config.prelude_layers} prelude + {config.shared_layers} shared x {loops} loops + {config.coda_layers} coda"
        if layout.grows_with_loops
        else f"one per layer, {layout.policy}"
    )
    per_token = analytic_terms(config, loops, dtype)["kv_bytes_per_token"]
    row = (
        f"head dim {config.head_dim} x {dtype_bytes(dtype)} bytes"
        if config.kv_dtype == "auto"
        else f"(head dim {config.head_dim} x 1 {config.kv_dtype} byte + a 4-byte float32 scale)"
    )
    return f"KV per token: {per_token:,} bytes = 2 (K, V) x {entries} entries ({source}) x {config.num_kv_heads} KV heads x {row}"
