"""MELT's chunked prefill: the prefix read where it lies in the pool, against gathered at every layer and loop.

A MELT prompt prefills in chunks of the config's `chunk_size`, each chunk step attending to the whole prefix at
every shared layer and loop. A step of one sequence whose blocks lie in one run of the pool reads the prefix in
place (`adapters.engine.serving.paged.PagedStep`); on a pool whose free blocks come in another order (reversed
here, as after other sequences gave theirs back) the same step gathers the prefix at every layer and loop, which is
what every chunk step did before. Both prefill the same prompt through the model runner on one set of random
weights, alternating, in one process; the last chunk's logits must be bit-identical. Prints the best CPU time of
each and the median ratio over rounds as JSON.

    python bench/bench_melt_prefill.py                      # melt-tiny widened to 512, 4096 tokens, chunks of 64
    python bench/bench_melt_prefill.py --tokens 1024 --width 256 --rounds 2   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from adapters.base import Sampling  # noqa: E402
from adapters.engine.config import LoopConfig  # noqa: E402
from adapters.engine.exits import ExitPolicy  # noqa: E402
from adapters.engine.families.standard import prefill_chunks  # noqa: E402
from adapters.engine.io.checkpoint import random_model  # noqa: E402
from adapters.engine.kv.layouts import layout_of  # noqa: E402
from adapters.engine.io.presets import preset  # noqa: E402
from adapters.engine.model import LoopedLM  # noqa: E402
from adapters.engine.serving.model_runner import ModelRunner  # noqa: E402
from adapters.engine.serving.paged import DEFAULT_BLOCK_SIZE, BlockPool  # noqa: E402
from adapters.engine.serving.sequence import Sequence  # noqa: E402


def wide_melt(width: int, tokens: int, chunk: int) -> LoopConfig:
    """melt-tiny (2 shared layers, 4 loops, gated KV) at `width`, heads of 64, room for `tokens` positions."""
    heads = width // 64
    return replace(
        preset("melt-tiny"),
        hidden_size=width,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=64,
        ffn_size=3 * width,
        chunk_size=chunk,
        max_position=max(tokens + 1, preset("melt-tiny").max_position),
    )


def prefill(model: LoopedLM, prompt: list[int], in_place: bool, chunk: int | None = None) -> tuple[float, torch.Tensor]:
    """CPU seconds to prefill `prompt` chunk by chunk on a fresh pool (its free blocks reversed unless `in_place`),
    and the last chunk's logits; chunks of `chunk` tokens (default: the config's). CPU time of this process, not wall time: on a shared machine the wall clock
    counts the other processes' turns too, and the two ways run on one thread."""
    cfg, size = model.config, DEFAULT_BLOCK_SIZE
    chunk = chunk or cfg.chunk_size
    device = model.model.embed_tokens.weight.device
    pool = BlockPool(
        cfg,
        layout_of(cfg),
        cfg.loops,
        -(-len(prompt) // size),
        size,
        chunk,
        model.model.embed_tokens.weight.dtype,
        device,
    )
    if not in_place:
        pool.manager.free = deque(reversed(pool.manager.free))
    runner = ModelRunner(model, pool, loops=cfg.loops, policy=ExitPolicy(), graphs=None)
    seq = Sequence(0, 0, 0, len(prompt), list(prompt), len(prompt), Sampling(temperature=0.0, max_new_tokens=1))
    began = time.process_time()
    with torch.inference_mode():
        for s0, s1 in prefill_chunks(len(prompt), chunk):
            pool.manager.hold(seq, s1)
            out = runner.step([seq], [seq.tokens[s0:s1]])
        logits = runner.logits(out)[0]
    return time.process_time() - began, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--width", type=int, default=512, help="hidden size (heads of 64)")
    parser.add_argument("--chunk", type=int, default=64, help="MELT's chunk size (melt-1.6b's is 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = wide_melt(args.width, args.tokens, args.chunk)
    model = random_model(cfg, 0, torch.float32, "cpu")
    prompt = torch.randint(3, cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    times: dict[str, list[float]] = {"gathered": [], "in_place": []}
    reference = None
    for _ in range(args.rounds):
        for way in times:
            seconds, logits = prefill(model, prompt, in_place=way == "in_place")
            times[way].append(seconds)
            if reference is None:
                reference = logits
            elif not torch.equal(logits, reference):
                raise SystemExit(
                    f"bench/bench_melt_prefill.py: the {way} prefill's logits differ from the gathered one's"
                )
    print(
        json.dumps(
            {
                "config": {
                    "width": args.width,
                    "shared_layers": cfg.shared_layers,
                    "loops": cfg.loops,
                    "chunk": args.chunk,
                    "tokens": args.tokens,
                    "threads": args.threads,
                    "torch": torch.__version__,
                },
                "seconds_best": {way: round(min(t), 3) for way, t in times.items()},
                "gathered_over_in_place_median": round(
                    statistics.median(g / p for g, p in zip(times["gathered"], times["in_place"])), 3
                ),
                "logits_identical": True,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
