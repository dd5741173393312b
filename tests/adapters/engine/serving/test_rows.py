"""Decode rows (`DecodeRows`, `RowsInputs`, `RowsStep`): a sequence's K/V gathered from the pool into a row, a decode
step's K/V written there and read back, and a filled block handed back to the pool, with real tensors."""

from __future__ import annotations

import torch

from adapters.engine.io.presets import preset
from adapters.engine.kv.layouts import layout_of
from adapters.engine.serving.paged import BlockPool
from adapters.engine.serving.rows import FIRST_LENGTH, DecodeRows, RowsInputs


def filled_pool() -> BlockPool:
    """A qwen3-tiny pool of 6 blocks of 4 whose every slot holds distinct values."""
    cfg = preset("qwen3-tiny")
    p = BlockPool(cfg, layout_of(cfg), 1, 6, 4, latent_tokens=2, dtype=torch.float32, device="cpu")
    p.k.copy_(torch.arange(p.k.numel(), dtype=torch.float32).view(p.k.shape))
    p.v.copy_(-p.k)
    return p


def test_a_row_is_its_sequence_s_slots_gathered_from_its_blocks():
    p = filled_pool()
    rows = DecodeRows(p, rows=2, longest=12)
    rows.reserve(7)
    assert rows.length == 12  # the longest sequence's capacity, below FIRST_LENGTH
    rows.fill(1, blocks=[5, 2], written=7)
    torch.testing.assert_close(rows.k[:, 1, :4], p.k[:, 20:24], rtol=0, atol=0)
    torch.testing.assert_close(rows.k[:, 1, 4:7], p.k[:, 8:11], rtol=0, atol=0)
    torch.testing.assert_close(rows.v[:, 1, :7], -rows.k[:, 1, :7], rtol=0, atol=0)
    assert rows.k[:, 0].abs().sum() == 0 and rows.k[:, 1, 7:].abs().sum() == 0


def test_rows_grow_by_doubling_and_keep_what_they_hold():
    p = filled_pool()
    rows = DecodeRows(p, rows=1, longest=4 * FIRST_LENGTH)
    rows.reserve(3)
    assert rows.length == FIRST_LENGTH
    rows.fill(0, [0], 3)
    held = rows.k[:, 0, :3].clone()
    rows.reserve(FIRST_LENGTH + 1)
    assert rows.length == 2 * FIRST_LENGTH
    torch.testing.assert_close(rows.k[:, 0, :3], held, rtol=0, atol=0)


def test_a_filled_block_goes_back_to_the_pool_and_a_row_moves_whole():
    p = filled_pool()
    rows = DecodeRows(p, rows=2, longest=8)
    rows.reserve(8)
    rows.k[:, 1, :8] = 7.0
    rows.write_back(1, block=3, start=4)
    assert (p.k[:, 12:16] == 7.0).all() and (p.k[:, 8:12] != 7.0).all()
    rows.move(1, 0, written=5)
    assert (rows.k[:, 0, :5] == 7.0).all() and rows.k[:, 0, 5:].abs().sum() == 0


def test_a_step_writes_each_row_s_new_token_and_reads_every_key_before_it():
    p = filled_pool()
    rows = DecodeRows(p, rows=2, longest=8)
    rows.reserve(5)
    rows.fill(0, [1], 3)
    rows.fill(1, [4, 0], 5)
    x = RowsInputs.build(rows, tokens=[11, 12], written=[3, 5], device=torch.device("cpu"))
    assert x.positions.view(-1).tolist() == [3, 5] and x.row_slots.tolist() == [3, rows.length + 5] and not x.aligned
    heads, dim = p.k.shape[2:]
    k = torch.randn(2, heads, 1, dim, generator=torch.Generator().manual_seed(2))
    read_k, read_v = x.cache.update(0, 0, k, -k, slot=0)
    assert read_k.shape == (2, heads, 6, dim)  # keys up to the longest sequence's new token
    torch.testing.assert_close(read_k[0, :, 3], k[0, :, 0], rtol=0, atol=0)
    torch.testing.assert_close(read_k[1, :, 5], k[1, :, 0], rtol=0, atol=0)
    torch.testing.assert_close(read_k[1, :, :4], p.k[0, 16:20].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(read_v[1, :, 5], -k[1, :, 0], rtol=0, atol=0)
    x.advance(torch.tensor([21, 22]))
    assert x.tokens.view(-1).tolist() == [21, 22] and x.positions.view(-1).tolist() == [4, 6] and x.end == 7
    assert x.row_slots.tolist() == [4, rows.length + 6]
