"""Decode cost of int8 and fp8 KV against the model's dtype (auto), on the CPU, as ratios measured in one process.

One Ouro-shaped model (ouro-tiny, widened with --width so the step is not all per-call overhead; random weights,
the same seed for each dtype, so the same weights), r = 4, --batch prompts of 16 random tokens decoded together
on the continuous engine (decode rows on the CPU), sampled with the paper's protocol, EOS off, --new-tokens
each. Every round times each dtype once, the order rotating; prints, per batch size, each dtype's best decode
tokens/s and the median over rounds of its decode time against auto's in the same round (a cost: 1.20 is 20%
slower). Quantized rows are written with one pack (amax, divide, round or cast, concatenate the scale) and every
attention read dequantizes the rows it reads: the cost grows with the context, not only with the tokens written.

    python bench/bench_kv_dtype.py --threads 1
    python bench/bench_kv_dtype.py --policy shared-last --width 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.base import PAPER_PROTOCOL, Sampling  # noqa: E402
from adapters.engine.adapter import EngineAdapter  # noqa: E402
from adapters.engine.io.checkpoint import random_model  # noqa: E402
from adapters.engine.io.presets import preset  # noqa: E402

DTYPES = ("auto", "int8", "fp8")


def engine(width: int, policy: str | None, kv_dtype: str, batch: int) -> EngineAdapter:
    cfg = preset("ouro-tiny").replace(
        hidden_size=width,
        num_heads=width // 32,
        num_kv_heads=width // 64,
        ffn_size=3 * width,
        eos_token_id=None,
        kv_policy=policy,
        kv_dtype=kv_dtype,
    )
    return EngineAdapter("bench", random_model(cfg, 0, torch.float32, "cpu"), None, max_batch=batch)


def decode(adapter: EngineAdapter, prompts: list[list[int]], sampling: Sampling) -> tuple[float, int]:
    """(decode seconds of the workload: its longest sample's, all starting together; generated tokens)."""
    gens = adapter.generate(prompts, sampling)
    return max(g.decode_seconds for g in gens), sum(g.generated_tokens for g in gens)


def bench(width: int, policy: str | None, batch: int, new_tokens: int, rounds: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 99, (16,), generator=generator).tolist() for _ in range(batch)]
    sampling = replace(PAPER_PROTOCOL, max_new_tokens=new_tokens, n=1, seed=0)
    engines = {d: engine(width, policy, d, batch) for d in DTYPES}
    for adapter in engines.values():
        decode(adapter, prompts, sampling)  # warm-up
    seen: dict[str, list[tuple[float, int]]] = {d: [] for d in DTYPES}
    for i in range(rounds):
        for d in DTYPES[i % 3 :] + DTYPES[: i % 3]:
            seen[d].append(decode(engines[d], prompts, sampling))
    out = {"batch": batch, "kv_bytes_per_token": {d: engines[d].describe()["kv_bytes_per_token"] for d in DTYPES}}
    out["decode_tps"] = {d: round(max(t / s for s, t in seen[d]), 1) for d in DTYPES}
    out["cost_vs_auto"] = {
        d: round(statistics.median(x[0] / a[0] for x, a in zip(seen[d], seen["auto"])), 3) for d in DTYPES[1:]
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=128, help="hidden size (a multiple of 64; 128 is ouro-tiny's)")
    parser.add_argument("--policy", default=None, help="kv_policy (default: per-loop, the model's own)")
    parser.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    with torch.inference_mode():
        runs = [bench(args.width, args.policy, int(b), args.new_tokens, args.rounds) for b in args.batch.split(",")]
    print(
        json.dumps(
            {
                "width": args.width,
                "policy": args.policy or "per-loop",
                "new_tokens": args.new_tokens,
                "rounds": args.rounds,
                "seconds": round(time.perf_counter() - began, 1),
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
