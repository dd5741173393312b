"""Where a batch-1 decode's time goes on the GPU: one full-size preset, random bf16 weights, CUDA graphs on and off.

`bench/bench_engine.py --gpu --full` gives the batch-1 decode tokens/s against the bandwidth bound; this says
why it falls short. For each preset: a 64-token prompt, 128 new tokens (EOS off), the paper's sampling; one
warm-up call, then --rounds timed calls with the decode steps replayed from CUDA graphs and as many without
(`cuda_graphs=False`), alternating; then one call of each under torch.profiler, printing the operators that
took the most host time and the most device time. Needs only torch (runs on the GPU machine).

    python bench/gpu_profile.py --presets qwen3-1.7b,ouro-1.4b
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.base import PAPER_PROTOCOL  # noqa: E402
from adapters.engine.adapter import EngineAdapter, load_preset  # noqa: E402


def decode_tok_s(adapter: EngineAdapter, prompt: list[int], new_tokens: int) -> float:
    gen = adapter.generate([prompt], replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens))[0]
    return (gen.generated_tokens - 1) / gen.decode_seconds


def profile_preset(name: str, new_tokens: int, rounds: int, rows: int) -> dict:
    adapter = load_preset(name, dtype="bf16", device="cuda", max_batch=1)
    adapter.config.eos_token_id, adapter.config.extra["eos_token_ids"] = None, []
    prompt = torch.randint(3, adapter.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    decode_tok_s(adapter, prompt, new_tokens)  # warm-up: kernels loaded, allocator grown
    seen: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for graphs in seen:
            adapter.cuda_graphs = graphs
            seen[graphs].append(decode_tok_s(adapter, prompt, new_tokens))
    out = {
        "decode_tok_s_graphs": [round(x, 1) for x in seen[True]],
        "decode_tok_s_eager": [round(x, 1) for x in seen[False]],
        "median_graphs": round(statistics.median(seen[True]), 1),
        "median_eager": round(statistics.median(seen[False]), 1),
    }
    print(name, json.dumps(out), file=sys.stderr, flush=True)  # a call cut short keeps what it timed
    for graphs in (True, False):
        adapter.cuda_graphs = graphs
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            decode_tok_s(adapter, prompt, new_tokens)
        torch.cuda.synchronize()
        averages = prof.key_averages()
        label = "graphs" if graphs else "eager"
        print(f"== {name}, {label}: by host time", file=sys.stderr)
        print(averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60), file=sys.stderr)
        print(f"== {name}, {label}: by device time", file=sys.stderr)
        print(
            averages.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60),
            file=sys.stderr,
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="qwen3-1.7b,ouro-1.4b")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=25, help="operators per profile table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_profile.py needs CUDA")
    out = {name: profile_preset(name, args.new_tokens, args.rounds, args.rows) for name in args.presets.split(",")}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
