"""The Triton kernels (`adapters.engine.kernels`) run on the CPU through Triton's interpreter, and the float32
rounding arithmetic their tests' bounds are derived from.

The interpreter is chosen when a kernel is defined (`triton.jit` reads TRITON_INTERPRET then), so this module sets
the variable and only then imports the kernels' modules. The kernel tests import the kernels from here, never
directly, so no order of their imports can define a kernel compiled; the engine imports them only where they run
(a GPU), never on the CPU.

Each comparison's tolerance is a bound on float32 rounding in the two computations, derived from their arithmetic,
never fitted: `gamma` is the classical bound the derivations are written in.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' modules (and triton) are imported: they run on the CPU

from collections.abc import Callable  # noqa: E402

from torch import Tensor, nn  # noqa: E402

from adapters.engine.kernels.attention import paged_attention  # noqa: E402
from adapters.engine.kernels.norm import add_rms_norm  # noqa: E402
from adapters.engine.kernels.rope import qk_rope  # noqa: E402
from adapters.engine.layers import Attention, Block  # noqa: E402

__all__ = ["U", "Counted", "add_rms_norm", "gamma", "paged_attention", "qk_rope", "with_kernels"]

U = 2.0**-24  # float32's unit roundoff


def gamma(n: Tensor | float) -> Tensor | float:
    """The classical bound n u / (1 - n u) on the relative error of a sum or product chain of n float32 terms."""
    return n * U / (1 - n * U)


def with_kernels(
    model: nn.Module,
    add_norm: Callable[..., tuple[Tensor, Tensor]] | None,
    rope: Callable[..., tuple[Tensor, Tensor]] | None = None,
) -> None:
    """The blocks' residual add and norm fused by `add_norm` (`Block.add_norm`) and q and k rotated by `rope`
    (`Attention.qk_rope`), as `kernels.install` sets them on a GPU, or torch's ops (None)."""
    for module in model.modules():
        if isinstance(module, Block):
            module.add_norm = add_norm
        elif isinstance(module, Attention):
            module.qk_rope = rope


class Counted:
    """A kernel's function, counting its calls: whether a path ran it."""

    def __init__(self, fn: Callable[..., tuple[Tensor, Tensor]]) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args: object, **kwargs: object) -> tuple[Tensor, Tensor]:
        self.calls += 1
        return self.fn(*args, **kwargs)
