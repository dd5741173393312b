"""The cost of loop conditioning, measured: per variant, parameters added, bytes held while decoding,
and decode tokens/s relative to the plain looped model, all in one process.

Every variant is the same preset with the same seeded weights plus zero-initialised conditioning
(`model.with_conditioning` through the `injection`, `history`, `history_window`, `loop_gate` and `branch_gate`
load overrides), so all generate the same tokens; EOS is off, so every run decodes the same count.
Every round times each variant once, each round starting at another variant; a variant's speed is
its best round (other processes only ever add time, so the best round is the least disturbed) and
its ratio is that against the plain model's best; `spread` (best over worst round) shows the noise. Bytes held are the adapter's own accounting (`kv_bytes_peak`: K/V plus the history
buffer), beside the weights the parameters add.

    python bench/bench_conditioning.py                       # coreloop-tiny (1 + 2 x 4 + 1), batch 1 and 8
    python bench/bench_conditioning.py --preset ouro-tiny --new-tokens 32 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.base import PAPER_PROTOCOL, Sampling  # noqa: E402
from adapters.engine.adapter import EngineAdapter, load_preset  # noqa: E402

VARIANTS: dict[str, dict] = {
    "plain": {},
    "injection scalar": {"injection": "scalar"},
    "injection channel": {"injection": "channel"},
    "injection dense": {"injection": "dense"},
    "history scalar w=2": {"history": "scalar", "history_window": 2},
    "history channel w=2": {"history": "channel", "history_window": 2},
    "history dense w=2": {"history": "dense", "history_window": 2},
    "history channel w=4": {"history": "channel", "history_window": 4},
    "loop gate": {"loop_gate": True},
    "history channel w=2 + loop gate": {"history": "channel", "history_window": 2, "loop_gate": True},
    "branch gate": {"branch_gate": True},
    "all (dense, w=2, gate)": {"injection": "dense", "history": "dense", "history_window": 2, "loop_gate": True},
}


def load(preset: str, loops: int, options: dict) -> EngineAdapter:
    adapter = load_preset(preset, dtype="fp32", device="cpu", loops=loops, **options)
    adapter.tokenizer = None  # token ids in, a fixed token count out: no EOS stops a variant early
    adapter.config.eos_token_id = None
    return adapter


def decode_tok_s(adapter: EngineAdapter, prompts: list[list[int]], sampling: Sampling) -> tuple[float, int]:
    """(decode tokens/s of one generate call, the adapter's KV + history peak in bytes)."""
    adapter.reset_memory_peak()
    gens = adapter.generate(prompts, sampling)
    return sum(g.generated_tokens - 1 for g in gens) / gens[0].decode_seconds, adapter.memory()["kv_bytes_peak"]


def bench(preset: str, loops: int, batches: list[int], prompt_len: int, new_tokens: int, rounds: int) -> dict:
    adapters = {name: load(preset, loops, options) for name, options in VARIANTS.items()}
    plain = adapters["plain"]
    sampling = replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens, seed=0)
    out: dict = {
        "preset": preset,
        "loops": loops,
        "threads": torch.get_num_threads(),
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "variants": {},
    }
    for name, adapter in adapters.items():
        params = adapter.describe()["params"]
        out["variants"][name] = {
            "params_added": params - plain.describe()["params"],
            "weights_bytes_added": adapter.memory()["weights_bytes"] - plain.memory()["weights_bytes"],
        }
    names = list(adapters)
    for batch in batches:
        prompts = torch.randint(
            3, plain.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(batch)
        ).tolist()
        speeds: dict[str, list[float]] = {name: [] for name in names}
        held: dict[str, int] = {}
        for adapter in adapters.values():
            decode_tok_s(adapter, prompts, sampling)  # warm-up
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:  # each round starts at another variant
                tps, held[name] = decode_tok_s(adapters[name], prompts, sampling)
                speeds[name].append(tps)
        best_plain = max(speeds["plain"])
        for name in names:
            out["variants"][name][f"batch {batch}"] = {
                "decode_tok_s_best": round(max(speeds[name]), 1),
                "ratio_vs_plain": round(max(speeds[name]) / best_plain, 3),
                "spread": round(max(speeds[name]) / min(speeds[name]), 2),  # best over worst round: the noise
                "decode_bytes_held": held[name],
                "decode_bytes_added": held[name] - held["plain"],
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="coreloop-tiny")
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    print(
        json.dumps(bench(args.preset, args.loops, batches, args.prompt_tokens, args.new_tokens, args.rounds), indent=2)
    )


if __name__ == "__main__":
    main()
