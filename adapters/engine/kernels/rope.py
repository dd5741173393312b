"""q and k from the fused QKV projection's output, normed per head and rotated in one kernel.

`adapters.engine.layers.Attention.project` turns the projection's q and k heads into what attention reads in about
ten kernels on a GPU (the bias, the per-head RMSNorm and its two weights, RoPE's four products and sums, the
transposes' copies). Here one program takes one token's head row: it adds the bias (Huginn's), norms the row
(`qk_norm`, Qwen3's) and rotates it with the RoPE tables the step already holds (`Rotary`, rotate-half with the sign
folded into the sine: x cos + roll(x, D/2) sin), in float32, and writes q as [B, n, H, D] and k as [B, n, Hkv, D],
the layouts the attention kernel and the pool's write read, so no copy follows.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _qk_rope(
    qk_ptr,
    cos_ptr,
    sin_ptr,
    bias_ptr,
    qw_ptr,
    kw_ptr,
    q_ptr,
    k_ptr,
    heads,
    eps,
    x_st,
    x_sh,
    c_st,
    q_st,
    q_sh,
    k_st,
    k_sh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BIAS: tl.constexpr,
    NORM: tl.constexpr,
):
    token, head = tl.program_id(0), tl.program_id(1)  # token: b * n + i over the step's rows
    d = tl.arange(0, BLOCK_D)
    ok = d < HEAD_DIM
    half = (d + HEAD_DIM // 2) % HEAD_DIM  # rotate-half's partner of each column
    x = tl.load(qk_ptr + token * x_st + head * x_sh + d, mask=ok, other=0.0).to(tl.float32)
    xr = tl.load(qk_ptr + token * x_st + head * x_sh + half, mask=ok, other=0.0).to(tl.float32)
    if BIAS:
        x += tl.load(bias_ptr + head * HEAD_DIM + d, mask=ok, other=0.0).to(tl.float32)
        xr += tl.load(bias_ptr + head * HEAD_DIM + half, mask=ok, other=0.0).to(tl.float32)
    if NORM:  # each head's row normed, then scaled by q's or k's weight
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
        if head < heads:
            w = tl.load(qw_ptr + d, mask=ok, other=0.0).to(tl.float32)
            wr = tl.load(qw_ptr + half, mask=ok, other=0.0).to(tl.float32)
        else:
            w = tl.load(kw_ptr + d, mask=ok, other=0.0).to(tl.float32)
            wr = tl.load(kw_ptr + half, mask=ok, other=0.0).to(tl.float32)
        x = x * inv * w
        xr = xr * inv * wr
    cos = tl.load(cos_ptr + token * c_st + d, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * c_st + d, mask=ok, other=0.0).to(tl.float32)
    y = x * cos + xr * sin
    if head < heads:
        tl.store(q_ptr + token * q_st + head * q_sh + d, y.to(q_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(k_ptr + token * k_st + (head - heads) * k_sh + d, y.to(k_ptr.dtype.element_ty), mask=ok)


def qk_rope(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    heads: int,
    kv_heads: int,
    *,
    bias: Tensor | None = None,
    q_weight: Tensor | None = None,
    k_weight: Tensor | None = None,
    eps: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """qkv [B, n, H + 2 Hkv, D] (the projection's heads), cos and sin [B, 1, n, D] -> q [B, H, n, D], k [B, Hkv, n, D]
    (views of [B, n, heads, D] tensors): q and k heads plus `bias` [H + Hkv, D], RMS-normed per head with eps and
    scaled by q_weight and k_weight when given, then rotated."""
    b, n, _, d = qkv.shape
    if qkv.stride(-1) != 1 or qkv.stride(0) != n * qkv.stride(1):
        qkv = qkv.contiguous()
    cos, sin = cos.expand(b, 1, n, d).contiguous(), sin.expand(b, 1, n, d).contiguous()
    q, k = qkv.new_empty(b, n, heads, d), qkv.new_empty(b, n, kv_heads, d)
    norm = q_weight is not None
    _qk_rope[(b * n, heads + kv_heads)](
        qkv,
        cos,
        sin,
        qkv if bias is None else bias,
        q_weight if norm else qkv,
        k_weight if norm else qkv,
        q,
        k,
        heads,
        eps,
        qkv.stride(1),
        qkv.stride(2),
        d,
        q.stride(1),
        q.stride(2),
        k.stride(1),
        k.stride(2),
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BIAS=bias is not None,
        NORM=norm,
    )
    return q.transpose(1, 2), k.transpose(1, 2)
