"""How K/V rows are stored: the model's dtype (`auto`), or int8 / fp8 values with a float32 scale per token and head.

A quantized row keeps its head_dim values and their scale side by side as bytes, [..., head_dim + 4] uint8,
so every block copy, gather and fork of the paged pool and the decode rows moves values and scale together
untouched; only a cache's write (`pack`) and its read for attention (`unpack`) know the format. The scale is
symmetric, amax / qmax over the row's head_dim values (int8: qmax 127, values rounded; fp8: float8_e4m3fn,
qmax 448, vLLM's fp8 KV with a scale per token and head rather than per tensor).

The scale is float32: exact for any amax (no fp16 underflow of a small row's scale, no bf16 rounding added to
the values' own), at 4 bytes per token and head. On the float32 zoo (head_dim 32) an int8 token holds
(32 + 4) / (4 x 32) = 0.281 of auto's bytes; on a bf16 model with head_dim 128, (128 + 4) / 256 = 0.516.
`auto` returns the rows it is given, so the model-dtype path is the engine's as before, byte for byte.
"""

from __future__ import annotations

import torch
from torch import Tensor

SCALE_DTYPE = torch.float32
SCALE_BYTES = 4


class KVFormat:
    """`auto`: rows in the model's dtype, written and read as they are."""

    name = "auto"

    def storage(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a cache's K/V tensors hold."""
        return dtype

    def width(self, head_dim: int) -> int:
        """Elements of one stored row (one token, one head)."""
        return head_dim

    def row_bytes(self, head_dim: int, dtype_size: int) -> int:
        """Bytes of one stored row for a model of `dtype_size` bytes per value."""
        return head_dim * dtype_size

    def pack(self, x: Tensor) -> Tensor:
        """Rows [..., head_dim] as stored."""
        return x

    def pack_pair(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """K and V rows as stored (a quantized format packs them in one pass: a decode step's packing is per-kernel cost)."""
        return k, v

    def unpack(self, rows: Tensor, dtype: torch.dtype) -> Tensor:
        """Stored rows back as [..., head_dim] of `dtype`, what attention reads."""
        return rows

    def unpack_copy(self, rows: Tensor, dtype: torch.dtype) -> Tensor:
        """`unpack` into memory of its own: what a folding layout reads before it writes the rows over."""
        return rows.clone()

    def round_trip(self, x: Tensor) -> Tensor:
        """What attention reads of rows `x` once stored (a full-sequence forward's cache keeps tensors, not bytes)."""
        return x


class Quantized(KVFormat):
    """Values scaled into [-qmax, qmax] and stored as one byte each (`encode`, `decode`), beside each row's float32
    scale, packed as bytes."""

    name, qmax = "", 1.0

    def storage(self, dtype: torch.dtype) -> torch.dtype:
        return torch.uint8

    def width(self, head_dim: int) -> int:
        return head_dim + SCALE_BYTES

    def row_bytes(self, head_dim: int, dtype_size: int) -> int:
        return head_dim + SCALE_BYTES

    def pack(self, x: Tensor) -> Tensor:
        """|x / scale| <= qmax up to float32 rounding, which int8's rounding and fp8's round-to-nearest cast keep
        within range: no clamp. An all-zero row gets the smallest normal scale, not 0 / 0."""
        x = x.float()
        scale = (x.abs().amax(-1, keepdim=True) / self.qmax).clamp_min_(torch.finfo(SCALE_DTYPE).tiny)
        return torch.cat((self.encode(x / scale), scale.view(torch.uint8)), dim=-1)

    def pack_pair(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        k_packed, v_packed = self.pack(torch.stack((k, v))).unbind(0)
        return k_packed, v_packed

    def unpack(self, rows: Tensor, dtype: torch.dtype) -> Tensor:
        d = rows.shape[-1] - SCALE_BYTES
        return (self.decode(rows[..., :d]) * rows[..., d:].view(SCALE_DTYPE)).to(dtype)

    def unpack_copy(self, rows: Tensor, dtype: torch.dtype) -> Tensor:
        return self.unpack(rows, dtype)  # dequantizing writes new memory

    def round_trip(self, x: Tensor) -> Tensor:
        return self.unpack(self.pack(x), x.dtype)

    def encode(self, q: Tensor) -> Tensor:
        """float32 values within [-qmax, qmax] -> their bytes."""
        raise NotImplementedError

    def decode(self, values: Tensor) -> Tensor:
        """Bytes -> float32 values."""
        raise NotImplementedError


class Int8(Quantized):
    """int8: values rounded to the nearest of -127..127 (symmetric: -128 unused)."""

    name, qmax = "int8", 127.0

    def encode(self, q: Tensor) -> Tensor:
        return q.round_().to(torch.int8).view(torch.uint8)

    def decode(self, values: Tensor) -> Tensor:
        return values.view(torch.int8).to(SCALE_DTYPE)


class Fp8(Quantized):
    """float8_e4m3fn (4 exponent bits, bias 7; 3 mantissa bits; 448 the largest finite value), as vLLM's fp8 KV.

    Decoding moves the byte's exponent and mantissa into a float16's (sign to bit 15, the 7 low bits to bits 13..7),
    multiplies by 2^(15 - 7), the difference of the biases, and widens: exact for every finite code, subnormals
    included (their float16 image is subnormal by the same shift, and the product is at most 448). torch's own
    float8 -> float32 cast is slower on the CPU, and far slower than an int8 cast (docs/benchmarks.md, "Figures
    behind choices in the code").
    """

    name, qmax = "fp8", 448.0

    def encode(self, q: Tensor) -> Tensor:
        return q.to(torch.float8_e4m3fn).view(torch.uint8)

    def decode(self, values: Tensor) -> Tensor:
        bits = values.to(torch.int16)
        return ((bits & 0x80) << 8 | (bits & 0x7F) << 7).view(torch.float16).mul_(256.0).to(SCALE_DTYPE)


AUTO = KVFormat()
KV_FORMATS: dict[str, KVFormat] = {f.name: f for f in (AUTO, Int8(), Fp8())}
