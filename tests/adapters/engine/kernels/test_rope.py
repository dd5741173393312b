"""`kernels.rope.qk_rope`, q and k biased, normed per head and rotated in one kernel, against `Attention.project`'s
torch ops through Triton's interpreter on the CPU (`tests.support.triton_interpreter`).

The tolerance is a bound on float32 rounding in the two computations, derived from their arithmetic
(`rope_bound`), never fitted.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from adapters.engine.io.presets import preset
from adapters.engine.layers import Attention, Rotary
from tests.support.triton_interpreter import Counted, gamma, qk_rope

pytestmark = pytest.mark.numerics  # parity with the torch path: .ci/run checks the bounds under a second CPU capability


def rope_bound(qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Elementwise: y = a cos + roll(a) sin from the exactly normed rows a. Each evaluation's a is within gamma(D + 5)
    of exact per element (the bias add is the same float32 sum on both sides; the norm: D squares summed, the mean,
    eps, the square root, the division, the weight), and its two products and sum add gamma(2): so two evaluations
    differ by at most 2 gamma(D + 7) (|a cos| + |roll(a) sin|)."""
    d = qk.shape[-1]
    return 2 * gamma(d + 7) * (qk.abs() * cos.abs() + qk.roll(d // 2, -1).abs() * sin.abs())


@pytest.mark.parametrize(("name", "bias"), [("qwen3-tiny", False), ("ouro-tiny", False), ("ouro-tiny", True)])
def test_qk_rope_matches_the_projection(name, bias):
    """Attention.project with the fused kernel against torch's ops: Qwen3's per-head q/k norm with GQA, Ouro's
    plain q and k, and a q/k bias as Huginn's (as many KV heads as heads): the same v, q and k within the bound."""
    cfg = preset(name)
    if bias:
        cfg = cfg.replace(num_kv_heads=cfg.num_heads)
    torch.manual_seed(0)
    attention = Attention(cfg, qk_bias=bias)
    if bias:
        torch.nn.init.normal_(attention.qk_bias)
    for norm in (attention.q_norm, attention.k_norm):
        if norm is not None:
            torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    x = torch.randn(2, 5, cfg.hidden_size) * 3
    positions = torch.tensor([[0, 1, 2, 3, 4], [17, 18, 19, 20, 21]])
    rope = Rotary(cfg.head_dim, cfg.rope_theta)(positions, torch.float32)
    with torch.inference_mode():
        q, k, v = attention.project(x, None, rope)
        attention.qk_rope = counted = Counted(qk_rope)
        fused_q, fused_k, fused_v = attention.project(x, None, rope)
        attention.qk_rope = None
        # the rows the rotation reads: torch's own q and k before RoPE (normed, biased), recomputed for the bound
        heads = cfg.num_heads
        qkv = F.linear(x, attention.qkv_proj.weight).view(2, 5, -1, cfg.head_dim)[:, :, : heads + cfg.num_kv_heads]
        if bias:
            qkv = qkv + attention.qk_bias.flatten(0, 2)
        if attention.q_norm is not None:
            qkv = torch.cat((attention.q_norm(qkv[:, :, :heads]), attention.k_norm(qkv[:, :, heads:])), 2)
    bound = rope_bound(qkv.transpose(1, 2), *rope)
    assert counted.calls == 1 and torch.equal(fused_v, v)
    assert bool(((fused_q - q).abs() <= bound[:, :heads]).all())
    assert bool(((fused_k - k).abs() <= bound[:, heads:]).all())
