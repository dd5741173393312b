"""The parts every family's decoder is built of: norms, RoPE, attention over a cache, the SwiGLU MLP and the block.

A family (`adapters.engine.families`) picks and extends these; the backbone (`adapters.engine.model`) runs them.
q/k/v and gate/up are each one parameter (one matmul); state dicts name HF's separate tensors. Layers, norms and
MLPs are called through `.forward`: a tiny model's decode step is per-call overhead, and `nn.Module.__call__`'s
hook dispatch is a measurable part of it (docs/benchmarks.md, "Figures behind choices in the code"; the engine
registers no hooks on them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.config import LoopConfig

if TYPE_CHECKING:
    from adapters.engine.kv.cache import Cache, InPlaceCache

Rope = tuple[Tensor, Tensor]  # cos, signed sin [B, 1, n, head_dim]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps_tensor = self._eps_on_device()

    def forward(self, x: Tensor) -> Tensor:
        return rms(x, self.eps_tensor, self.weight)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> RMSNorm:
        """Moving the module (`.to`, `.cuda`, `to_empty`) brings `eps_tensor` along."""
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # nn.Module._apply is unannotated
        self.eps_tensor = self._eps_on_device()
        return self

    def _eps_on_device(self) -> Tensor:
        with torch.inference_mode(False):  # an ordinary tensor, which autograd may use later
            return torch.tensor(self.eps, dtype=torch.float32, device=self.weight.device)


def rms(x: Tensor, eps: Tensor, weight: Tensor | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, times `weight` when given; eps a float32 0-dim tensor.

    float32 takes a five-kernel form built on `vector_norm`: on the CPU `torch.rms_norm` is a
    composite of about ten small kernels, and a tiny model runs 13 norms per decoded token, so this
    shows in its decode speed (docs/benchmarks.md; eps as a tensor the module keeps saves one more kernel, or a lookup,
    per norm). It agrees with the textbook form to float rounding (~1e-6), and autograd runs through
    it. Other dtypes compute in float32 and cast back, as transformers' Qwen3RMSNorm does.
    """
    if x.dtype != torch.float32:
        x32 = x.float()
        y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return y if weight is None else weight * y
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # sqrt(sum x^2)
    y = x.div(torch.addcmul(eps, norm, norm, value=1 / x.shape[-1]).sqrt_())
    return y if weight is None else y.mul_(weight)


class Rotary:
    """RoPE tables (rotate-half convention, computed in float32, cast once per dtype), indexed by position.

    The sine table carries rotate-half's sign (-sin on the first half), so applying RoPE is
    `x * cos + roll(x, D/2) * sin`: four ops, exactly transformers' `x * cos + rotate_half(x) * sin`.
    `scaling` is Llama 3's frequency scaling (`LoopConfig.rope_scaling`, `llama3_frequencies`), or None.
    """

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, float] | None = None) -> None:
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.tables: dict[tuple[torch.device, torch.dtype], Rope] = {}  # constants, not buffers: never saved

    def __call__(self, positions: Tensor, dtype: torch.dtype, length: int | None = None) -> Rope:
        """positions [B, n] (all < `length` when given) -> cos, signed sin [B, 1, n, head_dim] in `dtype`."""
        need = int(positions.max()) + 1 if length is None else length
        key = (positions.device, dtype)
        table = self.tables.get(key)
        if table is None or table[0].shape[0] < need:
            size = max(need, 2 * (0 if table is None else table[0].shape[0]), 256)
            device = positions.device
            inv_freq = 1.0 / (
                self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim)
            )
            if self.scaling is not None:
                inv_freq = llama3_frequencies(inv_freq, self.scaling)
            freqs = torch.outer(torch.arange(size, dtype=torch.float32, device=device), inv_freq)
            cos, sin = freqs.cos(), freqs.sin()
            table = self.tables[key] = (torch.cat((cos, cos), -1).to(dtype), torch.cat((-sin, sin), -1).to(dtype))
        index = positions[:, None, :]
        return table[0][index], table[1][index]


def llama3_frequencies(inv_freq: Tensor, scaling: dict[str, float]) -> Tensor:
    """Llama 3's long-context RoPE: frequencies whose wavelength exceeds original / low_freq_factor are divided
    by `factor`, those below original / high_freq_factor kept, and those between blended linearly in
    original / wavelength (Llama 3.1's release; transformers' `rope_type` "llama3")."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    blend = (original / wavelength - low) / (high - low)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(medium, (1 - blend) * scaled / factor + blend * scaled, scaled)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


@dataclass
class Span:
    """Where one call's n tokens sit: their RoPE tables, the first cache slot they fill, and the
    slots each may see (bool [B, 1, n, slot + n], True = attend). `mask` None means causal among
    the n tokens, which callers use only when nothing precedes them (slot 0) or for one token."""

    rope: Rope
    slot: int
    mask: Tensor | None


# ------------------------------------------------------------------------ fused projections
class Fused(nn.Module):
    """A module whose `fused` weight stacks HF's projections (`fuse_projections`): attention's q, k, v; the MLP's
    gate and up."""

    fused: tuple[str, dict[str, int]]  # (the fused projection's name, HF's projection name -> its rows)


def fuse_projections(module: Fused, fused: str, parts: dict[str, int]) -> None:
    """Declare `module.<fused>` the row-wise stack of HF's projections `parts` (name -> rows), in order.

    Decoding a small model costs per-op overhead, not FLOPs: one matmul for q, k and v (and one for
    gate and up) instead of three (two). The parameter IS the stack, so training and optimizers see
    one tensor; state dicts keep HF's names: saving splits it, loading stacks the parts.
    """
    module.fused = (fused, parts)
    # nn.Module's hook registration is unannotated in torch
    module.register_state_dict_post_hook(_split_fused)  # type: ignore[no-untyped-call]
    module.register_load_state_dict_pre_hook(_join_fused)  # type: ignore[no-untyped-call]


def _split_fused(module: Fused, state: dict[str, Tensor], prefix: str, *_: Any) -> None:
    fused, parts = module.fused
    weight = state.pop(f"{prefix}{fused}.weight")
    for name, rows in zip(parts, weight.split(list(parts.values()))):
        state[f"{prefix}{name}.weight"] = rows.clone()  # a copy: safetensors refuses tensors sharing storage


def _join_fused(module: Fused, state: dict[str, Tensor], prefix: str, *_: Any) -> None:
    fused, parts = module.fused
    names = [f"{prefix}{name}.weight" for name in parts]
    if all(name in state for name in names):  # else loading reports the fused weight missing
        state[f"{prefix}{fused}.weight"] = torch.cat([state.pop(name) for name in names])


# ---------------------------------------------------------------------------------- modules
class Attention(Fused):
    """GQA attention over the rows a cache holds; K/V may come from another input than q (MELT's latent h).

    `qk_rope` (set by the engine on a GPU, `adapters.engine.kernels.rope`): q and k's bias, norm and RoPE in one
    kernel, used outside autograd (it has no backward)."""

    qk_rope: Callable[..., tuple[Tensor, Tensor]] | None = None

    def __init__(self, cfg: LoopConfig, qk_bias: bool = False) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.qkv_proj = nn.Linear(d, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.qk_bias = (
            nn.Parameter(torch.zeros(2, 1, cfg.num_heads, hd)) if qk_bias else None
        )  # Huginn's, added before RoPE
        fuse_projections(self, "qkv_proj", {"q_proj": q, "k_proj": kv, "v_proj": kv})

    def attend(self, x: Tensor, src: Tensor | None, span: Span, cache: Cache, layer: int, loop: int) -> Tensor:
        """x [B,n,d] -> [B,n,d]: attend over the rows `cache` holds for (layer, loop) plus this call's, which it keeps.

        A plain method rather than `forward`: a decode step calls it once per layer and loop, and
        `nn.Module.__call__`'s hook handling would cost more than some of its kernels.
        """
        q, k, v = self.project(x, src, span.rope)
        b, _, n, _ = q.shape
        if cache.in_place:  # the cache's kernel reads its blocks where they lie ([B, n, H, D])
            y = cast("InPlaceCache", cache).attend(layer, loop, q, k, v)
        else:
            k, v = cache.update(layer, loop, k, v, span.slot)
            causal = span.mask is None and n > 1
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=span.mask, is_causal=causal, enable_gqa=self.n_heads != self.n_kv
            )
            y = y.transpose(1, 2)
        return F.linear(y.reshape(b, n, self.n_heads * self.head_dim), self.o_proj.weight)

    def project(self, x: Tensor, src: Tensor | None, rope: Rope) -> tuple[Tensor, Tensor, Tensor]:
        """q [B,H,n,D] from x; k, v [..., B,Hkv,n,D] from `src` [..., B,n,d] (default x); q/k norm and RoPE applied."""
        b, n, _ = x.shape
        h, kv, d = self.n_heads, self.n_kv, self.head_dim
        weight, q_norm, k_norm = self.qkv_proj.weight, self.q_norm, self.k_norm
        if src is None:  # one matmul, and q and k normed and rotated together
            qkv = F.linear(x, weight).view(b, n, h + 2 * kv, d)
            qk, v = qkv[:, :, : h + kv], qkv[:, :, h + kv :]
            if self.qk_rope is not None and not torch.is_grad_enabled():
                bias = None if self.qk_bias is None else self.qk_bias.flatten(0, 2)
                q, k = self.qk_rope(
                    qkv,
                    *rope,
                    h,
                    kv,
                    bias=bias,
                    q_weight=None if q_norm is None else q_norm.weight,
                    k_weight=None if k_norm is None else k_norm.weight,
                    eps=0.0 if q_norm is None else q_norm.eps,
                )
                return q, k, v.transpose(1, 2)
            if self.qk_bias is not None:  # [2, 1, H, D] -> [2H, D]: q's heads, then k's
                qk = qk + self.qk_bias.flatten(0, 2)
            if (
                q_norm is not None and k_norm is not None
            ):  # q and k normed per head in one pass, then each scaled by its weight
                qk = rms(qk, q_norm.eps_tensor)
                qk.narrow(2, 0, h).mul_(q_norm.weight)
                qk.narrow(2, h, kv).mul_(k_norm.weight)
            qk = apply_rope(qk.transpose(1, 2), *rope)
            return qk[:, :h], qk[:, h:], v.transpose(1, 2)
        w_q, w_kv = weight.split((h * d, 2 * kv * d))
        q = F.linear(x, w_q).view(b, n, h, d)
        k, v = F.linear(src, w_kv).unflatten(-1, (2 * kv, d)).split(kv, dim=-2)
        if q_norm is not None and k_norm is not None:
            q, k = q_norm(q), k_norm(k)
        return apply_rope(q.transpose(1, 2), *rope), apply_rope(k.transpose(-3, -2), *rope), v.transpose(-3, -2)


class MLP(Fused):
    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)
        fuse_projections(self, "gate_up_proj", {"gate_proj": cfg.ffn_size, "up_proj": cfg.ffn_size})

    def forward(self, x: Tensor) -> Tensor:
        gate, up = F.linear(x, self.gate_up_proj.weight).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj.weight)


class Block(nn.Module):
    """One decoder layer: `pre` (Qwen3, Llama) h + attn(norm(h)); `sandwich` (Ouro) also norms each sublayer's output.

    Families extend it: MELT's shared layers project K/V from a latent (`kv_input`), Huginn's norm each residual sum.
    `init_extra` initialises what a family adds, after the model's generic initialisation. `add_norm` (set by the
    engine on a GPU, `adapters.engine.kernels.norm`): the attention branch's residual add and the norm after it in one
    kernel, used outside autograd (it has no backward).
    """

    add_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]] | None = None

    def __init__(self, cfg: LoopConfig, qk_bias: bool = False) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.norm_eps
        self.self_attn, self.mlp = Attention(cfg, qk_bias), MLP(cfg)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.sandwich = cfg.sandwich
        if self.sandwich:
            self.input_layernorm_2, self.post_attention_layernorm_2 = RMSNorm(d, eps), RMSNorm(d, eps)

    def forward(
        self, h: Tensor, span: Span, cache: Cache, layer: int, loop: int, scales: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(the next state, the attention output). `scales` [2, d] (branch gating) multiply the attention and MLP
        outputs before they join the residual."""
        x = self.input_layernorm.forward(h)
        a = self.self_attn.attend(x, self.kv_input(x, cache, layer, loop), span, cache, layer, loop)
        branch = self.input_layernorm_2.forward(a) if self.sandwich else a
        branch = branch if scales is None else branch * scales[0]
        norm = self.post_attention_layernorm
        if self.add_norm is None or torch.is_grad_enabled():
            h = h + branch
            x = norm.forward(h)
        else:
            h, x = self.add_norm(branch, h, norm.weight, norm.eps)
        m = self.mlp.forward(x)
        branch = self.post_attention_layernorm_2.forward(m) if self.sandwich else m
        return h + (branch if scales is None else branch * scales[1]), a

    def kv_input(self, x: Tensor, cache: Cache, layer: int, loop: int) -> Tensor | None:
        """What K/V are projected from: None, x itself."""
        return None

    def init_extra(self, generator: torch.Generator, std: float) -> None:
        """Initialise the tensors a family adds to the block (`LoopedLM.init_weights`); the plain block has none."""
