"""A paged step of one sequence whose blocks lie in one run reads its K/V in place (`PagedStep`'s `start`); it must
give the bits the gather gives, for every layout (a folding one gathers anyway) and KV dtype.

Both ways prefill one prompt chunk by chunk through the model runner on one set of weights
(`bench/bench_melt_prefill.py`'s `prefill`): on a fresh pool the blocks come in order, so every step reads in place;
with the free list reversed they come backwards, so every step gathers, as every step did before.
"""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path

import pytest
import torch

from adapters.engine.exits import ExitPolicy
from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.presets import preset
from adapters.engine.serving.model_runner import ModelRunner
from adapters.engine.serving.paged import BlockPool
from adapters.engine.serving.sequence import Sequence
from adapters.base import Sampling

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_melt_prefill import prefill  # noqa: E402

CASES = {  # name -> (preset, config fields)
    "melt gated": ("melt-tiny", {}),
    "melt gated int8": ("melt-tiny", {"kv_dtype": "int8"}),
    "ouro per-loop": ("ouro-tiny", {}),
    "ouro shared-mean (folds: gathers)": ("ouro-tiny", {"kv_policy": "shared-mean"}),
    "qwen3 standard": ("qwen3-tiny", {}),
}


@pytest.mark.parametrize("case", CASES)
def test_reading_in_place_gives_the_gathers_bits(case: str) -> None:
    name, fields = CASES[case]
    model = random_model(preset(name).replace(**fields), 0, torch.float32, "cpu")
    prompt = torch.randint(3, model.config.vocab_size, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    chunk = model.config.chunk_size if name == "melt-tiny" else 32  # several chunks, each after the first masked
    _, in_place = prefill(model, prompt, in_place=True, chunk=chunk)
    _, gathered = prefill(model, prompt, in_place=False, chunk=chunk)
    assert torch.equal(in_place, gathered)


def test_only_a_lone_sequence_with_its_blocks_in_one_run_reads_in_place() -> None:
    cfg = preset("melt-tiny")
    model = random_model(cfg, 0, torch.float32, "cpu")
    pool = BlockPool(cfg, cfg.loops, 8, 4, cfg.chunk_size, torch.float32, "cpu")
    runner = ModelRunner(model, pool, loops=cfg.loops, policy=ExitPolicy(), graphs=None)
    seqs = [Sequence(i, 0, 0, 9, list(range(3, 12)), 9, Sampling(temperature=0.0, max_new_tokens=1)) for i in range(2)]
    pool.manager.free = deque([2, 3, 4, 0, 1, 5, 6, 7])
    pool.manager.hold(seqs[0], 9)  # blocks 2, 3, 4: one run from slot 8
    pool.manager.hold(seqs[1], 9)  # blocks 0, 1, 5: not one run
    assert runner.prepare(seqs[:1], [seqs[0].tokens]).start == 2 * 4
    assert runner.prepare(seqs[1:], [seqs[1].tokens]).start is None
    assert runner.prepare(seqs, [s.tokens for s in seqs]).start is None, "two sequences: gathered"
