"""Harness overhead: wall time of `loopeval run` against the adapter's own time for the same generate calls.

A recording adapter (registered through the public registry as `bench:<spec>`) runs a fixed
workload through the real `loopeval run` (LightEval pipeline, SQLite store, memory sampler at its
default interval, progress bars) in this process and keeps every (prompts, sampling) call it
received. The same calls are then replayed on a fresh adapter with nothing around it. The ratio
run wall / replay time is the harness's cost; the target is < 1.10 on the synthetic suite.

The workload is the default job's for one model: the whole synthetic test split (200 docs per
task, n = 4 samples each), 8 new tokens, batch 32. A first, uncounted run pays the one-off costs
(imports, and the allocator and oneDNN caches meeting the workload's shapes for the first time);
it is reported as `cold_start_seconds_first_run`. Run and replay then alternate for a few rounds;
`ratio` is the median over rounds of run / replay of the same round, since on a shared machine the
same work varies by 10-30% from one minute to the next and adjacent timings drift together
(`ratio_of_fastest` compares the fastest run with the fastest replay);
`--threads 1` steadies them further when other work shares the cores.
`ratio_wall_to_inside_generate` is the same question asked of the run alone: its wall time over the
time it spent inside `Adapter.generate`; `ratio_inside_generate_to_replay` asks whether the harness's
threads (memory sampler, progress bars) slow generation itself (1.0: they do not). In each round the
two multiply to run / replay, and each is steadier than that, as it compares timings taken at the
same time or seconds apart.

    .venv/bin/python bench/bench_harness.py            # prints JSON
    .venv/bin/python bench/bench_harness.py --limit 40 --loops 4 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from collections.abc import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import adapters  # noqa: E402
from adapters.base import Generation, Prompt, Sampling  # noqa: E402
from harness.cli import main  # noqa: E402

CALLS: list[tuple[list[Prompt], Sampling]] = []


class Recording:
    """The wrapped adapter, unchanged except that each generate call is remembered for the replay."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spec, self.tokenizer, self.max_context = inner.spec, inner.tokenizer, inner.max_context

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        CALLS.append((list(prompts), sampling))
        return self.inner.generate(prompts, sampling)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@adapters.register(
    "bench", "benchmark wrapper: bench:<spec> records the generate calls of <spec>", source="bench_harness"
)
def _load_recording(spec: str, **overrides: Any) -> Recording:
    return Recording(adapters.load(spec, **overrides))


def run_cli(argv: list[str]) -> float:
    began = time.perf_counter()
    code = main(argv)
    if code != 0:
        raise SystemExit(f"loopeval {' '.join(argv)} exited {code}")
    return time.perf_counter() - began


def replay(adapter: Any) -> float:
    """Seconds the bare adapter takes for the recorded calls."""
    began = time.perf_counter()
    for prompts, sampling in CALLS:
        adapter.generate(prompts, sampling)
    return time.perf_counter() - began


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:ouro-tiny")
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="docs per task (default: all 200 of each of the synthetic suite's default tasks)",
    )
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=9, help="run/replay pairs after the warm-up, interleaved")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from db.store import Store

    common = [
        "run",
        "--model",
        f"bench:{args.model}",
        "--loops",
        str(args.loops),
        "--samples",
        str(args.samples),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--batch-size",
        str(args.batch_size),
        "--no-report",
    ]
    if args.limit is not None:
        common += ["--limit", str(args.limit)]
    bare = adapters.load(args.model, loops=args.loops, seed=0)
    walls, inside, replays = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        cold = run_cli([*common, "--db", f"{scratch}/warm.sqlite"])
        replay(bare)  # the bare adapter meets the same shapes once too
        for round_ in range(args.rounds):
            CALLS.clear()
            db = f"{scratch}/bench{round_}.sqlite"
            walls.append(run_cli([*common, "--db", db]))
            (summary,) = Store.open(db).run_summaries()
            inside.append(summary["generate_seconds"])
            replays.append(replay(bare))

    median = statistics.median(w / r for w, r in zip(walls, replays))
    print(
        json.dumps(
            {
                "workload": {
                    **vars(args),
                    "suite": "synthetic",
                    "generate_calls": len(CALLS),
                    "samples_stored": summary["n_samples"],
                },
                "loopeval_run_wall_seconds": [round(w, 3) for w in walls],
                "adapter_generate_seconds_same_calls": [round(r, 3) for r in replays],
                "ratio": round(median, 3),
                "harness_overhead_percent": round(100 * (median - 1), 1),
                "ratio_per_round": [round(w / r, 3) for w, r in zip(walls, replays)],
                "ratio_of_fastest": round(min(walls) / min(replays), 3),
                "inside_generate_during_run_seconds": [round(g, 3) for g in inside],
                "ratio_wall_to_inside_generate": round(statistics.median(w / g for w, g in zip(walls, inside)), 3),
                "ratio_inside_generate_to_replay": round(statistics.median(g / r for g, r in zip(inside, replays)), 3),
                "cold_start_seconds_first_run": round(cold, 3),
                "target_ratio": 1.10,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main_bench()
