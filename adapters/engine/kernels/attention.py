"""Paged attention that reads K/V where the pool keeps them: no gather of a sequence's blocks into a copy.

The SDPA path (`adapters.engine.serving.paged.PagedStep.update`) gathers every block of every sequence into
[B, L, Hkv, D] tensors at every layer and loop, which at a 32,000-token context copies the whole cache each step
and holds the copy beside it. This kernel walks each sequence's block table instead and reads each block's rows
straight from one entry of the pool ([slots, Hkv, W], W = head_dim, or head_dim value bytes and a float32 scale
for int8 / fp8 rows, `adapters.engine.kv.format`), dequantizing inside the kernel.

One program takes one sequence, one KV head and a tile of query rows: the step's n tokens times the `group` query
heads sharing that KV head (GQA), so a decode step's group of heads reads each block once. It walks the keys in
tiles of `BLOCK_N` positions, each key's row found through the table (block p // block_size, slot p % block_size),
so a tile spans several blocks and any block size works. A query at position p sees keys 0..p of its sequence (the
mask `key_mask` builds for the SDPA path), so one kernel serves a decode step (n = 1, ragged lengths) and a prefill
chunk (causal over the context and the chunk). Scores and the online softmax run in float32 (the running max and
sum, FlashAttention's rescaling); K and V are cast to the queries' dtype for the products, as the SDPA path hands
them over (float32 products in full float32, not TF32). A decode step with few programs splits each context into
parts (`splits`, flash-decoding) whose partial sums are merged by their maxima afterwards: at batch 1 on an H100
one program per KV head would leave most of its 132 SMs idle.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

FORMATS = {"auto": 0, "int8": 1, "fp8": 2}  # `adapters.engine.kv.format` names -> the kernel's FORMAT
BLOCK_N = 64  # keys a program reads per iteration (from as many blocks as they span)
SPLIT_KEYS = 256  # fewest keys one part of a split context covers
TARGET_PROGRAMS = 264  # programs a step aims at before splitting contexts (2 per SM of an H100)


@triton.jit
def _dequantize(rows, scale_ptrs, mask, FORMAT: tl.constexpr):
    """Stored rows [N, D] -> float32 values: int8 bytes as signed, fp8 e4m3 bytes through float16's bits (the
    byte's sign to bit 15, its exponent and mantissa to bits 13..7, times 2^8 for the biases' difference: exact
    for every finite code, as `kv.format.Fp8.decode`), times each row's float32 scale."""
    if FORMAT == 1:
        values = rows.to(tl.int8, bitcast=True).to(tl.float32)
    else:
        bits = rows.to(tl.uint16)
        half = (((bits & 0x80) << 8) | ((bits & 0x7F) << 7)).to(tl.uint16)  # 16 bits, however the literals promote
        values = half.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    scale = tl.load(scale_ptrs, mask=mask, other=0.0)
    return values * scale[:, None]


@triton.jit
def _paged_attention(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    pos_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    sm_scale,
    n_kv,
    n_tokens,
    group,
    block_size,
    keys_per_split,
    q_sb,
    q_sh,
    q_sn,
    k_ss,
    k_sh,
    s_ss,
    s_sh,
    t_sb,
    p_sb,
    p_sn,
    o_ss,
    o_sb,
    o_sn,
    o_sh,
    ml_ss,
    ml_sb,
    ml_sn,
    HEAD_DIM: tl.constexpr,
    SCALE_AT: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FORMAT: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b, kv_head = tl.program_id(0) // n_kv, tl.program_id(0) % n_kv
    part = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows: token rows // group, head rows % group
    token, head = rows // group, kv_head * group + rows % group
    row_ok = token < n_tokens
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * q_sb + head[:, None] * q_sh + token[:, None] * q_sn + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    pos = tl.load(pos_ptr + b * p_sb + token * p_sn, mask=row_ok, other=0).to(tl.int32)  # padding rows: key 0
    first = part * keys_per_split
    last = tl.minimum(tl.max(pos, axis=0) + 1, first + keys_per_split)  # past the tile's last key, or the part's end
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(first, last, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)  # key positions; each finds its block in the table, its slot in the block
        key_ok = key < last
        block = tl.load(table_ptr + b * t_sb + key // block_size, mask=key_ok, other=0)
        slot = block * block_size + key % block_size
        where = slot[:, None] * k_ss + kv_head * k_sh + d[None, :]
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + where, mask=kv_mask, other=0)
        v = tl.load(v_ptr + where, mask=kv_mask, other=0)
        if FORMAT != 0:
            scale_at = slot * s_ss + kv_head * s_sh + SCALE_AT
            k = _dequantize(k, ks_ptr + scale_at, key_ok, FORMAT)
            v = _dequantize(v, vs_ptr + scale_at, key_ok, FORMAT)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * sm_scale
        seen = key_ok[None, :] & (key[None, :] <= pos[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: exp(-inf) = 0, not NaN
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        m_i = m_new
    at = part * o_ss + b * o_sb + token[:, None] * o_sn + head[:, None] * o_sh + d[None, :]
    out_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:  # the part's unnormalised sum, its max and its denominator, merged by `merge`
        tl.store(out_ptr + at, acc, mask=out_mask)
        ml_at = part * ml_ss + b * ml_sb + token * ml_sn + head
        tl.store(m_ptr + ml_at, m_i, mask=row_ok)
        tl.store(l_ptr + ml_at, l_i, mask=row_ok)
    else:
        tl.store(out_ptr + at, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


def paged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    blocks: Tensor,
    positions: Tensor,
    *,
    block_size: int,
    kv_dtype: str,
    splits: int | None = None,
) -> Tensor:
    """Attention of queries q [B, H, n, D] (RoPE applied) over one entry of the pool, read in place.

    k, v [slots, Hkv, W]: the entry's rows, as the pool stores them (`kv_dtype` auto: W = D in q's dtype; int8 and
    fp8: D value bytes then a float32 scale's 4 bytes, uint8). `blocks` [B, Wb]: each sequence's block table, at
    least up to its last position's block; `positions` [B, n]: the queries' positions, each seeing keys 0..p of
    its sequence. `splits`: parts each context is cut into (default: enough to fill the GPU at small batches).
    Returns [B, n, H, D] in q's dtype: the heads side by side per token, as the output projection reads them.
    """
    b, h, n, d = q.shape
    n_kv = k.shape[1]
    group = h // n_kv
    fmt = FORMATS[kv_dtype]
    if q.stride(-1) != 1:
        q = q.contiguous()
    scales_k, scales_v = (k, v) if fmt == 0 else (k.view(torch.float32), v.view(torch.float32))  # scale at column D/4
    block_m = max(16, triton.next_power_of_2(n * group))  # tl.dot needs 16 rows at least
    block_m = min(block_m, 64)
    tiles = triton.cdiv(n * group, block_m)
    keys = blocks.shape[1] * block_size
    block_n = min(BLOCK_N, max(16, triton.next_power_of_2(keys)))  # tl.dot needs 16 at least
    if splits is None:
        splits = max(1, min(triton.cdiv(keys, SPLIT_KEYS), TARGET_PROGRAMS // (b * n_kv * tiles)))
    per_split = triton.cdiv(triton.cdiv(keys, splits), block_n) * block_n
    out = q.new_empty(b, n, h, d)
    parts = out if splits == 1 else q.new_empty(splits, b, n, h, d, dtype=torch.float32)
    m = l = parts  # unused unless split
    if splits > 1:
        m, l = (q.new_empty(splits, b, n, h, dtype=torch.float32) for _ in range(2))
    _paged_attention[(b * n_kv, tiles, splits)](
        q,
        k,
        v,
        scales_k,
        scales_v,
        blocks,
        positions,
        parts,
        m,
        l,
        1.0 / math.sqrt(d),
        n_kv,
        n,
        group,
        block_size,
        per_split,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        scales_k.stride(0),
        scales_k.stride(1),
        blocks.stride(0),
        positions.stride(0),
        positions.stride(1),
        0 if splits == 1 else parts.stride(0),
        parts.stride(-4),
        parts.stride(-3),
        parts.stride(-2),
        m.stride(0),
        m.stride(1),
        m.stride(2),
        HEAD_DIM=d,
        SCALE_AT=d // 4,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        FORMAT=fmt,
        SPLIT=splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if splits == 1:
        return out
    return merge(parts, m, l).to(q.dtype)


def merge(parts: Tensor, m: Tensor, l: Tensor) -> Tensor:
    """The parts of a split context merged: each part's sum and denominator rescaled to the largest maximum
    (a part past a row's last key has max -inf and weighs 0)."""
    top = m.amax(0)
    weight = torch.exp(m - top)
    return (parts * weight[..., None]).sum(0) / (l * weight).sum(0)[..., None]
