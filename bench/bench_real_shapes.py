"""Each family at its real shape on the CPU: process memory against the analytic model, and the loader's peak.

For each preset (default: ouro-1.4b, ouro-2.6b, huginn-0125, qwen3-1.7b) the parent writes random bf16
weights in the public layout (`adapters.testing.save_public_checkpoint`: config.json + safetensors
shards + index, drawn tensor by tensor, never in float32) to a temporary folder, then starts a fresh
Python per model, so each model's peaks are its own. The child:

1. loads the tiny preset qwen3-tiny and generates two tokens with it, drops it, and reads its RSS: the
   stated overhead (the interpreter, torch, the engine's code and what a first generation sets up,
   all that the process holds besides weights and KV);
2. loads the folder as a user would (`FAMILY:DIR`, bf16, CPU); `ru_maxrss` after loading is the peak
   while loading (nothing bigger ran before it);
3. generates `--new-tokens` greedy tokens after a `--context`-token prompt (random ids), reading RSS
   every 5 ms, and reads RSS after generation.

Printed per model: analytic weights, analytic KV at the run's tokens (prompt + generated), the
overhead, the peak RSS while generating over analytic weights + KV + overhead (target: within 10%),
RSS after generation over weights + overhead (the engine's KV pool lives for the call, so it is
gone by then), and the loading peak less the overhead over the weights bytes (target <= 1.2: no
full-precision copy on the way). Huginn runs at `--huginn-loops` (default 4)
rather than its trained 32 recurrences, which on two CPU cores would take most of an hour at 1k tokens.
Needs only torch, safetensors and psutil, so the GPU machine runs it too (on the CPU).

    python bench/bench_real_shapes.py
    python bench/bench_real_shapes.py --presets qwen3-1.7b --context 1024 --new-tokens 4
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = ("ouro-1.4b", "ouro-2.6b", "huginn-0125", "qwen3-1.7b")
RSS_PERIOD_S = 0.005


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class PeakRss:
    """The largest RSS a thread reads every `RSS_PERIOD_S` while the block runs (ru_maxrss cannot be reset)."""

    def __enter__(self) -> PeakRss:
        self.peak, self._done = rss(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(RSS_PERIOD_S):
            self.peak = max(self.peak, rss())

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def measure(folder: str, family: str, loops: int | None, context: int, new_tokens: int) -> dict:
    """The child: load `folder`, generate, and return every figure (bytes)."""
    import torch

    import adapters
    from adapters.base import Sampling
    from measures import analytic_kv_bytes

    warm = adapters.load("preset:qwen3-tiny", dtype="bf16", device="cpu")  # imports and first-call setup every run pays
    warm.generate([[1, 2, 3]], Sampling(temperature=0, max_new_tokens=2))
    del warm
    gc.collect()
    overhead = rss()
    start = time.perf_counter()
    adapter = adapters.load(f"{family}:{folder}", dtype="bf16", device="cpu", loops=loops, max_batch=1)
    load_s = time.perf_counter() - start
    load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    prompt = torch.randint(
        0, adapter.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    start = time.perf_counter()
    with PeakRss() as peak:
        gen = adapter.generate([prompt], Sampling(temperature=0, max_new_tokens=new_tokens))[0]
    terms = adapter.describe()["analytic"]
    return {
        "weights": terms["weights_bytes"],
        "kv": analytic_kv_bytes(terms, context + gen.generated_tokens),
        "overhead": overhead,
        "rss_after": rss(),
        "rss_peak_generate": peak.peak,
        "load_peak": load_peak,
        "loops": adapter.loops,
        "generated": gen.generated_tokens,
        "load_s": load_s,
        "generate_s": time.perf_counter() - start,
    }


def run_one(name: str, args: argparse.Namespace) -> str:
    """Write the preset's public checkpoint, measure it in a fresh process, and format its line."""
    from adapters.base import AdapterError
    from adapters.engine.io.presets import preset
    from adapters.testing import save_public_checkpoint

    try:
        cfg = preset(name)
    except AdapterError:
        return f"{name}: SKIP: no preset {name!r} in adapters/engine/io/presets.py"
    loops = args.huginn_loops if cfg.huginn else None
    with tempfile.TemporaryDirectory(prefix=f"{name}-", dir=args.tmp) as tmp:
        start = time.perf_counter()
        save_public_checkpoint(tmp, cfg, seed=0)
        write_s = time.perf_counter() - start
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                tmp,
                cfg.family,
                str(loops or 0),
                str(args.context),
                str(args.new_tokens),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if child.returncode:
        return f"{name}: FAILED (exit {child.returncode}): {child.stderr.strip().splitlines()[-1] if child.stderr.strip() else ''}"
    return format_line(name, json.loads(child.stdout.strip().splitlines()[-1]), write_s)


def format_line(name: str, f: dict, write_s: float) -> str:
    from measures import GB as gb

    held = f["weights"] + f["overhead"]
    return (
        f"{name} (r={f['loops']}, {f['generated']} new tokens): weights {f['weights'] / gb:.3f} GB, KV {f['kv'] / gb:.3f} GB, "
        f"overhead {f['overhead'] / gb:.3f} GB (RSS after a tiny warm-up run); peak RSS while generating "
        f"{f['rss_peak_generate'] / gb:.3f} GB = {f['rss_peak_generate'] / (held + f['kv']):.3f} x (weights + KV + overhead); "
        f"RSS after generation {f['rss_after'] / gb:.3f} GB = {f['rss_after'] / held:.3f} x (weights + overhead: the KV pool "
        f"lives for the call); peak while loading {f['load_peak'] / gb:.3f} GB, less overhead = "
        f"{(f['load_peak'] - f['overhead']) / f['weights']:.3f} x weights; write {write_s:.0f} s, load {f['load_s']:.0f} s, "
        f"generate {f['generate_s']:.0f} s"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        folder, family, loops, context, new_tokens = sys.argv[2:7]
        print(json.dumps(measure(folder, family, int(loops) or None, int(context), int(new_tokens))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated preset names")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--huginn-loops", type=int, default=4, help="Huginn's recurrences r (trained mean 32)")
    parser.add_argument("--tmp", default=None, help="folder for the temporary checkpoints (default: the system's)")
    args = parser.parse_args()
    if args.context < 1 or args.new_tokens < 1 or args.huginn_loops < 1:
        print("--context, --new-tokens and --huginn-loops must be positive", file=sys.stderr)
        return 2
    for name in args.presets.split(","):
        print(run_one(name.strip(), args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
