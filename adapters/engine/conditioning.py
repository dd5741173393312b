"""Loop conditioning: what the recurrence study adds around the shared core (`LoopConfig.injection`, `history`,
`history_window`, `loop_gate`, `branch_gate`). Every option starts as the identity, so a converted model starts
unchanged; any family without a recurrent state may carry it (`LoopConditioning`'s docstring has the formulas).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.config import LOOP_GATE_DIM, LoopConfig


class Mix(nn.Module):
    """`count` zero-initialised maps of a state [.., d]: scalar (count), channel-wise (count x d) or dense (count x d x d)."""

    def __init__(self, kind: str, count: int, d: int) -> None:
        super().__init__()
        self.kind = kind
        shape = {"scalar": (count, 1), "channel": (count, d), "dense": (count, d, d)}[kind]
        self.weight = nn.Parameter(torch.zeros(shape))

    def forward(self, j: int, x: Tensor) -> Tensor:
        """Map number j applied to x."""
        return F.linear(x, self.weight[j]) if self.kind == "dense" else x * self.weight[j]


class LoopConditioning(nn.Module):
    """What the recurrence study adds around the shared core; every option starts as the identity.

    With e the state entering loop 1 (the prelude's output, or the embeddings when p = 0) and h_l the
    state loop l hands on (h_0 = e), loop l (1-based) runs the core on

        x_l = h_{l-1} + A e + sum_{j=1..w} B_j (h_{l-j} - h_{l-j-1})      (terms with l-j-1 < 1 dropped)

    and hands on h_l = x_l + (1 + tanh(g_l)) * (core(x_l) - x_l). The history excludes the embedding
    state, so loops 1 and 2 see none and loop 3 sees B_1 (h_2 - h_1). A and B_j are scalar, channel-
    wise or dense (`Mix`); g_l is an 8-vector per loop position (`LOOP_GATE_DIM`), entry k scaling the
    k-th of 8 equal channel groups of the net update; loops beyond the trained T reuse the last row.
    Branch gating scales each shared layer's attention and MLP outputs at loop l the same way, by
    1 + tanh of their own 8-vectors (T x s x 2 of them), before they join the residual stream.
    With A = B = g = 0 (their initialisation) x_l = h_{l-1} and h_l = core(x_l): the plain model.
    """

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.window = cfg.history_window
        self.injection = None if cfg.injection == "none" else Mix(cfg.injection, 1, d)
        self.history = None if cfg.history == "none" else Mix(cfg.history, cfg.history_window, d)
        self.gate = nn.Parameter(torch.zeros(cfg.loops, LOOP_GATE_DIM)) if cfg.loop_gate else None
        self.branch = (
            nn.Parameter(torch.zeros(cfg.loops, cfg.shared_layers, 2, LOOP_GATE_DIM)) if cfg.branch_gate else None
        )

    def loop_input(self, h: Tensor, e: Tensor, diffs: Sequence[Tensor]) -> Tensor:
        """x_l from h_{l-1}, e and the newest-first differences h_{l-1} - h_{l-2}, ... (at most w)."""
        x = h if self.injection is None else h + self.injection(0, e)
        if self.history is not None:
            for j, diff in enumerate(diffs):
                x = x + self.history(j, diff)
        return x

    def gated(self, x: Tensor, y: Tensor, loop: int) -> Tensor:
        """x + (1 + tanh(g_loop)) * (y - x), per channel group; y itself without Loop Gating."""
        if self.gate is None:
            return y
        g = self.gate[min(loop, self.gate.shape[0] - 1)]
        extra = torch.tanh(g).repeat_interleave(x.shape[-1] // LOOP_GATE_DIM).to(x.dtype)
        return y + extra * (y - x)  # = x + (1 + tanh g)(y - x), written so that g = 0 gives y bit for bit

    def branch_scales(self, loop: int, layer: int, d: int) -> Tensor | None:
        """[2, d]: 1 + tanh(g) per channel group for shared layer `layer`'s attention and MLP outputs at `loop`
        (exactly 1 at g = 0), or None without branch gating."""
        if self.branch is None:
            return None
        return 1 + torch.tanh(self.branch[min(loop, self.branch.shape[0] - 1), layer]).repeat_interleave(
            d // LOOP_GATE_DIM, dim=-1
        )
