"""Huginn's recurrent state (`Recurrence`): the state the recurrent families' loops start from and inject.

A module of its own because the plain stack's hooks name it (`Family.state`) as well as the recurrent families
(`adapters.engine.families.huginn`) that build it; it reads only the config and the keyed streams.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.config import LoopConfig
from adapters.engine.streams import M32, mix32, uniform

TRUNCATION = 3.0  # the initial state is a normal truncated at +-3 std, as the official `initialize_state` draws it
_TAIL = 0.5 * math.erfc(TRUNCATION / math.sqrt(2))  # Phi(-3): the probability below the truncation
STATE_STREAM = 0x243F6A88  # mixed into the seed: the state's draws are not the sampling noise of the same stream key
DRAW_ELEMENTS = 1 << 22  # a keyed draw hashes this many values at a time: its int64 temporaries stay near 100 MB


class Recurrence(nn.Module):
    """Huginn's recurrent state: drawn at random before the first step, joined with the prelude's output e at every step.

    Step t runs the core on `adapter([h; e])` (a Linear(2d, d), the official `transformer.adapter`). The
    state h starts as a normal truncated at +-3 std with std = `LoopConfig.state_std` (default
    sqrt(2 / (5 d))) times `scale`, then times the embedding scale (Huginn-0125: sqrt(d); the retrofitted
    models: 1); scale 0 gives the zero state (the official `init_scale=0`). Two draws of that law:

    - `LoopedLM.forward` (fidelity tests, training, probes) draws as the official `initialize_state` does:
      a standard normal of e's shape overwritten by `trunc_normal_`, from this module's own generator seeded
      by `LoopedLM.seed_state`; with the same seed and call order these are the official code's draws after
      `torch.manual_seed(seed)` (on the CPU).
    - The generation paths (`LoopedLM.step`) draw each token's state from its own stream: channel c of the
      token at position p drawing from stream k (`adapters.engine.streams`: a prompt token its prompt's, which
      the prompt's samples share as they share its K/V; a generated token its sample's) is a hashed uniform
      of (k, the seed, p, c) mapped into (Phi(-3), Phi(3)) and through the inverse normal CDF. A generator
      shared by the batch would hand a sample draws that depend on the rows beside it and their order.
    """

    def __init__(self, cfg: LoopConfig, embed_scale: float) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.adapter = nn.Linear(2 * d, d, bias=False)
        self.std = math.sqrt(2 / (5 * d)) if cfg.state_std is None else cfg.state_std
        self.embed_scale = embed_scale
        self.seed, self.scale = 0, 1.0
        self.generator: torch.Generator | None = None  # made on the first draw, on the state's device

    def reseed(self, seed: int, scale: float) -> None:
        self.seed, self.scale, self.generator = seed, scale, None

    def initial_state(self, e: Tensor, keys: Tensor | None = None) -> Tensor:
        """The state entering step 1 for e [B, n, d]: each token's keyed draw with `keys` [B, n] (`token_keys`),
        else the next draw of the module's generator."""
        std = self.std * self.scale
        if std == 0:
            return torch.zeros_like(e)
        if keys is not None:
            return self.keyed_draw(keys, e, std)
        if self.generator is None or self.generator.device != e.device:
            self.generator = torch.Generator(device=e.device).manual_seed(self.seed)
        x = torch.randn(e.shape, dtype=e.dtype, device=e.device, generator=self.generator)
        nn.init.trunc_normal_(x, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=self.generator)
        return x * self.embed_scale

    def token_keys(self, streams: Tensor | None, positions: Tensor) -> Tensor:
        """[B, n] int64: the key of each token's draw, from its stream key `streams` [B, n], its position [B, n] and
        the seed (the run's, `LoopedLM.seed_state`), hashed as the sampling noise hashes a stream and a counter."""
        if streams is None:
            raise ValueError(
                "a model that draws its initial state needs the stream each token draws from (step's streams)"
            )
        return mix32(mix32(streams ^ mix32((self.seed ^ STATE_STREAM) & M32)) ^ mix32(positions & M32))

    def keyed_draw(self, keys: Tensor, e: Tensor, std: float) -> Tensor:
        """e's shape, token i's channels from `keys` [B, n]: a uniform u in (0, 1) (`streams.uniform`) taken into
        (Phi(-3), Phi(3)), through the inverse normal CDF (clamped at +-3 against float rounding), times std and the
        embedding scale. Hashed a slice of tokens at a time, so a long prompt's prefill holds no [B, n, d] int64."""
        d, flat = e.shape[-1], keys.reshape(-1)
        out = torch.empty(e.shape, dtype=e.dtype, device=e.device).view(-1, d)
        step = max(1, DRAW_ELEMENTS // d)
        for i in range(0, flat.numel(), step):
            u = uniform(flat[i : i + step], d)
            z = torch.special.ndtri(u.mul_(1 - 2 * _TAIL).add_(_TAIL)).clamp_(-TRUNCATION, TRUNCATION)
            out[i : i + step] = z * (std * self.embed_scale)
        return out.view(e.shape)

    def inject(self, h: Tensor, e: Tensor) -> Tensor:
        return F.linear(torch.cat((h, e), dim=-1), self.adapter.weight)
