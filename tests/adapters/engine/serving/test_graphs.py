"""`DecodeGraphs`: the GPU path's decode steps padded to (batch, width) buckets. The capture needs CUDA; run eagerly
(`capture=False`, as the CPU can), a padded step gives the unpadded step's states and writes padding only to the
spare block."""

from __future__ import annotations

import pytest
import torch

from adapters.engine.io.checkpoint import random_model
from adapters.engine.kv.layouts import layout_of
from adapters.engine.serving.graphs import DecodeGraphs, bucket
from adapters.engine.serving.paged import BlockPool, PagedStep, key_mask
from tests.support.rounding import rounding_bound


def test_a_value_takes_the_smallest_bucket_that_holds_it():
    assert [bucket(v, [1, 2, 4, 8]) for v in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]


def test_buckets_end_at_the_cap_and_a_pool_without_a_spare_block_is_refused():
    model = random_model("qwen3-tiny", 0, torch.float32, "cpu")
    pool = BlockPool(
        model.config, layout_of(model.config), 1, 8, 4, latent_tokens=4, dtype=torch.float32, device="cpu", spare=True
    )
    graphs = DecodeGraphs(model, pool, loops=1, keep_loops=False, max_seqs=6, max_blocks=5, capture=False)
    assert graphs.batch_sizes == [1, 2, 4, 6] and graphs.widths == [1, 2, 4, 5]
    with pytest.raises(ValueError, match="spare block"):
        DecodeGraphs(
            model,
            BlockPool(model.config, layout_of(model.config), 1, 8, 4, 4, torch.float32, "cpu"),
            loops=1,
            keep_loops=False,
            max_seqs=6,
            max_blocks=5,
            capture=False,
        )


@pytest.mark.numerics
def test_a_padded_step_gives_the_unpadded_step_s_states():
    """Three rows on tables of 3 blocks run in the (4, 4) bucket: a padding row and a padding column. The
    unpadded step on a copy of the pool gives the same states within rounding, and the padding row writes only
    the spare block."""
    model = random_model("ouro-tiny", 2, torch.float32, "cpu")
    pool = BlockPool(
        model.config, layout_of(model.config), 4, 10, 4, latent_tokens=4, dtype=torch.float32, device="cpu", spare=True
    )
    pool.k.normal_(generator=torch.Generator().manual_seed(0))
    pool.v.normal_(generator=torch.Generator().manual_seed(1))
    spare = slice(pool.spare * 4, pool.spare * 4 + 4)
    tokens, positions = torch.tensor([[5], [6], [7]]), torch.tensor([[9], [4], [10]])
    blocks = torch.tensor([[0, 1, 2], [3, 4, 0], [5, 6, 7]])
    before = pool.k.clone()
    graphs = DecodeGraphs(model, pool, loops=4, keep_loops=False, max_seqs=4, max_blocks=4, capture=False)
    with torch.no_grad():
        padded = graphs.step(tokens, positions, blocks).states[-1]
    written = (pool.k != before).any(-1).any(-1).any(0).nonzero().flatten().tolist()
    assert set(written) - set(range(spare.start, spare.stop)) == {
        2 * 4 + 1,
        4 * 4 + 0,
        7 * 4 + 2,
    }  # each row's own slot
    assert set(written) & set(range(spare.start, spare.stop))  # and the padding row's, in the spare block

    def unpadded() -> torch.Tensor:
        p = BlockPool(
            model.config,
            layout_of(model.config),
            4,
            10,
            4,
            latent_tokens=4,
            dtype=torch.float32,
            device="cpu",
            spare=True,
        )
        p.k.copy_(before)
        p.v.normal_(generator=torch.Generator().manual_seed(1))
        step = PagedStep(p, positions, blocks, 11)
        return model.step(tokens, positions, step, 10, key_mask(positions, 11), loops=4, keep_loops=False).states[-1]

    with torch.no_grad():
        plain = unpadded()
    assert padded.shape == plain.shape == (3, model.config.hidden_size)
    assert (padded - plain).abs().max().item() <= rounding_bound(model, unpadded)
