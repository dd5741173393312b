"""MELT: Ouro plus a gated KV row per shared layer, a latent state h per shared layer, and chunk-wise prefill.

Each shared layer keeps a latent state h for the tokens in flight; with x the layer's normalised input,
`h <- z * h + (1 - z) * x` (`MeltGate`), then k = h W_K and v = h W_V overwrite the token's one row (the `gated` layout),
while the query still comes from x. KV grows as layers x tokens and does not depend on r.

Choices the method leaves open (also in docs/reference.md, Engine):
- h starts as the first loop's normalised input x (loop 1 gives h = x, so its K/V equal the LoopLM's) and is
  carried across loops for the tokens in flight; the gate runs from loop 2 on. A converted model therefore
  starts close to its LoopLM.
- Attention inside a chunk sees the chunk's own rows as of the current loop; earlier chunks are seen through
  their final rows. With chunk size 1 this is token-by-token decoding.
- Fresh elementwise gates start with small weights and bias -2 (z ~ 0.12): h stays close to x.
- A full-sequence forward may blend the K/V attention sees, `KV = a * KV_melt + (1 - a) * KV_looplm` (stage-1
  conversion training): `Melt.kv_reference` is the LoopLM's layout those rows are kept in.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from adapters.engine.config import LoopConfig
from adapters.engine.families.ouro import Ouro
from adapters.engine.families.standard import prefill_chunks
from adapters.engine.kv.layouts import PER_LOOP
from adapters.engine.layers import Block

if TYPE_CHECKING:
    from adapters.engine.kv.cache import Cache


class Melt(Ouro):
    """MELT's hooks: gated blocks in the shared layers, chunk-wise prefill and forward, and the LoopLM to blend with."""

    kv_reference = PER_LOOP

    def block(self, layer: int) -> Block:
        p, s = self.cfg.prelude_layers, self.cfg.shared_layers
        return GatedBlock(self.cfg) if p <= layer < p + s else Block(self.cfg)

    @property
    def prefill_chunk(self) -> int | None:
        return self.cfg.chunk_size

    @property
    def gate_variant(self) -> str | None:
        return self.cfg.gate_variant

    @property
    def first_skippable_loop(self) -> int:
        """Loop 1 sets the latent h = x, which every later loop's gate reads: it always runs."""
        return 1

    def forward_chunks(self, n: int, chunk_size: int | Sequence[int] | None) -> list[tuple[int, int]]:
        """The chunks of `LoopedLM.forward`: `chunk_size` (default the config's) cut as a prompt's prefill is, or a
        list of chunk lengths summing to n (a prompt's chunks followed by 1s for decoded tokens)."""
        chunk = chunk_size or self.cfg.chunk_size
        if isinstance(chunk, int):
            return prefill_chunks(n, chunk)
        ends = list(itertools.accumulate(chunk))
        if ends[-1] != n or min(chunk) < 1:
            raise ValueError(f"chunk lengths {list(chunk)} must be positive and sum to the sequence length {n}")
        return list(zip([0] + ends[:-1], ends))

    def extra_params(self) -> int:
        d = self.cfg.hidden_size
        gate = {"elementwise": 2 * d * d + d, "scalar": 1}.get(self.cfg.gate_variant, 0)  # W_z, U_z, b_z; a logit
        return super().extra_params() + self.cfg.shared_layers * gate


class GatedBlock(Block):
    """A shared layer of MELT: its K/V come from the latent h the cache keeps, updated by its `melt_gate`."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__(cfg)
        self.melt_gate = MeltGate(cfg)

    def kv_input(self, x: Tensor, cache: Cache, layer: int, loop: int) -> Tensor | None:
        return cache.kv_source(layer, loop, x, self.melt_gate)

    def init_extra(self, generator: torch.Generator, std: float) -> None:
        fresh_gate(self.melt_gate, generator, std)


class MeltGate(nn.Module):
    """MELT's latent update at loops 2..r: `h <- z * h + (1 - z) * x` with z from the variant.

    elementwise: z = sigmoid(x W_z + h U_z + b_z) (the method; tensors `w_z.weight`, `w_z.bias`, `u_z.weight`);
    scalar: z = sigmoid(logit), one learned scalar per layer (`logit`); last: h = x; mean: running mean
    of x over loops; ema: z = ema_decay.
    """

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        self.variant, self.decay = cfg.gate_variant, cfg.ema_decay
        if self.variant == "elementwise":
            self.w_z = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)
            self.u_z = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        elif self.variant == "scalar":
            self.logit = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor, h: Tensor, loop: int) -> Tensor:
        """x, h [B,n,d]; `loop` is 0-based and >= 1 (loop 0 sets h = x)."""
        z: Tensor | float
        if self.variant == "elementwise":
            z = torch.sigmoid(self.w_z(x) + self.u_z(h))
        elif self.variant == "scalar":
            z = torch.sigmoid(self.logit).to(x.dtype)
        elif self.variant == "last":
            return x
        elif self.variant == "mean":
            z = loop / (loop + 1)
        else:
            z = self.decay
        return z * h + (1 - z) * x


def fresh_gate(gate: MeltGate, generator: torch.Generator, std: float = 0.02) -> None:
    """Initialise a gate so that h starts close to x (z ~ 0.12): a converted model starts near its LoopLM."""
    if gate.variant == "elementwise":
        gate.w_z.weight.normal_(0.0, std, generator=generator)
        gate.u_z.weight.normal_(0.0, std, generator=generator)
        gate.w_z.bias.fill_(-2.0)
    elif gate.variant == "scalar":
        gate.logit.fill_(-2.0)
