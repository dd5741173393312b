"""The caches a forward attends through (`KVCache`, `ChunkCache`, `MixedCache`): what a call writes is what later
calls read, per the family's layout, and the static cache's bytes are counted exactly; real tensors throughout."""

from __future__ import annotations

import torch

from adapters.engine.kv.cache import ChunkCache, KVCache, MixedCache
from adapters.engine.kv.layouts import layout_of
from adapters.engine.families import family_of
from adapters.engine.io.presets import preset
from adapters.engine.memory import kv_bytes

G = torch.Generator().manual_seed(0)


def kv(cfg, batch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows [batch, kv_heads, n, head_dim] for one attention call."""
    shape = (batch, cfg.num_kv_heads, n, cfg.head_dim)
    return torch.randn(shape, generator=G), torch.randn(shape, generator=G)


def test_a_static_cache_returns_every_row_written_so_far_and_counts_its_bytes():
    cfg = preset("ouro-tiny")
    cache = KVCache(cfg, layout_of(cfg), batch=2, length=8, loops=3, dtype=torch.float32, device="cpu")
    assert cache.kv_bytes_allocated == kv_bytes(cfg, 8, 2, 3, "fp32") and cache.kv_bytes_used == 0
    first, second = kv(cfg, 2, 5), kv(cfg, 2, 1)
    cache.update(0, 1, *first, slot=0)
    k, v = cache.update(0, 1, *second, slot=5)
    torch.testing.assert_close(k, torch.cat((first[0], second[0]), 2), rtol=0, atol=0)
    torch.testing.assert_close(v, torch.cat((first[1], second[1]), 2), rtol=0, atol=0)
    cache.update(0, 2, *kv(cfg, 2, 1), slot=0)  # per-loop entries: loop 3 writes rows of its own
    torch.testing.assert_close(cache.stored(0, 1, 0, 1)[0], first[0][:, :, :1], rtol=0, atol=0)
    cache.length = 6
    entries = layout_of(cfg).entries(cfg, 3)
    assert cache.kv_bytes_used == 6 * 2 * 2 * entries * cfg.num_kv_heads * cfg.head_dim * 4


def test_a_gated_cache_keeps_one_row_per_layer_and_the_latent_of_the_tokens_in_flight():
    cfg = preset("melt-tiny")
    cache = KVCache(cfg, layout_of(cfg), batch=1, length=8, loops=4, dtype=torch.float32, device="cpu")
    x = torch.randn(1, 3, cfg.hidden_size, generator=G)
    h0 = cache.kv_source(0, 0, x, gate=lambda x, h, loop: (x + h) / 2)
    torch.testing.assert_close(h0, x, rtol=0, atol=0)  # loop 1: h = x
    h1 = cache.kv_source(0, 1, 3 * x, gate=lambda x, h, loop: (x + h) / 2)
    torch.testing.assert_close(h1, 2 * x, rtol=0, atol=0)  # then the gate's blend of the new x and the kept h
    cache.update(0, 0, *kv(cfg, 1, 3), slot=0)
    last = kv(cfg, 1, 3)
    cache.update(0, 3, *last, slot=0)  # loop 4 writes over loop 1's row
    torch.testing.assert_close(cache.stored(0, 0, 0, 3)[0], last[0], rtol=0, atol=0)
    assert cache.k.shape[0] == cfg.num_layers


def test_a_chunked_forward_reads_earlier_chunks_and_its_own_rows():
    cfg = preset("melt-tiny")
    cache = ChunkCache(cfg, layout_of(cfg), loops=2)
    a, b = kv(cfg, 1, 4), kv(cfg, 1, 2)
    cache.update(0, 0, *a, slot=0)
    replaced = kv(cfg, 1, 4)
    cache.update(0, 1, *replaced, slot=0)  # a gated layer's loop 2 replaces its chunk's rows
    k, v = cache.update(0, 0, *b, slot=4)
    torch.testing.assert_close(k, torch.cat((replaced[0], b[0]), 2), rtol=0, atol=0)
    torch.testing.assert_close(v, torch.cat((replaced[1], b[1]), 2), rtol=0, atol=0)


def test_a_folding_layout_attends_to_the_loop_s_own_rows_and_keeps_their_mean():
    cfg = preset("ouro-tiny").replace(kv_policy="shared-mean")
    cache = KVCache(cfg, layout_of(cfg), batch=1, length=4, loops=2, dtype=torch.float32, device="cpu")
    one, two = kv(cfg, 1, 2), kv(cfg, 1, 2)
    cache.update(0, 0, *one, slot=0)
    k, _ = cache.update(0, 1, *two, slot=0)
    torch.testing.assert_close(k, two[0], rtol=0, atol=0)
    torch.testing.assert_close(cache.stored(0, 1, 0, 2)[0], one[0] + (two[0] - one[0]) / 2, rtol=0, atol=0)


def test_a_mixed_forward_blends_the_melt_rows_with_the_looplm_s():
    cfg = preset("melt-tiny")
    family = family_of(cfg)
    mixed = MixedCache(0.25, ChunkCache(cfg, layout_of(cfg), 2), ChunkCache(cfg, family.kv_reference, 2))
    melt, looplm = kv(cfg, 1, 3), kv(cfg, 1, 3)
    k, v = mixed.update(0, 0, torch.stack((melt[0], looplm[0])), torch.stack((melt[1], looplm[1])), slot=0)
    torch.testing.assert_close(k, 0.25 * melt[0] + 0.75 * looplm[0], rtol=0, atol=0)
    torch.testing.assert_close(v, 0.25 * melt[1] + 0.75 * looplm[1], rtol=0, atol=0)
