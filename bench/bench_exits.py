"""Per-token exits that skip work: decode time at fixed depth against an exit threshold giving ~60% of the loops.

One Ouro-shaped model (the ouro-tiny preset widened with --width, so that the loops, not per-call overhead,
are the decode step's cost; random weights, its exit gate scaled so exits vary from token to token), r loops
(--loops, default 8), one workload of --batch prompts decoded together on the continuous engine with
EOS off. A short calibration run picks the gate threshold whose mean loops per decoded token is nearest
--target (a fraction of r); then, alternating in one process, --rounds rounds each time the workload at
fixed depth (no policy) and under the threshold (fill `copy`: exited rows leave the step). Prints the mean
loops each decoded token ran, the median over rounds of the decode-time ratio (exits over fixed; decode time
is the longest sample's, every sample starting its decode together) and the best decode tokens/s of each.

On a GPU (--gpu) the fixed-depth decode replays CUDA graphs while the exit path runs eagerly (a graph replays
one fixed-depth step), so the ratio there includes that difference.

    python bench/bench_exits.py --threads 2                 # CPU
    python bench/bench_exits.py --gpu --width 1024 --batch 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.base import Sampling  # noqa: E402
from adapters.engine.adapter import EngineAdapter  # noqa: E402
from adapters.engine.overrides import exit_policy  # noqa: E402
from adapters.engine.io.checkpoint import random_model  # noqa: E402
from adapters.engine.io.presets import preset  # noqa: E402

THRESHOLDS = [0.5 + i / 100 for i in range(50)]  # the gate's cumulative exit probability, searched for --target


def model_for(width: int, loops: int, device: str) -> torch.nn.Module:
    """ouro-tiny widened to `width` (heads of 32, MLP 3x), trained loops `loops`, its exit gate scaled to vary."""
    cfg = preset("ouro-tiny").replace(
        hidden_size=width,
        num_heads=width // 32,
        num_kv_heads=width // 64,
        ffn_size=3 * width,
        loops=loops,
        eos_token_id=None,
    )
    model = random_model(cfg, 0, torch.float32 if device == "cpu" else torch.bfloat16, device)
    with torch.no_grad():
        gate = model.model.early_exit_gate.weight
        gate.normal_(0, 2.0 / width**0.5, generator=torch.Generator(device=gate.device).manual_seed(0))
    return model


def adapter(model: torch.nn.Module, batch: int, threshold: float | None) -> EngineAdapter:
    overrides = {} if threshold is None else {"exit_threshold": threshold}
    return EngineAdapter("bench", model, None, max_batch=batch, exit_policy=exit_policy(model.config, overrides))


def run(engine: EngineAdapter, prompts: list[list[int]], sampling: Sampling) -> tuple[float, int, float]:
    """(decode seconds, generated tokens, mean loops per decoded token)."""
    gens = engine.generate(prompts, sampling)
    loops = [loop for g in gens for loop in g.loops_used[1:]]
    return max(g.decode_seconds for g in gens), sum(g.generated_tokens for g in gens), sum(loops) / len(loops)


def calibrate(model: torch.nn.Module, prompts: list[list[int]], target: float) -> tuple[float, float]:
    """The threshold whose mean loops per decoded token is nearest `target` loops, on a short run; and that mean."""
    short = Sampling(temperature=0.0, max_new_tokens=16)
    means = {t: run(adapter(model, len(prompts), t), prompts, short)[2] for t in THRESHOLDS}
    best = min(means, key=lambda t: abs(means[t] - target))
    return best, means[best]


def bench(width: int, loops: int, batch: int, new_tokens: int, rounds: int, target: float, device: str) -> dict:
    model = model_for(width, loops, device)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 99, (8,), generator=generator).tolist() for _ in range(batch)]
    sampling = Sampling(temperature=0.0, max_new_tokens=new_tokens)
    threshold, _ = calibrate(model, prompts, target * loops)
    engines = {"fixed": adapter(model, batch, None), "exits": adapter(model, batch, threshold)}
    run(engines["fixed"], prompts, sampling)  # warm-up
    seen: dict[str, list[tuple[float, int, float]]] = {"fixed": [], "exits": []}
    for _ in range(rounds):
        for name, engine in engines.items():
            seen[name].append(run(engine, prompts, sampling))
    ratio = statistics.median(e[0] / f[0] for e, f in zip(seen["exits"], seen["fixed"]))
    return {
        "width": width,
        "loops": loops,
        "batch": batch,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "device": device,
        "threshold": threshold,
        "mean_loops_exits": round(seen["exits"][0][2], 2),
        "mean_loops_fixed": seen["fixed"][0][2],
        "loop_fraction": round(seen["exits"][0][2] / loops, 3),
        "decode_time_ratio": round(ratio, 3),
        "decode_tps_fixed": round(max(t / s for s, t, _ in seen["fixed"]), 1),
        "decode_tps_exits": round(max(t / s for s, t, _ in seen["exits"]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run on CUDA (bf16)")
    parser.add_argument("--width", type=int, default=512, help="hidden size (a multiple of 64)")
    parser.add_argument("--loops", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="prompts decoded together")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument(
        "--target", type=float, default=0.6, help="mean loops per decoded token, as a fraction of --loops"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with torch.inference_mode():
        out = bench(
            args.width, args.loops, args.batch, args.new_tokens, args.rounds, args.target, "cuda" if args.gpu else "cpu"
        )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
