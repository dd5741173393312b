"""Triton kernels for the continuous engine on a GPU: paged attention that reads K/V blocks where they lie, and the
residual add fused with RMSNorm, and q and k normed and rotated in one kernel.

Importing this package imports no triton: the engine imports it on every device, and the CPU never runs a kernel
(docs/architecture.md, rule 4: what the GPU machine runs stays light, and the CPU's path stays byte for byte what
`scripts/engine_golden.py` records). `available()` says whether the kernels can run here; the modules that
define them (`attention`, `norm`, `rope`) import triton and are imported only where they run. Tests run them on the CPU
through Triton's interpreter (`TRITON_INTERPRET=1`, set before the first `triton` import).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from adapters.engine.layers import Attention, Block


def available(device: torch.device) -> bool:
    """Whether the kernels run on `device`: a CUDA device with triton importable (interpreted runs are the tests')."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def install(model: nn.Module, device: torch.device, on: bool) -> Callable[..., torch.Tensor] | None:
    """The model's blocks fuse with the kernels where they run (`on` and `available`): each residual add with the
    norm after it (`Block.add_norm`, `norm`), q and k's bias, norm and RoPE (`Attention.qk_rope`, `rope`); else, or
    with `on` false, they run torch's ops. Either way only outside autograd: the kernels have no backward. Returns
    the paged attention kernel the engine's pools attend through in place (`BlockPool.attention`), or None: the
    SDPA path over gathered blocks."""
    fused: tuple[Callable[..., tuple[torch.Tensor, torch.Tensor]] | None, ...] = (None, None)
    attention = None
    if on and available(device):
        from adapters.engine.kernels.attention import paged_attention
        from adapters.engine.kernels.norm import add_rms_norm
        from adapters.engine.kernels.rope import qk_rope

        fused, attention = (add_rms_norm, qk_rope), paged_attention
    for module in model.modules():
        if isinstance(module, Block):
            module.add_norm = fused[0]
        elif isinstance(module, Attention):
            module.qk_rope = fused[1]
    return attention
