"""The residual add fused with the RMSNorm that follows it: one kernel where torch runs the add and the norm's five.

A decoder block adds each sublayer's output to the residual stream and norms the sum for the next sublayer
(`adapters.engine.layers.Block`); on a GPU a decode step is launch-bound, and this is one launch and one read of
the row instead of six. Each row's sum is rounded to the model's dtype as torch's add rounds it (what the residual
stream keeps), then normed in float32 as `adapters.engine.layers.rms` norms it: float32 rows exactly, and other
dtypes cast back before the weight's product, as transformers' Qwen3RMSNorm does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _add_rms_norm(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, width, eps, BLOCK: tl.constexpr, FLOAT32: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * width
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    h = tl.load(r_ptr + row + cols, mask=ok, other=0.0) + tl.load(x_ptr + row + cols, mask=ok, other=0.0)
    tl.store(h_ptr + row + cols, h, mask=ok)
    h32 = h.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = h32 / tl.sqrt(tl.sum(h32 * h32, axis=0) / width + eps)
    if not FLOAT32:  # rounded to the model's dtype before the weight, as `rms` does for bf16 and fp16
        normed = normed.to(h.dtype).to(tl.float32)
    tl.store(y_ptr + row + cols, (normed * w).to(h.dtype), mask=ok)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(residual + x, rms(residual + x) * weight) over the last dim, in x's dtype: the new residual and the next
    sublayer's input."""
    width = x.shape[-1]
    x, residual = x.contiguous(), residual.contiguous()
    h, y = torch.empty_like(x), torch.empty_like(x)
    _add_rms_norm[(x.numel() // width,)](
        x, residual, weight, h, y, width, eps, BLOCK=triton.next_power_of_2(width), FLOAT32=x.dtype == torch.float32
    )
    return h, y
