"""Batch-1 decode latency against context: the slope and the intercept, each against its memory-read bound.

vLLM's method (its FP8 KV-cache post): at batch 1 the inter-token latency is close to a line in the context c,

    latency(c) = slope * c + intercept.

The intercept is the cost that does not grow with the context: mostly reading the weights, where a looped model
reads its shared layers' weights again at every loop. The slope is the cost of one more token of context: reading
its K/V rows. Each is set against the time reading those bytes at the device's bandwidth would take, so 1.0 is the
bound (vLLM reports about 0.70 for the intercept and 0.89 for the slope on an H100):

    intercept ratio = weight bytes read per step / bandwidth / intercept
    slope ratio     = K/V bytes read per context token per step / bandwidth / slope

Bytes read are not bytes held. At every loop each attention call reads one K/V row pair per earlier token: the
loop's own entry under per-loop KV, the token's one entry under shared-last and MELT's gate. So a decode step
reads r times a layer's rows under every policy, and sharing cuts what is held (r times), not what one step
reads; int8 cuts both (a row is head_dim bytes and a float32 scale instead of head_dim values of the model's
dtype). `bytes_read` below is that arithmetic, from the model's own parameters and the layout's rows.

On the CPU a model keeps a preset's real shapes (width, heads, FFN, vocabulary) with fewer layers (`--layers`;
time per step is linear in layers and the ratios are per byte) and random weights. The cache is filled with random
rows up to each context instead of a prefill (a step reads the same bytes either way; a 32,000-token prefill of a
looped model takes many minutes on two cores), and each timed step writes its row at the same slot. The
bandwidth is measured in the same process, before and after the sweep (the best of both: the bound is the most
the machine gave): the best of several sums over a buffer far larger than the caches, on the same threads.

    python bench/bench_slope.py                                   # CPU: qwen3-1.7b and ouro-1.4b shapes, r = 4
    python bench/bench_slope.py --device cuda --dtype bf16 --layers 0 --json slope.json   # GPU, every layer
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.engine.config import LoopConfig  # noqa: E402
from adapters.engine.io.checkpoint import random_model  # noqa: E402
from adapters.engine.io.presets import preset  # noqa: E402
from adapters.engine.kv.cache import KVCache  # noqa: E402
from adapters.engine.kv.format import KV_FORMATS  # noqa: E402
from adapters.engine.kv.layouts import layout_of  # noqa: E402
from adapters.engine.model import LoopedLM  # noqa: E402
from measures import GB  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MS, US = 10**3, 10**6  # a second in milliseconds and microseconds (times; bytes are measures.GB's)
# each lever as the config fields it sets; a lever a model's KV strategy does not admit is skipped for it
LEVERS = {
    "own": {},
    "shared-last": {"kv_policy": "shared-last"},
    "int8": {"kv_dtype": "int8"},
    "fp8": {"kv_dtype": "fp8"},
}


@dataclass(frozen=True)
class Fit:
    """latency = slope * context + intercept (seconds), and the largest residual as a share of the latency."""

    slope: float
    intercept: float
    residual: float


def fit_line(contexts: list[int], latencies: list[float]) -> Fit:
    """Least squares over the measured points."""
    n, mx, my = len(contexts), statistics.fmean(contexts), statistics.fmean(latencies)
    sxx = sum((x - mx) ** 2 for x in contexts)
    slope = sum((x - mx) * (y - my) for x, y in zip(contexts, latencies)) / sxx
    intercept = my - slope * mx
    worst = max(abs(y - (slope * x + intercept)) / y for x, y in zip(contexts, latencies)) if n else 0.0
    return Fit(slope, intercept, worst)


def bytes_read(model: LoopedLM, loops: int) -> tuple[int, int]:
    """(weight bytes, K/V bytes per context token) one batch-1 decode step reads at `loops` loops."""
    cfg = model.config

    def size(module: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    body = model.model
    head = model.lm_head.weight if model.lm_head is not None else body.embed_tokens.weight
    weights = (
        sum(size(layer) for layer in [*body.prelude, *body.coda])
        + loops * sum(size(layer) for layer in body.shared)
        + size(body.norm)
        + head.numel() * head.element_size()
    )
    calls = len(body.prelude) + len(body.coda) + loops * len(body.shared)  # attention calls a step makes
    row = KV_FORMATS[cfg.kv_dtype].row_bytes(cfg.head_dim, head.element_size())
    return weights, calls * 2 * cfg.num_kv_heads * row


def read_bandwidth(device: torch.device, gigabytes: float = 1.0, rounds: int = 5) -> float:
    """Bytes per second of the best of `rounds` sums over a buffer of `gigabytes`."""
    buffer = torch.ones(int(gigabytes * GB) // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        buffer.sum().item()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def filled_cache(model: LoopedLM, loops: int, context: int, dtype: torch.dtype, device: torch.device) -> KVCache:
    """A batch-1 cache with random rows written at slots 0..context-1, through the format's own packing."""
    cfg = model.config
    cache = KVCache(cfg, layout_of(cfg), 1, context + 1, loops, dtype, device)
    fmt, generator = cache.format, torch.Generator(device=device).manual_seed(0)
    for entry in range(cache.k.shape[0]):
        for start in range(0, context, 4096):
            n = min(4096, context - start)
            k, v = (
                torch.randn(1, cfg.num_kv_heads, n, cfg.head_dim, generator=generator, device=device, dtype=dtype)
                for _ in range(2)
            )
            cache.k[entry, :, :, start : start + n], cache.v[entry, :, :, start : start + n] = fmt.pack_pair(k, v)
    cache.length = context
    return cache


def step_seconds(model: LoopedLM, cache: KVCache, loops: int, steps: int) -> float:
    """The best time of `steps` decode steps at the cache's length (after one untimed), each at the same slot."""
    device = cache.k.device
    token = torch.tensor([[5]], device=device)
    position = torch.tensor([[cache.length]], device=device)
    times = []
    for i in range(steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.step(token, position, cache, cache.length, None, loops=loops)
        model.logits(out.states[0]).argmax(-1).item()  # the head, and the host waits for the step
        if i:
            times.append(time.perf_counter() - start)
    return min(times)


def sweep(
    name: str, lever: str, loops: int, layers: int, contexts: list[int], dtype: str, device: torch.device, steps: int
) -> dict | None:
    """One preset under one lever: latency at each context, the fit, and the bytes a step reads (None: a sharing
    lever on a model without per-loop KV). `layers` replaces the shared layers' count (the presets here have no
    prelude or coda)."""
    cfg: LoopConfig = preset(name)
    if "kv_policy" in LEVERS[lever] and cfg.kv_strategy != "per_loop":
        return None
    cfg = replace(cfg, **LEVERS[lever], **({"shared_layers": layers} if layers else {}))
    r = loops if cfg.kv_strategy != "standard" else 1
    torch_dtype = DTYPES[dtype]
    model = random_model(cfg, 0, torch_dtype, device)
    latencies = []
    with torch.inference_mode():
        for context in contexts:
            cache = filled_cache(model, r, context, torch_dtype, device)
            latencies.append(step_seconds(model, cache, r, steps))
            del cache
    weights, kv_per_token = bytes_read(model, r)
    fit = fit_line(contexts, latencies)
    return {
        "preset": name,
        "lever": lever,
        "loops": r,
        "layers": cfg.num_layers,
        "latency_ms": {c: round(t * MS, 3) for c, t in zip(contexts, latencies)},
        "weight_bytes_read": weights,
        "kv_bytes_read_per_token": kv_per_token,
        "slope_us_per_token": fit.slope * US,
        "intercept_ms": fit.intercept * MS,
        "worst_residual": fit.residual,
    }


def with_ratios(row: dict, bandwidth: float) -> dict:
    """The row with each bound (bytes / bandwidth) and measured / bound as bound time / measured time."""
    slope_bound = row["kv_bytes_read_per_token"] / bandwidth
    intercept_bound = row["weight_bytes_read"] / bandwidth
    return {
        **row,
        "slope_bound_us_per_token": slope_bound * US,
        "intercept_bound_ms": intercept_bound * MS,
        "slope_ratio": slope_bound * US / row["slope_us_per_token"] if row["slope_us_per_token"] > 0 else None,
        "intercept_ratio": intercept_bound * MS / row["intercept_ms"] if row["intercept_ms"] > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="qwen3-1.7b,ouro-1.4b")
    parser.add_argument("--levers", default="own,shared-last,int8", help=f"of {', '.join(LEVERS)}")
    parser.add_argument("--loops", type=int, default=4, help="r for looped presets (plain ones run once)")
    parser.add_argument("--layers", type=int, default=2, help="layers kept of each preset (0: all)")
    parser.add_argument("--contexts", default="256,1024,4096,8192,16000,32000")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (decode and bandwidth)")
    parser.add_argument("--steps", type=int, default=3, help="timed decode steps per context")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    contexts = [int(c) for c in args.contexts.split(",")]
    before = read_bandwidth(device)
    rows = []
    for name in args.presets.split(","):
        for lever in args.levers.split(","):
            row = sweep(name, lever, args.loops, args.layers, contexts, args.dtype, device, args.steps)
            if row is not None:
                rows.append(row)
                print(f"{name} {lever}: {row['latency_ms']}", file=sys.stderr, flush=True)
    bandwidth = max(before, read_bandwidth(device))
    out = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": args.threads,
        "dtype": args.dtype,
        "read_bandwidth_gb_s": bandwidth / GB,
        "rows": [with_ratios(row, bandwidth) for row in rows],
    }
    print(f"read bandwidth {bandwidth / GB:.2f} GB/s ({out['device']}, {args.threads} thread(s), {args.dtype})")
    print("preset      lever        r  intercept ms (bound, ratio)   slope us/token (bound, ratio)   worst residual")
    for row in out["rows"]:
        print(
            f"{row['preset']:<11} {row['lever']:<12} {row['loops']:<2} "
            f"{row['intercept_ms']:8.2f} ({row['intercept_bound_ms']:.2f}, {row['intercept_ratio'] or 0:.2f})     "
            f"{row['slope_us_per_token']:8.3f} ({row['slope_bound_us_per_token']:.3f}, {row['slope_ratio'] or 0:.2f})"
            f"      {row['worst_residual']:.1%}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
