"""Triton kernels for the continuous engine on a GPU: paged attention that reads K/V blocks where they lie, and the
residual add fused with RMSNorm.

Importing this package imports no triton: the engine imports it on every device, and the CPU never runs a kernel
(docs/architecture.md, rule 4: what the GPU machine runs stays light, and the CPU's path stays byte for byte what
`scripts/engine_golden.py` records). `available()` says whether the kernels can run here; the modules that
define them (`attention`, `norm`) import triton and are imported only where they run. Tests run them on the CPU
through Triton's interpreter (`TRITON_INTERPRET=1`, set before the first `triton` import).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch


def available(device: torch.device) -> bool:
    """Whether the kernels run on `device`: a CUDA device with triton importable (interpreted runs are the tests')."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def add_rms_norm_for(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """The fused residual add and RMSNorm a block uses on `device` (`Block.add_norm`), or None (torch's ops)."""
    if not available(device):
        return None
    from adapters.engine.kernels.norm import add_rms_norm

    return add_rms_norm


def paged_attention_for(device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The attention kernel a pool on `device` attends through in place (`BlockPool.attention`), or None where the
    kernels do not run (the SDPA path over gathered blocks)."""
    if not available(device):
        return None
    from adapters.engine.kernels.attention import paged_attention

    return paged_attention
