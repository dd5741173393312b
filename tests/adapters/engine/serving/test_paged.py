"""The paged pool (`BlockPool`, `PagedStep`): its tensors sized by the family's layout, forks of a prompt's blocks, a
step's writes read back through the block tables, and a step that reads its blocks in place, with real tensors.

A paged step of one sequence whose blocks lie in one run reads its K/V in place (`PagedStep`'s `start`, which the
model runner finds); it must give the bits the gather gives, for every layout (a folding one gathers anyway) and KV
dtype. Both ways prefill one prompt chunk by chunk through the model runner on one set of weights
(`bench/bench_melt_prefill.py`'s `prefill`): on a fresh pool the blocks come in order, so every step reads in place;
with the free list reversed they come backwards, so every step gathers.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch

from adapters.base import AdapterError, Sampling
from adapters.engine.kv.layouts import layout_of
from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.presets import preset
from adapters.engine.memory import analytic_terms
from adapters.engine.serving.model_runner import StepInputs
from adapters.engine.serving.paged import BlockPool, PagedStep, key_mask, pool_blocks
from adapters.engine.serving.sequence import Sequence
from bench.bench_melt_prefill import prefill


def pool(name: str = "qwen3-tiny", loops: int = 1, num_blocks: int = 6, block_size: int = 4) -> BlockPool:
    cfg = preset(name)
    return BlockPool(
        cfg, layout_of(cfg), loops, num_blocks, block_size, latent_tokens=4, dtype=torch.float32, device="cpu"
    )


def seq(prompt_len: int, sample: int = 0) -> Sequence:
    return Sequence(
        request=0,
        sample=sample,
        key=0,
        prompt_len=prompt_len,
        tokens=[3] * prompt_len,
        capacity=prompt_len + 4,
        sampling=Sampling(temperature=0.0, max_new_tokens=4),
    )


@pytest.mark.parametrize("name,loops", [("qwen3-tiny", 1), ("ouro-tiny", 3), ("melt-tiny", 3)])
def test_the_pool_holds_every_entry_of_the_layout_and_reserves_what_it_says(name, loops):
    cfg, p = preset(name), pool(name, loops)
    assert p.k.shape == (layout_of(cfg).entries(cfg, loops), 6 * 4, cfg.num_kv_heads, cfg.head_dim)
    terms = analytic_terms(cfg, loops, "fp32")
    assert p.kv_bytes_reserved == 6 * 4 * terms["kv_bytes_per_token"] + 4 * terms["latent_bytes_per_token"]
    assert (p.latent is not None) == (name == "melt-tiny")


def test_a_budget_gives_whole_blocks_and_one_too_small_for_a_sequence_is_refused():
    cfg = preset("ouro-tiny")
    per_token = analytic_terms(cfg, 4, "fp32")["kv_bytes_per_token"]
    assert pool_blocks(cfg, layout_of(cfg), 4, 10 * 4 * per_token + 5, 4, 0, 4) == 10
    sized = BlockPool.for_workload(
        cfg,
        layout_of(cfg),
        4,
        [9, 5],
        max_seqs=2,
        kv_budget=None,
        block_size=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
        spare=False,
    )
    assert sized.manager.num_blocks == 2 * 3  # both sequences at the longest one's 3 blocks
    with pytest.raises(AdapterError, match="raise kv_budget"):
        BlockPool.for_workload(
            cfg,
            layout_of(cfg),
            4,
            [400],
            max_seqs=1,
            kv_budget=1e-6,
            block_size=4,
            dtype=torch.float32,
            device=torch.device("cpu"),
            spare=False,
        )


def test_a_fork_shares_the_full_blocks_and_copies_the_partly_filled_one():
    p = pool()
    first, second = seq(6), seq(6, sample=1)
    p.manager.hold(first, 6)
    p.manager.wrote([first], 6)
    p.k[:, :24] = torch.randn(p.k[:, :24].shape, generator=torch.Generator().manual_seed(0))
    p.fork(first, second)
    assert second.blocks[0] == first.blocks[0] and second.blocks[1] != first.blocks[1] and second.written == 6
    assert p.manager.refs[first.blocks[0]] == 2 and p.manager.refs[second.blocks[1]] == 1
    src, dst = first.blocks[1] * 4, second.blocks[1] * 4
    torch.testing.assert_close(p.k[:, dst : dst + 2], p.k[:, src : src + 2], rtol=0, atol=0)
    assert p.manager.tokens_held == 6 + 2  # the copy's two slots count: they are the second sample's own


def test_a_step_writes_its_slots_and_reads_each_sequence_through_its_block_table():
    """Two sequences on scattered blocks: what a step writes at layer 0 is what it reads back, in position order."""
    p, g = pool(num_blocks=6), torch.Generator().manual_seed(1)
    heads, dim = p.k.shape[2:]
    blocks = torch.tensor([[4, 1], [2, 5]])  # sequence 0 on blocks 4 then 1, sequence 1 on 2 then 5
    positions = torch.arange(6).expand(2, 6)  # 6 tokens each: one full block and half of the next
    k, v = torch.randn(2, heads, 6, dim, generator=g), torch.randn(2, heads, 6, dim, generator=g)
    read_k, read_v = PagedStep(p, positions, blocks, length=6).update(0, 0, k, v, slot=0)
    torch.testing.assert_close(read_k, k, rtol=0, atol=0)
    torch.testing.assert_close(read_v, v, rtol=0, atol=0)
    torch.testing.assert_close(p.k[0, 1 * 4 : 1 * 4 + 2], k[0, :, 4:6].transpose(0, 1), rtol=0, atol=0)  # its 2nd block
    assert p.k[0, 3 * 4 : 4 * 4].abs().sum() == 0  # block 3 belongs to no one: untouched


def test_the_mask_shows_each_token_its_sequence_up_to_itself():
    mask = key_mask(torch.tensor([[2], [0]]), 4)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]


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
    p = BlockPool(cfg, layout_of(cfg), cfg.loops, 8, 4, cfg.chunk_size, torch.float32, "cpu")
    cpu = torch.device("cpu")
    seqs = [Sequence(i, 0, 0, 9, list(range(3, 12)), 9, Sampling(temperature=0.0, max_new_tokens=1)) for i in range(2)]
    p.manager.free = deque([2, 3, 4, 0, 1, 5, 6, 7])
    p.manager.hold(seqs[0], 9)  # blocks 2, 3, 4: one run from slot 8
    p.manager.hold(seqs[1], 9)  # blocks 0, 1, 5: not one run
    assert StepInputs.build(seqs[:1], [seqs[0].tokens], p, cpu).start == 2 * 4
    assert StepInputs.build(seqs[1:], [seqs[1].tokens], p, cpu).start is None
    assert StepInputs.build(seqs, [s.tokens for s in seqs], p, cpu).start is None, "two sequences: gathered"


def test_a_step_s_rows_fit_the_latent_buffer() -> None:
    """MELT's latent buffer holds `latent_tokens` tokens in flight: a prefill step of `length` tokens per sequence
    takes at most latent_tokens // length sequences (at least one); a pool without one takes them all."""
    melt, qwen = preset("melt-tiny"), preset("qwen3-tiny")
    gated = BlockPool(melt, layout_of(melt), melt.loops, 8, 4, 6, torch.float32, "cpu")
    assert gated.rows_per_step([0, 1, 2, 3, 4], 3) == [[0, 1], [2, 3], [4]]
    assert gated.rows_per_step([0, 1], 8) == [[0], [1]]  # a chunk longer than the buffer still runs, alone
    plain = BlockPool(qwen, layout_of(qwen), 1, 8, 4, 6, torch.float32, "cpu")
    assert plain.rows_per_step([0, 1, 2, 3, 4], 3) == [[0, 1, 2, 3, 4]]
