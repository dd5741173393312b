"""Huginn's recurrent state (`Recurrence`): the law of its keyed draw (the official truncated normal's), and what a
seed, a stream, a position and a channel change; `tests/adapters/engine/test_streams.py` checks the draws in the
generation paths."""

from __future__ import annotations

import math

import torch

from adapters.engine.config import LoopConfig
from adapters.engine.families import family_of
from adapters.engine.families.recurrence import Recurrence
from adapters.engine.streams import stream_key


def recurrence(seed: int = 0, scale: float = 1.0) -> Recurrence:
    """Huginn-0125's recurrence at width 64 (std sqrt(2 / 5d), embedding scale sqrt(d)), seeded."""
    rec = family_of(
        LoopConfig(
            family="huginn",
            vocab_size=99,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=4,
            head_dim=16,
            ffn_size=96,
            prelude_layers=1,
            shared_layers=2,
            coda_layers=1,
            loops=4,
            norm_layout="sandwich",
            kv_strategy="per_loop",
            tie_embeddings=True,
        )
    ).state()
    rec.reseed(seed, scale)
    return rec


def keyed(rec: Recurrence, streams: list[int], length: int, d: int = 64, start: int = 0) -> torch.Tensor:
    positions = torch.arange(start, start + length).expand(len(streams), -1)
    keys = rec.token_keys(torch.tensor(streams)[:, None].expand(-1, length), positions)
    return rec.initial_state(torch.zeros(len(streams), length, d), keys)


def test_the_keyed_draw_is_the_official_truncated_normal():
    """A million values: mean 0, the truncated normal's std (0.9866 sigma) times the embedding scale, nothing past 3 std,
    the official draw's quantiles; the slices a long prompt is hashed in change nothing."""
    rec = recurrence()
    sigma = rec.std * rec.embed_scale
    x = keyed(rec, [stream_key(7, j) for j in range(4)], 4096)
    official = rec.initial_state(torch.zeros(4, 4096, 64))  # the generator's draw (LoopedLM.forward's)
    assert abs(x.mean().item()) < 0.005 * sigma
    assert abs(x.std().item() / sigma - 0.98658) < 0.005
    assert x.abs().max().item() <= 3 * sigma * (1 + 1e-6) and x.abs().max().item() > 2.9 * sigma
    q = torch.tensor([0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999])
    assert torch.allclose(x.flatten().quantile(q) / sigma, official.flatten().quantile(q) / sigma, atol=0.02)
    first = keyed(rec, [stream_key(7, 0)], 4096)[0]
    assert torch.equal(
        first[1000:1010], keyed(rec, [stream_key(7, 0)], 10, start=1000)[0]
    )  # a token's draw: its key and position only
    assert torch.equal(x[0], first)


def test_seeds_streams_positions_and_channels_give_different_draws():
    a, b = (
        keyed(recurrence(0), [stream_key(5, 0), stream_key(5, 1)], 8),
        keyed(recurrence(1), [stream_key(5, 0), stream_key(5, 1)], 8),
    )
    assert torch.equal(a, keyed(recurrence(0), [stream_key(5, 0), stream_key(5, 1)], 8))
    assert not torch.isclose(a, b).any()  # another seed: every value redrawn
    assert not torch.isclose(a[0], a[1]).any()  # another sample
    assert not torch.isclose(a[0, :-1], a[0, 1:]).any()  # another position
    assert not torch.isclose(a[..., :-1], a[..., 1:]).any()  # another channel


def test_the_zero_state_is_unchanged():
    rec = recurrence(scale=0.0)
    keys = rec.token_keys(torch.tensor([[1], [2]]).expand(-1, 5), torch.arange(5).expand(2, -1))
    assert torch.equal(rec.initial_state(torch.ones(2, 5, 64), keys), torch.zeros(2, 5, 64))
    assert math.isclose(recurrence().std * recurrence().embed_scale, math.sqrt(2 / (5 * 64)) * 8)
