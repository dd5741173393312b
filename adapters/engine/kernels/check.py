"""The kernels' first use on a device: each one run on a small case against torch's ops, once per device and dtype.

A kernel that fails to compile, or computes wrong, on a GPU, driver or Triton release the tests never saw would
otherwise fail a user's first run (the kernels are the default on CUDA). `kernels.install` asks `failure` first and,
on a failure, leaves the model on torch's path (SDPA over gathered blocks, torch's norm and RoPE) with one warning
line; the adapter's `describe()` records the path, so the stored run says which one produced its numbers.

The cases are tiny (one query over 21 keys in two blocks of 16, GQA 4:2, head_dim 64): milliseconds once compiled.
The tolerance catches a wrong kernel, not rounding (the kernel tests hold each kernel to its rounding bound): a
share of the reference's largest magnitude, loose for the 16-bit dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from adapters.engine.kernels import Kernel

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}  # relative to the reference's scale
_VERDICTS: dict[tuple[object, ...], str | None] = {}  # (device, dtype, the kernels) -> the first failure, or None


def _randn(*shape: int, device: torch.device, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


def attention_case(kernel: Kernel, device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """The paged kernel at position 20 over blocks 0 and 1, against SDPA over the same 21 rows."""
    q = _randn(1, 4, 1, 64, device=device, dtype=dtype, seed=0)
    k, v = (_randn(32, 2, 64, device=device, dtype=dtype, seed=s) for s in (1, 2))
    blocks, positions = (torch.tensor([values], device=device) for values in ([0, 1], [20]))
    got = kernel(q, k, v, blocks, positions, block_size=16, kv_dtype="auto")
    keys, values = (rows[:21].transpose(0, 1)[None].float() for rows in (k, v))
    want = F.scaled_dot_product_attention(q.float(), keys, values, enable_gqa=True).transpose(1, 2)
    return (got.float() - want).abs().max().item(), want.abs().max().item()


def norm_case(kernel: Kernel, device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """The residual add and RMSNorm of 3 rows of 64, against the same in float32."""
    x, residual = (_randn(3, 64, device=device, dtype=dtype, seed=s) for s in (0, 1))
    weight = _randn(64, device=device, dtype=dtype, seed=2)
    h, y = kernel(x, residual, weight, 1e-6)
    h_want = residual.float() + x.float()
    y_want = h_want * torch.rsqrt(h_want.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    error = max((h.float() - h_want).abs().max().item(), (y.float() - y_want).abs().max().item())
    return error, max(h_want.abs().max().item(), y_want.abs().max().item())


def rope_case(kernel: Kernel, device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """q and k split from a projection's 4 + 2 heads at angle 0 (cos 1, sin 0): the heads as they are, transposed."""
    qkv = _randn(1, 2, 6, 64, device=device, dtype=dtype, seed=3)
    cos, sin = torch.ones(1, 1, 2, 64, device=device, dtype=dtype), torch.zeros(1, 1, 2, 64, device=device, dtype=dtype)
    q, k = kernel(qkv, cos, sin, 4, 2)
    error = max(
        (q - qkv[:, :, :4].transpose(1, 2)).abs().max().item(), (k - qkv[:, :, 4:].transpose(1, 2)).abs().max().item()
    )
    return error, qkv.abs().max().item()


CASES = {"paged_attention": attention_case, "add_rms_norm": norm_case, "qk_rope": rope_case}


def failure(kernels: Mapping[str, Kernel], device: torch.device, dtype: torch.dtype) -> str | None:
    """None when every kernel runs its case and matches torch; else "NAME: why" of the first that does not."""
    for name, case in CASES.items():
        try:
            error, scale = case(kernels[name], device, dtype)
        except Exception as raised:  # noqa: BLE001 (a compile error is whatever Triton raises: each one falls back)
            return f"{name} failed: {type(raised).__name__}: {(str(raised).strip().splitlines() or [''])[0]}"
        if not error <= TOLERANCE[dtype] * max(scale, 1.0):
            return f"{name} differs from torch by {error:.3g} on its check case"
    return None


def cached_failure(kernels: Mapping[str, Kernel], device: torch.device, dtype: torch.dtype) -> str | None:
    """`failure`, computed once per device, dtype and set of kernels in a process (every model load would otherwise
    run the cases again)."""
    key = (str(device), dtype, *kernels.items())
    if key not in _VERDICTS:
        _VERDICTS[key] = failure(kernels, device, dtype)
    return _VERDICTS[key]
