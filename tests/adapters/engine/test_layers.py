"""The parts every family is built of (`adapters.engine.layers`), on real tensors: the norm, RoPE, the fused projections'
state dicts, and attention over a cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adapters.engine.kv.cache import ChunkCache
from adapters.engine.kv.layouts import layout_of
from adapters.engine.io.presets import preset
from adapters.engine.layers import MLP, Attention, RMSNorm, Rotary, Span, apply_rope

CFG = preset("qwen3-tiny")
GEN = torch.Generator().manual_seed(3)


def test_rms_norm_is_the_textbook_form():
    """x / sqrt(mean(x^2) + eps) * w; float32 sums of 128 terms agree to a few ulps (relative 1e-6 is ~8 ulps)."""
    x, norm = torch.randn(4, 7, 128, generator=GEN), RMSNorm(128, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(128, generator=GEN) + 0.5)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(norm(x), want, rtol=1e-6, atol=1e-6)


def test_rope_rotates_by_position_so_scores_depend_on_the_distance_only():
    """Each channel pair is rotated (norms kept), position 0 is the identity, and q.k at positions (i, j) equals q.k at
    (i + 9, j + 9); float32 products of 32 channels agree to 1e-5 of their size."""
    rotary, q, k = (
        Rotary(32, 10_000.0),
        torch.randn(1, 1, 1, 32, generator=GEN),
        torch.randn(1, 1, 1, 32, generator=GEN),
    )

    def at(x: torch.Tensor, pos: int) -> torch.Tensor:
        return apply_rope(x, *rotary(torch.tensor([[pos]]), torch.float32))

    assert torch.equal(at(q, 0), q)
    assert torch.allclose(at(q, 7).norm(), q.norm(), rtol=1e-6)
    scores = [(at(q, i) * at(k, j)).sum() for i, j in ((3, 1), (12, 10))]
    assert torch.allclose(scores[0], scores[1], rtol=1e-5, atol=1e-5)


def test_fused_projections_save_and_load_under_hf_names():
    attn, mlp = Attention(CFG), MLP(CFG)
    names = set(attn.state_dict()) | set(mlp.state_dict())
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight"} <= names
    assert not names & {"qkv_proj.weight", "gate_up_proj.weight"}
    again = Attention(CFG)
    again.load_state_dict(attn.state_dict())
    assert torch.equal(again.qkv_proj.weight, attn.qkv_proj.weight)


def test_attention_is_causal_softmax_attention_over_what_the_cache_holds():
    """Two calls through a cache (4 tokens, then 3 seeing them) give what one causal call over all 7 gives; and the one
    call is the textbook softmax(q k^T / sqrt(D)) v with the grouped heads repeated (float32 sums over a head dim of
    32 and 7 keys of O(1) values: a few ulps of 1e-7 each, well inside 1e-5)."""
    attn = Attention(CFG)
    x, rotary = torch.randn(1, 7, CFG.hidden_size, generator=GEN), Rotary(CFG.head_dim, CFG.rope_theta)
    rope = rotary(torch.arange(7)[None], torch.float32)

    def span(s0: int, s1: int) -> Span:
        part = tuple(t[:, :, s0:s1] for t in rope)
        mask = None if s0 == 0 else (torch.arange(s1)[None, :] <= torch.arange(s0, s1)[:, None])[None, None]
        return Span(part, s0, mask)

    with torch.no_grad():
        whole = attn.attend(x, None, span(0, 7), ChunkCache(CFG, layout_of(CFG), 1), 0, 0)
        cache = ChunkCache(CFG, layout_of(CFG), 1)
        parts = torch.cat([attn.attend(x[:, a:b], None, span(a, b), cache, 0, 0) for a, b in ((0, 4), (4, 7))], dim=1)
        q, k, v = attn.project(x, None, rope)
        groups = CFG.num_heads // CFG.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)) / CFG.head_dim**0.5
        weights = torch.softmax(scores.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf")), dim=-1)
        textbook = F.linear((weights @ v).transpose(1, 2).reshape(1, 7, -1), attn.o_proj.weight)
    assert torch.allclose(parts, whole, atol=1e-5) and torch.allclose(whole, textbook, atol=1e-5)
