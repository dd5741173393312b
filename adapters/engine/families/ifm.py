"""The IFM "Looped Models Done Right, Part II" looped rows (ifm-ai/xllm-loop, `DepthControlledHuginn`): prelude, a
recurrent block of s Llama blocks run r times, coda, decoded with terminal KV.

What the official evaluation computes (`terminal_kv_forward`), and the engine with it:

- Blocks are plain pre-norm Llama blocks (`Block`): h + wo(attn(norm(h))), then h + fc2(silu(fc1(x)) * fc3(x)) on
  the normed h; no q/k norm, no biases, untied head, embeddings unscaled.
- The state entering recurrence 1 is no random draw but a hash of each hidden index, position and a per-example phase
  (`IfmState.initial_state`, the official `identity_recurrent_state`): the engine gives every example identity 0
  and the protocol's seed 42, so a token's state depends on its position alone, in any batch.
- Every recurrence injects the prelude's output e (after an RMSNorm with weight in the Parcae-Decay rows) into the state:
  `diagonal` exp(-dt a) h + dt W e (dt = softplus(dt_bias), a = exp(A_log)), `orthogonal` the same with the decayed
  state's component along dt W e removed, `linear` W [h; e] + b (Huginn-Linear, whose recurrences also end in a
  parameter-free RMSNorm: `IfmBlock` on the recurrent block's last layer).
- Terminal KV: an earlier token keeps only its last recurrence's K/V, one entry per physical layer, and the chunk's
  own tokens attend to one another at each recurrence. That is the engine's `shared-last` layout, the family's
  native one (`--kv-policy per-loop` runs the same weights with an entry per recurrence instead).

The dense D4 rows run as a plain stack (`Standard`); the layout the release ships is read by `adapters.engine.io.xllm`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.config import LoopConfig
from adapters.engine.families.recurrence import Recurrence
from adapters.engine.families.standard import Family
from adapters.engine.layers import Block, RMSNorm, Span, rms

if TYPE_CHECKING:
    from adapters.engine.kv.cache import Cache

STATE_SEED = 42  # the evaluation protocol's seed of the initial state (xllm/paper_part2/eval_protocol.py)
EXAMPLE_ID = 0  # the identity every example gets in the engine (the official evaluation uses each example's index)
PHASE_MODULUS = 16_777_213  # the largest prime below 2**24: the per-example phase is exact in float32
ORTHO_EPS = 1e-6  # added to |dt W e|^2 in the orthogonal injection's projection (`huginn_ortho_projection_eps`)


class Ifm(Family):
    """The Part II looped rows' hooks: Llama blocks, the hashed initial state and its injection (their terminal KV is
    the family's own layout: `adapters.engine.kv.layouts.FAMILY_NATIVE`)."""

    def block(self, layer: int) -> Block:
        cfg = self.cfg
        return IfmBlock(cfg, exit_norm=cfg.ifm_exit_norm and layer == cfg.prelude_layers + cfg.shared_layers - 1)

    def state(self) -> IfmState:
        return IfmState(self.cfg)

    def extra_params(self) -> int:
        d = self.cfg.hidden_size
        injection = {"diagonal": d * d + 2 * d, "orthogonal": d * d + 2 * d, "linear": 2 * d * d + d}
        return injection[self.cfg.ifm_injection] + (d if self.cfg.ifm_prelude_norm else 0)


class IfmBlock(Block):
    """A pre-norm Llama block; on the recurrent block's last layer of Huginn-Linear rows, a parameter-free RMSNorm
    of its output closes every recurrence."""

    def __init__(self, cfg: LoopConfig, exit_norm: bool) -> None:
        super().__init__(cfg)
        self.exit_eps = cfg.norm_eps if exit_norm else None

    def forward(
        self, h: Tensor, span: Span, cache: Cache, layer: int, loop: int, scales: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        h, a = super().forward(h, span, cache, layer, loop, scales)
        if self.exit_eps is None:
            return h, a
        return rms(h, torch.tensor(self.exit_eps, dtype=torch.float32, device=h.device)), a


class IfmState(Recurrence):
    """The Part II recurrence: the hashed initial state and the input injection (module docstring).

    It takes Huginn's place in the backbone (`Backbone.enter`, `Backbone.loop`), so it keeps `Recurrence`'s interface:
    `token_keys` hands each token's position to `initial_state`, the only thing the state depends on besides the
    fixed seed and identity (`reseed` changes nothing: the run's seed does not enter the official state).
    """

    def __init__(self, cfg: LoopConfig) -> None:
        nn.Module.__init__(self)  # none of Huginn's adapter: the injection's own tensors, by the official names
        d = cfg.hidden_size
        self.kind = cfg.ifm_injection
        self.seed, self.scale, self.generator = STATE_SEED, 1.0, None
        self.std = math.sqrt(2.0) * (1.0 / (d**0.5))  # sqrt(2) erfinv(2u - 1) is a standard normal: N(0, 1/d)
        self.prelude_norm = RMSNorm(d, cfg.norm_eps) if cfg.ifm_prelude_norm else None
        if self.kind == "linear":
            self.adapter = nn.Linear(2 * d, d, bias=True)
        else:
            self.input_adapter = nn.Linear(d, d, bias=False)
            self.A_log = nn.Parameter(torch.zeros(d))
            self.dt_bias = nn.Parameter(torch.zeros(d))

    def reseed(self, seed: int, scale: float) -> None:
        """The state is the protocol's (seed 42), whatever the run's seed."""

    def token_keys(self, streams: Tensor | None, positions: Tensor) -> Tensor:
        return positions

    def initial_state(self, e: Tensor, keys: Tensor | None = None) -> Tensor:
        """The official `identity_recurrent_state` of e [B, n, d] at positions `keys` [B, n] (default 0..n-1): each
        entry sqrt(2 / d) erfinv(2 f - 1) with f = fract(43758.5453123 sin(0.013579 c + 0.021713 p + phase + 0.123457)),
        a N(0, 1/d) stand-in for the training state; float32 operation by operation as the official code. The sine alone is taken in float64
        and rounded once: 43758.5 sin(x) keeps one ulp of a float32 sine as a 0.003 move of the fraction, so the 1-ulp
        sines of different kernels (AVX512, AVX2, scalar, CUDA) would each give another state; the correctly rounded
        one is what all of them approximate, and the same on every CPU."""
        b, n, d = e.shape
        positions = torch.arange(n, device=e.device).expand(b, n) if keys is None else keys
        mixed = (EXAMPLE_ID * 104_729 + (STATE_SEED % PHASE_MODULUS) * 130_363) % PHASE_MODULUS
        phase = torch.full((b, 1, 1), float(mixed), dtype=torch.float32, device=e.device)
        phase.mul_(2.0 * math.pi / PHASE_MODULUS)
        state = torch.arange(d, device=e.device, dtype=torch.float32).view(1, 1, -1).expand(b, n, d).clone()
        state.mul_(0.013579)
        state.add_(positions.to(torch.float32).view(b, n, 1) * 0.021713)
        state.add_(phase)
        state.add_(0.123457)
        state.copy_(state.double().sin())  # correctly rounded: the same bits on every CPU (docstring)
        state.mul_(43758.5453123)
        state.sub_(state.floor())
        state.clamp_(1e-6, 1.0 - 1e-6)
        state.mul_(2.0).sub_(1.0)
        state.erfinv_()
        state.mul_(self.std)
        return state.to(dtype=e.dtype)

    def inject(self, h: Tensor, e: Tensor) -> Tensor:
        """The state entering the recurrent block from state h and the prelude's output e (module docstring)."""
        if self.prelude_norm is not None:
            e = self.prelude_norm.forward(e)
        if self.kind == "linear":
            return F.linear(torch.cat((h, e), dim=-1), self.adapter.weight, self.adapter.bias)
        dt = F.softplus(self.dt_bias).to(dtype=h.dtype)
        retained = h * torch.exp(-dt * torch.exp(self.A_log).to(dtype=h.dtype))
        injected = dt * F.linear(e, self.input_adapter.weight)
        if self.kind == "diagonal":
            return retained + injected
        wide = torch.float64 if retained.dtype == torch.float64 else torch.float32
        value, anchor = retained.to(wide), injected.to(wide)
        coefficient = (value * anchor).sum(-1, keepdim=True) / (anchor.square().sum(-1, keepdim=True) + ORTHO_EPS)
        return (value - coefficient * anchor).to(retained.dtype) + injected
