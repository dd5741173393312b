"""Threads on a shared CPU: where a second thread pays, and how a sweep fares beside other work.

    python bench/bench_threads.py --sizes          # decode tok/s with one thread and with all cores, by model width
    python bench/bench_threads.py --contention     # a fixed small sweep alone, then beside two busy processes

`--sizes` builds Qwen3-shaped models of growing width (random weights, 4 layers) and decodes the
same prompts with one thread and with every core this process may use, alternating, best of the
rounds: the width where all cores start to win is where `adapters.threads.SMALL_MODEL_PARAMS` goes.

`--contention` runs one fixed `loopeval run` (melt-tiny at r = 8 on two tasks, 40 items each, into a
throwaway database) as a subprocess: alone, then while two processes spin on the CPU, and prints
the loaded/idle ratio for the default thread policy and, with `--compare-threads N`, for N threads
(two threads was the behaviour before the policy). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.base import PAPER_PROTOCOL  # noqa: E402
from adapters.engine.adapter import EngineAdapter  # noqa: E402
from adapters.engine.io.checkpoint import random_model  # noqa: E402
from adapters.engine.config import LoopConfig  # noqa: E402
from adapters.engine.memory import count_params  # noqa: E402
from adapters.threads import cores  # noqa: E402

# Fixed whatever the suite defaults: four samples a problem, as when the figures in docs/benchmarks.md were first taken.
SWEEP = [
    "--model",
    "zoo:melt-tiny",
    "--loops",
    "8",
    "--tasks",
    "c30k4,chain3",
    "--limit",
    "40",
    "--samples",
    "4",
    "--no-report",
]
WIDTHS = (128, 256, 512, 768, 1024, 1536)


def qwen3_shaped(width: int) -> LoopConfig:
    """A 4-layer Qwen3-like config of the given width (head dim 64, half as many K/V heads, FFN 3x)."""
    heads = max(2, width // 64)
    return LoopConfig(
        family="qwen3",
        vocab_size=8192,
        hidden_size=width,
        num_heads=heads,
        num_kv_heads=heads // 2,
        head_dim=64,
        ffn_size=3 * width,
        shared_layers=4,
        loops=1,
        tie_embeddings=True,
        norm_layout="pre",
        qk_norm=True,
        kv_strategy="standard",
        max_position=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def decode_tok_s(adapter: EngineAdapter, batch: int, new_tokens: int) -> float:
    prompts = torch.randint(
        3, adapter.config.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(batch)
    ).tolist()
    gens = adapter.generate(prompts, replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens, seed=0))
    return sum(g.generated_tokens - 1 for g in gens) / max(g.decode_seconds for g in gens)


def bench_sizes(batches: list[int], new_tokens: int, rounds: int) -> dict:
    """Decode tok/s with 1 thread and with all cores per width and batch; best of `rounds` alternating rounds."""
    many, rows = cores(), []
    for width in WIDTHS:
        config = qwen3_shaped(width)
        adapter = EngineAdapter(f"bench:{width}", random_model(config, 0, torch.float32, "cpu"), None)
        adapter.config.eos_token_id = None  # fixed token counts
        row = {"width": width, "params": count_params(config)}
        for batch in batches:
            best = {1: 0.0, many: 0.0}
            for _ in range(rounds):
                for threads in best:
                    torch.set_num_threads(threads)
                    best[threads] = max(best[threads], decode_tok_s(adapter, batch, new_tokens))
            row[f"batch{batch}"] = {
                "1 thread": round(best[1], 1),
                f"{many} threads": round(best[many], 1),
                "all cores / 1": round(best[many] / best[1], 2),
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"cores": many, "new_tokens": new_tokens, "rounds": rounds, "widths": rows}


def timed_sweep(threads: int | None) -> float:
    """Wall seconds of the fixed sweep in a fresh process (a throwaway database, no report)."""
    env = dict(os.environ)
    env.pop("LOOPEVAL_THREADS", None)
    flags = [] if threads is None else ["--threads", str(threads)]
    with tempfile.TemporaryDirectory() as scratch:
        began = time.perf_counter()
        subprocess.run(
            [
                str(Path(sys.executable).with_name("loopeval")),
                "run",
                *SWEEP,
                *flags,
                "--db",
                str(Path(scratch) / "bench.sqlite"),
            ],
            check=True,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - began


def beside_load(threads: int | None, busy: int) -> float:
    """The fixed sweep's seconds while `busy` processes spin on the CPU."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        return timed_sweep(threads)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def bench_contention(compare: list[int | None], busy: int) -> dict:
    out: dict = {"sweep": " ".join(SWEEP), "busy_processes": busy, "cores": cores(), "runs": []}
    for threads in compare:
        idle, loaded = timed_sweep(threads), beside_load(threads, busy)
        row = {
            "threads": "default policy" if threads is None else threads,
            "idle_s": round(idle, 1),
            "loaded_s": round(loaded, 1),
            "loaded / idle": round(loaded / idle, 2),
        }
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", action="store_true", help="one thread against all cores, by model width")
    parser.add_argument("--contention", action="store_true", help="the fixed sweep alone and beside busy processes")
    parser.add_argument("--batches", default="1,16,64", help="--sizes: batch sizes")
    parser.add_argument("--new-tokens", type=int, default=32, help="--sizes: tokens decoded per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="--sizes: alternating rounds (best of)")
    parser.add_argument("--busy", type=int, default=2, help="--contention: processes spinning beside the sweep")
    parser.add_argument(
        "--compare-threads", type=int, action="append", default=[], help="--contention: also run with N threads"
    )
    args = parser.parse_args()
    if args.sizes:
        result = bench_sizes([int(b) for b in args.batches.split(",")], args.new_tokens, args.rounds)
    elif args.contention:
        result = bench_contention([None, *args.compare_threads], args.busy)
    else:
        parser.error("choose --sizes or --contention")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
