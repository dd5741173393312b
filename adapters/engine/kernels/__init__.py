"""Triton kernels for the engine on a GPU: paged attention that reads K/V blocks where they lie (`attention`), the
residual add fused with RMSNorm (`norm`), and q and k biased, normed and rotated in one kernel (`rope`).

Importing this package imports no triton: the engine imports it on every device, and the CPU never runs a kernel
(docs/architecture.md, rule 4: what the GPU machine runs stays light, and the CPU's path stays byte for byte what
`scripts/engine_golden.py` records). `install` sets the kernels on a model where they run (`available`) and
imports their modules, which import triton, only then. Tests run them on the CPU through Triton's interpreter
(`TRITON_INTERPRET=1`, set before the kernels' modules are imported: `triton.jit` reads it when a kernel is defined).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from adapters.engine.layers import Attention, Block

Kernel = Callable[..., Any]


def available(device: torch.device) -> bool:
    """Whether the kernels run on `device`: a CUDA device with triton importable (interpreted runs are the tests')."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def install(
    model: nn.Module, device: torch.device, on: bool, kernels: Mapping[str, Kernel] | None = None
) -> tuple[Kernel | None, str]:
    """The model's blocks fuse with the kernels where they run (`on` and `available`) and pass their first-use check
    (`check.cached_failure`, on the model's own parameters' device and dtype): each residual add with the norm after
    it (`Block.add_norm`, `norm`), q and k's bias, norm and RoPE (`Attention.qk_rope`, `rope`); else torch's ops,
    and a kernel that failed its check says so in one warning line. Either way only outside autograd: the kernels
    have no backward. `kernels`: by name, the functions to install (default: the Triton modules' own).

    Returns the paged attention kernel the engine's pools attend through in place (`BlockPool.attention`), or None:
    the SDPA path over gathered blocks; and the path taken, as the run records it: "triton", "torch", or "torch: "
    and the failure of the kernel that fell back."""
    fused: tuple[Kernel | None, Kernel | None] = (None, None)
    attention, path = None, "torch"
    if on and available(device):
        from adapters.engine.kernels.check import cached_failure

        kernels = kernels or _triton_kernels()
        weight = next(model.parameters())
        if failed := cached_failure(kernels, weight.device, weight.dtype):
            print(f"loopeval: warning: Triton kernel {failed}; the engine runs torch's ops (SDPA)", file=sys.stderr)
            path = f"torch: {failed}"
        else:
            fused = (kernels["add_rms_norm"], kernels["qk_rope"])
            attention, path = kernels["paged_attention"], "triton"
    for module in model.modules():
        if isinstance(module, Block):
            module.add_norm = fused[0]
        elif isinstance(module, Attention):
            module.qk_rope = fused[1]
    return attention, path


def _triton_kernels() -> dict[str, Kernel]:
    """The kernels by name; importing their modules imports triton, so only where they run."""
    from adapters.engine.kernels.attention import paged_attention
    from adapters.engine.kernels.norm import add_rms_norm
    from adapters.engine.kernels.rope import qk_rope

    return {"paged_attention": paged_attention, "add_rms_norm": add_rms_norm, "qk_rope": qk_rope}
