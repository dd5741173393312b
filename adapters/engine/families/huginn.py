"""Huginn-0125 (recurrent depth) and the retrofitted-recurrence models: prelude, a core of s layers run r times, coda.

The state entering step 1 is random (`adapters.engine.families.recurrence.Recurrence`), every step runs the core
on `adapter([h; e])` (e the prelude's output), and each step of each core layer writes its own K/V entry (the `per_loop` layout: Huginn's official
cache indexes its entries the same way). Huginn-0125's blocks norm each residual sum (`HuginnBlock`), q and k carry
a bias, embeddings are scaled by sqrt(d), and the final norm follows the last step as well as the coda. A
retrofit (`Retrofit`: a Llama cut into prelude, core and coda) keeps the recurrence around the plain pre-norm
Llama blocks it was cut from, unscaled. The checkpoint layout both ship in is `adapters.engine.io.raven`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from adapters.engine.config import LoopConfig
from adapters.engine.families.recurrence import Recurrence
from adapters.engine.families.standard import Family
from adapters.engine.layers import Block, Span

if TYPE_CHECKING:
    from adapters.engine.kv.cache import Cache


class Huginn(Family):
    """Huginn-0125's hooks: `HuginnBlock`s, embeddings times sqrt(d), the random state, the norm after the last step."""

    norm_after_loops = True
    qk_bias = True  # q and k biases in every block

    def block(self, layer: int) -> Block:
        return HuginnBlock(self.cfg)

    @property
    def embed_scale(self) -> float | None:
        return math.sqrt(self.cfg.hidden_size)

    def state(self) -> Recurrence:
        return Recurrence(self.cfg, self.embed_scale or 1.0)

    @property
    def norm_each_loop(self) -> bool:
        return False

    def extra_params(self) -> int:
        cfg, d = self.cfg, self.cfg.hidden_size
        biases = cfg.num_layers * 2 * cfg.num_heads * cfg.head_dim if self.qk_bias else 0
        return super().extra_params() + biases + 2 * d * d  # and the injection adapter, Linear(2d, d)


class Retrofit(Huginn):
    """A retrofitted Llama: Huginn's recurrence around the plain pre-norm blocks it was cut from, nothing scaled."""

    norm_after_loops = False
    qk_bias = False

    def block(self, layer: int) -> Block:
        return Block(self.cfg)

    @property
    def embed_scale(self) -> float | None:
        return None


class HuginnBlock(Block):
    """Huginn's SandwichBlock: each residual sum normed, h = n2(h + attn(n1(h))), then h = n4(h + mlp(n3(h)));
    q and k biased."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__(cfg, qk_bias=True)

    def forward(
        self, h: Tensor, span: Span, cache: Cache, layer: int, loop: int, scales: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        x = self.input_layernorm.forward(h)
        a = self.self_attn.attend(x, None, span, cache, layer, loop)
        h = self.input_layernorm_2.forward(h + a)
        m = self.mlp.forward(self.post_attention_layernorm.forward(h))
        return self.post_attention_layernorm_2.forward(h + m), a

    def init_extra(self, generator: torch.Generator, std: float) -> None:
        bias = self.self_attn.qk_bias
        assert bias is not None  # a Huginn block is built with q/k biases
        bias.zero_()
