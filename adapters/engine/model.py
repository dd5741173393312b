"""The looped decoder: Qwen3, Ouro (LoopLM), MELT, Huginn and retrofitted Llamas from one `LoopConfig`, gpt-fast style.

Layers run as prelude (p), shared (s) x loops (r), coda (c) in `Backbone.run`, and every attention
call takes its earlier rows from a cache (`adapters.engine.cache`). Two entry points share them:

- `LoopedLM.forward(tokens, ...)`: full-sequence pass (autograd works) used by `forward_logits` and
  by training; its rows live in a `ChunkCache`. Gated (MELT) models run it chunk by chunk, exactly
  like prefill, and may blend the K/V attention sees, `KV = a * KV_melt + (1 - a) * KV_looplm`
  (stage-1 conversion training, a `MixedCache`); it can return per-loop logits, per-(loop, shared
  layer) attention outputs (stage-2 alignment loss) and Ouro's exit probabilities.
- `LoopedLM.step(tokens, positions, cache, slot, mask, loops=r)`: one prefill chunk or decode step
  against a preallocated `adapters.engine.cache.KVCache` or an engine step's `adapters.engine.paged.PagedStep`,
  written in place. The recurrent families draw each token's initial state there from its own
  random stream (`streams`, `Recurrence`), not from a generator shared by the batch.

q/k/v and gate/up are each one parameter (one matmul); state dicts name HF's separate tensors. Layers,
norms and MLPs are called through `.forward`: a tiny model's decode step is per-call overhead, and
`nn.Module.__call__`'s hook dispatch cost about 3% of it (the engine registers no hooks on them).

MELT choices the method leaves open (also in docs/reference.md, Engine):
- The latent state h of a shared layer starts as the first loop's normalised input x (loop 1 gives
  h = x, so its K/V equal the LoopLM's) and is carried across loops for the tokens in flight;
  the gate runs from loop 2 on. A converted model therefore starts close to its LoopLM.
- Attention inside a chunk sees the chunk's own rows as of the current loop; earlier chunks are seen
  through their final rows. With chunk size 1 this is token-by-token decoding.
- Fresh elementwise gates start with small weights and bias -2 (z ~ 0.12): h stays close to x.
"""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.cache import Cache, ChunkCache, MixedCache
from adapters.engine.config import LOOP_GATE_DIM, LoopConfig
from adapters.engine.exits import ExitPolicy, ExitRows, exit_rows
from adapters.engine.streams import M32, mix32, uniform

Rope = tuple[Tensor, Tensor]  # cos, signed sin [B, 1, n, head_dim]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps_tensor = self._eps_on_device()

    def forward(self, x: Tensor) -> Tensor:
        return rms(x, self.eps_tensor, self.weight)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 (nn.Module's signature)
        """Moving the module (`.to`, `.cuda`, `to_empty`) brings `eps_tensor` along."""
        super()._apply(fn, recurse)
        self.eps_tensor = self._eps_on_device()
        return self

    def _eps_on_device(self) -> Tensor:
        with torch.inference_mode(False):  # an ordinary tensor, which autograd may use later
            return torch.tensor(self.eps, dtype=torch.float32, device=self.weight.device)


def rms(x: Tensor, eps: Tensor, weight: Tensor | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, times `weight` when given; eps a float32 0-dim tensor.

    float32 takes a five-kernel form built on `vector_norm`: on the CPU `torch.rms_norm` is a
    composite of about ten small kernels, and a tiny model runs 13 norms per decoded token, so this
    is ~5% of its decode speed (eps as a tensor the module keeps saves one more kernel, or a lookup,
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
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim))
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
def fuse_projections(module: nn.Module, fused: str, parts: dict[str, int]) -> None:
    """Declare `module.<fused>` the row-wise stack of HF's projections `parts` (name -> rows), in order.

    Decoding a small model costs per-op overhead, not FLOPs: one matmul for q, k and v (and one for
    gate and up) instead of three (two). The parameter IS the stack, so training and optimizers see
    one tensor; state dicts keep HF's names: saving splits it, loading stacks the parts.
    """
    module.fused = (fused, parts)
    module.register_state_dict_post_hook(_split_fused)
    module.register_load_state_dict_pre_hook(_join_fused)


def _split_fused(module: nn.Module, state: dict[str, Tensor], prefix: str, *_: Any) -> None:
    fused, parts = module.fused
    weight = state.pop(f"{prefix}{fused}.weight")
    for name, rows in zip(parts, weight.split(list(parts.values()))):
        state[f"{prefix}{name}.weight"] = rows.clone()  # a copy: safetensors refuses tensors sharing storage


def _join_fused(module: nn.Module, state: dict[str, Tensor], prefix: str, *_: Any) -> None:
    fused, parts = module.fused
    names = [f"{prefix}{name}.weight" for name in parts]
    if all(name in state for name in names):  # else loading reports the fused weight missing
        state[f"{prefix}{fused}.weight"] = torch.cat([state.pop(name) for name in names])


# ---------------------------------------------------------------------------------- modules
class Attention(nn.Module):
    """GQA attention over the rows a cache holds; K/V may come from another input than q (MELT's latent h)."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.qkv_proj = nn.Linear(d, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.qk_bias = nn.Parameter(torch.zeros(2, 1, cfg.num_heads, hd)) if cfg.huginn else None  # Huginn's q and k biases, added before RoPE
        fuse_projections(self, "qkv_proj", {"q_proj": q, "k_proj": kv, "v_proj": kv})

    def attend(self, x: Tensor, src: Tensor | None, span: Span, cache: Cache, layer: int, loop: int) -> Tensor:
        """x [B,n,d] -> [B,n,d]: attend over the rows `cache` holds for (layer, loop) plus this call's, which it keeps.

        A plain method rather than `forward`: a decode step calls it once per layer and loop, and
        `nn.Module.__call__`'s hook handling would cost more than some of its kernels.
        """
        q, k, v = self.project(x, src, span.rope)
        k, v = cache.update(layer, loop, k, v, span.slot)
        b, _, n, _ = q.shape
        causal = span.mask is None and n > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=span.mask, is_causal=causal, enable_gqa=self.n_heads != self.n_kv)
        return F.linear(y.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim), self.o_proj.weight)

    def project(self, x: Tensor, src: Tensor | None, rope: Rope) -> tuple[Tensor, Tensor, Tensor]:
        """q [B,H,n,D] from x; k, v [..., B,Hkv,n,D] from `src` [..., B,n,d] (default x); q/k norm and RoPE applied."""
        b, n, _ = x.shape
        h, kv, d = self.n_heads, self.n_kv, self.head_dim
        weight, q_norm, k_norm = self.qkv_proj.weight, self.q_norm, self.k_norm
        if src is None:  # one matmul, and q and k normed and rotated together
            qkv = F.linear(x, weight).view(b, n, h + 2 * kv, d)
            qk, v = qkv[:, :, : h + kv], qkv[:, :, h + kv :]
            if self.qk_bias is not None:  # [2, 1, H, D] -> [2H, D]: q's heads, then k's
                qk = qk + self.qk_bias.flatten(0, 2)
            if q_norm is not None:  # q and k normed per head in one pass, then each scaled by its weight
                qk = rms(qk, q_norm.eps_tensor)
                qk.narrow(2, 0, h).mul_(q_norm.weight)
                qk.narrow(2, h, kv).mul_(k_norm.weight)
            qk = apply_rope(qk.transpose(1, 2), *rope)
            return qk[:, :h], qk[:, h:], v.transpose(1, 2)
        w_q, w_kv = weight.split((h * d, 2 * kv * d))
        q = F.linear(x, w_q).view(b, n, h, d)
        k, v = F.linear(src, w_kv).unflatten(-1, (2 * kv, d)).split(kv, dim=-2)
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        return apply_rope(q.transpose(1, 2), *rope), apply_rope(k.transpose(-3, -2), *rope), v.transpose(-3, -2)


class MLP(nn.Module):
    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)
        fuse_projections(self, "gate_up_proj", {"gate_proj": cfg.ffn_size, "up_proj": cfg.ffn_size})

    def forward(self, x: Tensor) -> Tensor:
        gate, up = F.linear(x, self.gate_up_proj.weight).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj.weight)


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


class Block(nn.Module):
    """One decoder layer. `pre`: h + attn(norm(h)); `sandwich` (Ouro) also norms each sublayer's output;
    Huginn's SandwichBlock norms each residual sum instead: h = n2(h + attn(n1(h))), h = n4(h + mlp(n3(h)))."""

    def __init__(self, cfg: LoopConfig, gated: bool) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.norm_eps
        self.self_attn, self.mlp = Attention(cfg), MLP(cfg)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.sandwich, self.huginn = cfg.sandwich, cfg.huginn
        if self.sandwich:
            self.input_layernorm_2, self.post_attention_layernorm_2 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.melt_gate = MeltGate(cfg) if gated else None

    def forward(self, h: Tensor, span: Span, cache: Cache, layer: int, loop: int, scales: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(the next state, the attention output). A gated layer's K/V come from the source the cache keeps;
        `scales` [2, d] (branch gating) multiply the attention and MLP outputs before they join the residual."""
        x = self.input_layernorm.forward(h)
        src = None if self.melt_gate is None else cache.kv_source(layer, loop, x, self.melt_gate)
        a = self.self_attn.attend(x, src, span, cache, layer, loop)
        if self.huginn:
            h = self.input_layernorm_2.forward(h + a)
            return self.post_attention_layernorm_2.forward(h + self.mlp.forward(self.post_attention_layernorm.forward(h))), a
        branch = self.input_layernorm_2.forward(a) if self.sandwich else a
        h = h + (branch if scales is None else branch * scales[0])
        m = self.mlp.forward(self.post_attention_layernorm.forward(h))
        branch = self.post_attention_layernorm_2.forward(m) if self.sandwich else m
        return h + (branch if scales is None else branch * scales[1]), a


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
        self.branch = nn.Parameter(torch.zeros(cfg.loops, cfg.shared_layers, 2, LOOP_GATE_DIM)) if cfg.branch_gate else None

    def loop_input(self, h: Tensor, e: Tensor, diffs: Sequence[Tensor]) -> Tensor:
        """x_l from h_{l-1}, e and the newest-first differences h_{l-1} - h_{l-2}, ... (at most w)."""
        x = h if self.injection is None else h + self.injection(0, e)
        for j, diff in enumerate(diffs if self.history is not None else ()):
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
        return 1 + torch.tanh(self.branch[min(loop, self.branch.shape[0] - 1), layer]).repeat_interleave(d // LOOP_GATE_DIM, dim=-1)


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

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.adapter = nn.Linear(2 * d, d, bias=False)
        self.std = math.sqrt(2 / (5 * d)) if cfg.state_std is None else cfg.state_std
        self.embed_scale = math.sqrt(d) if cfg.huginn else 1.0
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
            raise ValueError("a model that draws its initial state needs the stream each token draws from (step's streams)")
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


class Backbone(nn.Module):
    """The layers and the order they run in (`run`); its tensors sit under HF's `model.` prefix so checkpoints map one to one."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        p, s = cfg.prelude_layers, cfg.shared_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        gated = cfg.gated
        self.layers = nn.ModuleList(Block(cfg, gated and p <= i < p + s) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.early_exit_gate = nn.Linear(cfg.hidden_size, 1) if cfg.exit_gate else None
        self.loop_conditioning = LoopConditioning(cfg) if cfg.conditioned else None
        self.recurrence = Recurrence(cfg) if cfg.recurrent else None
        self.embed_scale = math.sqrt(cfg.hidden_size) if cfg.huginn else None  # Huginn scales its embeddings by sqrt(d)
        self.prelude, self.shared, self.coda = list(self.layers[:p]), list(self.layers[p : p + s]), list(self.layers[p + s :])
        self.sandwich = cfg.sandwich and not cfg.huginn  # Ouro's norm after every loop; Huginn norms after the last one
        self.norm_after_loops = cfg.huginn

    def embed(self, tokens: Tensor) -> Tensor:
        h = self.embed_tokens(tokens)
        return h if self.embed_scale is None else h * self.embed_scale

    def run(self, h: Tensor, span: Span, cache: Cache, loops: int, per_loop: bool, attn_outputs: list[Tensor] | None = None,
            trace: LoopTrace | None = None, grad_loops: int | None = None, state_keys: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """Prelude, shared x loops, coda over one call's states h [B, n, d].

        Returns the normed final state and, with `per_loop`, each loop's normed state (what per-loop
        logits and the exit gate read). Shared layers' attention outputs are appended to
        `attn_outputs`, loop-major, when it is given. A `trace` (probes) records the state entering
        loop 1 and each loop's output, and may skip loops: a skipped loop hands its input on unchanged.
        With `grad_loops` = k only the last k loops are differentiated (truncated backprop, as Huginn
        trains): the loops before them run without autograd, their output a constant to the rest.
        `state_keys` [B, n]: each token's key for the recurrent families' initial state (`Recurrence.initial_state`).
        """
        cond, s = self.loop_conditioning, len(self.shared)
        h, e, diffs = self._enter(h, span, cache, state_keys)
        if trace is not None:
            trace.begin(h)
        states = []
        no_grad_loops = 0 if grad_loops is None else max(0, loops - grad_loops)
        for t in range(loops if s else 0):
            if trace is not None and t in trace.skip:
                y, normed = h, self.norm.forward(h) if per_loop else None
            elif t < no_grad_loops:  # training's truncated backprop only; inference never enters a context per loop
                with torch.no_grad():
                    y, normed = self._loop(h, e, diffs, span, cache, t, per_loop, attn_outputs)
            else:
                y, normed = self._loop(h, e, diffs, span, cache, t, per_loop, attn_outputs)
            if cond is not None and t > 0:  # the history excludes e: the first difference is h_2 - h_1
                diffs.appendleft(y - h)
            h = y
            if trace is not None:
                trace.record(h)
            if per_loop:
                states.append(normed)
        return self.tail(h, span, cache), states

    def tail(self, h: Tensor, span: Span, cache: Cache) -> Tensor:
        """What follows the loops: Huginn's norm, the coda layers, the final norm."""
        if self.norm_after_loops:
            h = self.norm.forward(h)
        first = len(self.prelude) + len(self.shared)
        for k, layer in enumerate(self.coda):
            h, _ = layer.forward(h, span, cache, first + k, 0)
        return self._final(h)

    def run_exits(self, h: Tensor, span: Span, cache: Cache, loops: int, rows: ExitRows, head: Callable[[Tensor], Tensor],
                  state_keys: Tensor | None = None) -> Tensor:
        """A decode step whose rows stop looping where their exit policy says (`adapters.engine.exits`): prelude,
        the loops while any row goes on (`rows` says which rows each loop runs on and on what span and cache),
        then the tail once on every row's state at its exit. `head` maps normed states to logits (kl, entropy);
        `state_keys` as for `run`."""
        cond = self.loop_conditioning
        h, e, diffs = self._enter(h, span, cache, state_keys)

        def logits(y: Tensor, sp: Span, c: Cache) -> Tensor:
            return head(self.tail(y, sp, c))

        for t in range(loops):
            y, normed = self._loop(h, e, diffs, rows.loop_span(t), rows.cache, t, True, None)
            diff = [y - h] if cond is not None and t > 0 else []  # the history excludes e: the first difference is h_2 - h_1
            h, carried = rows.after_loop(t, h, y, normed, [e, *diff, *diffs], logits)
            if rows.done:
                break
            e, diffs = carried[0], collections.deque(carried[1 : 1 + diffs.maxlen], maxlen=diffs.maxlen)  # the newest differences
        return self.tail(rows.final, span, cache)

    def _enter(self, h: Tensor, span: Span, cache: Cache, state_keys: Tensor | None) -> tuple[Tensor, Tensor, collections.deque]:
        """The prelude, then what the first loop reads: (its state h, the prelude's output e, the empty history of
        differences h_(l-1) - h_(l-2), newest first). The recurrent families start h from their random state."""
        for i, layer in enumerate(self.prelude):
            h, _ = layer.forward(h, span, cache, i, 0)
        cond = self.loop_conditioning
        diffs: collections.deque = collections.deque(maxlen=cond.window if cond is not None else 1)
        e = h
        if self.recurrence is not None:
            h = self.recurrence.initial_state(e, state_keys)
        return h, e, diffs

    def _loop(self, h: Tensor, e: Tensor, diffs: Sequence[Tensor], span: Span, cache: Cache, t: int, per_loop: bool,
              attn_outputs: list[Tensor] | None) -> tuple[Tensor, Tensor | None]:
        """Loop t (0-based) of the shared layers from state h: (the state it hands on, its normed state when asked)."""
        cond, p = self.loop_conditioning, len(self.prelude)
        x = h if cond is None else cond.loop_input(h, e, diffs)
        if self.recurrence is not None:
            x = self.recurrence.inject(h, e)
        y = x
        for j, layer in enumerate(self.shared):
            y, a = layer.forward(y, span, cache, p + j, t, None if cond is None else cond.branch_scales(t, j, y.shape[-1]))
            if attn_outputs is not None:
                attn_outputs.append(a)
        return self._loop_end(y if cond is None else cond.gated(x, y, t), per_loop)

    def _loop_end(self, h: Tensor, normed: bool) -> tuple[Tensor, Tensor | None]:
        """(state fed to the next loop, the loop's normed state when asked): sandwich models norm after every loop."""
        if self.sandwich:
            h = self.norm.forward(h)
            return h, h
        return h, self.norm.forward(h) if normed else None

    def _final(self, h: Tensor) -> Tensor:
        """Normed state after the coda; sandwich models are already normed unless coda layers ran after the last loop."""
        if self.sandwich and self.shared and not self.coda:
            return h
        return self.norm.forward(h)


@dataclass
class ForwardOutput:
    """What the full-sequence forward returns. Lists are indexed by loop t (0-based)."""

    logits: Tensor  # [B, N, V] from the final state
    loop_logits: list[Tensor] | None = None  # r x [B, N, V]: each loop's normed state through lm_head
    attn_outputs: list[list[Tensor]] | None = None  # [t][j] -> [B, N, d]: shared layer j's o_proj output at loop t
    exit_probs: Tensor | None = None  # [r, B, N]: Ouro exit distribution over loops


@dataclass
class LoopTrace:
    """What `Backbone.run` records for the probes: `states[0]` enters loop 1 (e), `states[l]` is loop l's
    output, each [B, n, d] as the next loop reads it; loops in `skip` (0-based) hand their input on.
    Chunked (gated) forwards record one list per chunk; `joined` puts them back along the sequence."""

    skip: frozenset[int] = frozenset()
    on_loop: Callable[[], None] | None = None  # called after each loop that ran, not skipped (a progress bar)
    chunks: list[list[Tensor]] = field(default_factory=list)

    def begin(self, e: Tensor) -> None:
        """A new call (chunk) starts with e, the state entering loop 1."""
        self.chunks.append([e.detach()])

    def record(self, h: Tensor) -> None:
        loop = len(self.chunks[-1]) - 1  # 0-based: the chunk starts with the state entering loop 1
        self.chunks[-1].append(h.detach())
        if self.on_loop is not None and loop not in self.skip:
            self.on_loop()

    def joined(self) -> list[Tensor]:
        return [torch.cat(parts, dim=1) for parts in zip(*self.chunks)]


@dataclass
class StepOutput:
    """What a cached step returns, for the last position of each row only (what sampling needs)."""

    states: list[Tensor]  # normed final states [B, d]; one per loop when keep_loops, else one
    loops_run: Tensor | None = None  # [B]: the loops each row ran, under a policy that skips loops


def exit_probabilities(gate_logits: Tensor) -> Tensor:
    """[r, ...] gate logits -> [r, ...] exit probabilities: p_t = l_t * prod_{j<t}(1 - l_j), the last loop takes the rest."""
    lam = torch.sigmoid(gate_logits.float())
    survive = torch.cumprod(1 - lam, dim=0)
    before = torch.cat((torch.ones_like(survive[:1]), survive[:-1]), dim=0)
    probs = lam * before
    probs[-1] = before[-1]
    return probs


class LoopedLM(nn.Module):
    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.prelude, self.shared, self.coda = self.model.prelude, self.model.shared, self.model.coda  # the layer groups, by name

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded random init: normal(0, std) matrices and embeddings, unit norms, zero biases."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, Attention) and module.qk_bias is not None:
                module.qk_bias.zero_()
        for layer in self.shared:
            if layer.melt_gate is not None:
                fresh_gate(layer.melt_gate, generator, std)
        if self.model.loop_conditioning is not None:
            for param in self.model.loop_conditioning.parameters():
                param.zero_()  # the identity: conditioning starts as the plain looped model

    def seed_state(self, seed: int, scale: float = 1.0) -> None:
        """Seed the recurrent families' initial-state draws (`Recurrence`) and scale their std (0: the zero state); other families have none."""
        if self.model.recurrence is not None:
            self.model.recurrence.reseed(seed, scale)

    @property
    def draws_state(self) -> bool:
        """Whether calls draw a random initial state (huginn, retrofit at a scale > 0): `step` needs `streams`, the adapter no graph."""
        rec = self.model.recurrence
        return rec is not None and rec.scale > 0

    def logits(self, normed: Tensor) -> Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(normed, weight)

    def exit_gate_logits(self, states: list[Tensor]) -> Tensor | None:
        """[r, ...] Ouro exit-gate logits of each loop's normed state (None without an exit gate)."""
        gate = self.model.early_exit_gate
        return None if gate is None else torch.stack([gate(z).squeeze(-1) for z in states])

    # ------------------------------------------------------------------- full-sequence forward
    def forward(
        self,
        tokens: Tensor,
        *,
        loops: int | None = None,
        chunk_size: int | Sequence[int] | None = None,
        kv_mix: float | None = None,
        return_loop_logits: bool = False,
        return_attn_outputs: bool = False,
        trace: LoopTrace | None = None,
        grad_loops: int | None = None,
    ) -> ForwardOutput:
        """Full-sequence forward (autograd works). tokens [B, N], no padding.

        Gated models run chunk-wise: `chunk_size` (default the config's) is cut as generation's prefill
        cuts a prompt (`prefill_chunks`: counted back from the last token, so the last position's
        logits are the first generated token's), or is a list of chunk lengths summing to N (e.g. a
        prompt's chunks followed by 1s for decoded tokens). They blend attention's K/V as
        `kv_mix * KV_melt + (1 - kv_mix) * KV_looplm` (default 1: pure MELT; 0 reproduces the LoopLM
        with the same weights exactly). Other strategies ignore both arguments. `trace` records (and
        may skip) loops for the probes (`LoopTrace`). `grad_loops` = k differentiates only the last k loops
        (Huginn's truncated backprop; `Backbone.run`).
        """
        r = self.config.check_loops(loops if loops is not None else self.config.loops)
        b, n = tokens.shape
        cache = forward_cache(self.config, r, kv_mix)
        per_loop = bool(self.shared) and (return_loop_logits or self.model.early_exit_gate is not None)
        finals, states, attn = [], [], []
        for s0, s1 in forward_chunks(self.config, n, chunk_size):
            h = self.model.embed(tokens[:, s0:s1])
            positions = torch.arange(s0, s1, device=tokens.device).expand(b, -1)
            span = Span(self.rotary(positions, h.dtype), s0, None if s0 == 0 else causal_mask(s0, s1, tokens.device))
            attn.append([] if return_attn_outputs else None)
            final, loop_states = self.model.run(h, span, cache, r, per_loop, attn[-1], trace, grad_loops)
            finals.append(final)
            states.append(loop_states)
        return self._forward_output(finals, states, attn if return_attn_outputs else None, return_loop_logits)

    def _forward_output(self, finals: list[Tensor], states: list[list[Tensor]], attn: list[list[Tensor]] | None, loop_logits: bool) -> ForwardOutput:
        """The chunks' results joined along the sequence."""

        def join(parts: Sequence[Tensor]) -> Tensor:
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

        out = ForwardOutput(logits=self.logits(join(finals)))
        per_loop = [join(chunks) for chunks in zip(*states)]  # r x [B, N, d]
        if per_loop:
            out.loop_logits = [self.logits(z) for z in per_loop] if loop_logits else None
            gate_logits = self.exit_gate_logits(per_loop)
            out.exit_probs = None if gate_logits is None else exit_probabilities(gate_logits)
        if attn is not None:
            s, outputs = len(self.shared), [join(chunks) for chunks in zip(*attn)]
            out.attn_outputs = [outputs[i : i + s] for i in range(0, len(outputs), s)]
        return out

    # ------------------------------------------------------------------------------ cached step
    def step(self, tokens: Tensor, positions: Tensor, cache: Cache, slot: int, mask: Tensor | None, *, loops: int,
             keep_loops: bool = False, exits: ExitPolicy | None = None, active_set: bool = True, ran: Tensor | None = None, streams: Tensor | None = None) -> StepOutput:
        """Run tokens [B, n] at cache slots slot..slot+n-1 (positions [B, n]), writing K/V in place.

        `mask` [B,1,n,L] bool (L: the keys attended, slot + n for a `KVCache`), or None for plain causal attention over
        slot + n keys. For gated caches n must not exceed the cache's latent chunk. Returns the last position's normed
        state(s). A decode step (n = 1) under an `exits` policy that skips loops stops each row at its exit: on an active
        set (`active_set`, the cache a step that can `narrow`) or as the masked full step (`adapters.engine.exits`); `ran`
        [B, L]: the loops each key ran. `streams` [B, n]: the stream each token draws its initial state from (`Recurrence`).
        """
        state_keys = self.model.recurrence.token_keys(streams, positions) if self.draws_state else None
        h = self.model.embed(tokens)
        keys = slot + tokens.shape[1] if mask is None else mask.shape[-1]
        span = Span(self.rotary(positions, h.dtype, length=keys), slot, mask)  # a position never reaches the keys' count
        if exits is not None and exits.skips and tokens.shape[1] == 1 and self.shared:
            rows = exit_rows(exits, loops, self.model.early_exit_gate, span, cache, h, active_set, ran)
            final = self.model.run_exits(h, span, cache, loops, rows, self.logits, state_keys)
            return StepOutput(states=[final[:, -1]], loops_run=rows.loops_run)
        final, states = self.model.run(h, span, cache, loops, keep_loops and bool(self.shared), state_keys=state_keys)
        return StepOutput(states=[z[:, -1] for z in states] if states else [final[:, -1]])

    # ------------------------------------------------------------------------------ conversion
    def with_conditioning(self, **fields: Any) -> "LoopedLM":
        """This model with loop conditioning options changed (`LoopConfig` fields injection, history,
        history_window, loop_gate): new conditioning tensors start at zero, so the logits are unchanged."""
        cfg = self.config.replace(**fields)
        weight = self.model.embed_tokens.weight
        model = LoopedLM(cfg).to(device=weight.device, dtype=weight.dtype)  # conditioning tensors are built as zeros
        own = model.state_dict()
        model.load_state_dict({k: v for k, v in self.state_dict().items() if k in own and own[k].shape == v.shape}, strict=False)
        return model.train(self.training)

    def to_melt(self, gate_variant: str = "elementwise", chunk_size: int | None = None, generator: torch.Generator | None = None) -> "LoopedLM":
        """A gated MELT model with this LoopLM's weights and fresh gates (the starting point of conversion training)."""
        cfg = self.config.replace(
            family="melt", kv_strategy="gated", gate_variant=gate_variant, chunk_size=chunk_size or self.config.chunk_size
        )
        weight = self.model.embed_tokens.weight
        melt = LoopedLM(cfg).to(device=weight.device, dtype=weight.dtype)
        melt.load_state_dict(self.state_dict(), strict=False)
        gen = generator or torch.Generator(device=weight.device).manual_seed(0)
        with torch.no_grad():
            for layer in melt.shared:
                fresh_gate(layer.melt_gate, gen)
        return melt


def fresh_gate(gate: MeltGate, generator: torch.Generator, std: float = 0.02) -> None:
    """Initialise a gate so that h starts close to x (z ~ 0.12): a converted model starts near its LoopLM."""
    if gate.variant == "elementwise":
        gate.w_z.weight.normal_(0.0, std, generator=generator)
        gate.u_z.weight.normal_(0.0, std, generator=generator)
        gate.w_z.bias.fill_(-2.0)
    elif gate.variant == "scalar":
        gate.logit.fill_(-2.0)


def forward_chunks(config: LoopConfig, n: int, chunk_size: int | Sequence[int] | None) -> list[tuple[int, int]]:
    """(start, end) of each chunk a forward over n tokens runs: one unless the model is gated (`LoopedLM.forward`)."""
    if not config.gated:
        return [(0, n)]
    chunk = chunk_size or config.chunk_size
    if isinstance(chunk, int):
        return prefill_chunks(n, chunk)
    ends = list(itertools.accumulate(chunk))
    if ends[-1] != n or min(chunk) < 1:
        raise ValueError(f"chunk lengths {list(chunk)} must be positive and sum to the sequence length {n}")
    return list(zip([0] + ends[:-1], ends))


def forward_cache(config: LoopConfig, loops: int, kv_mix: float | None) -> ChunkCache | MixedCache:
    """A forward's rows: the model's own, or a gated model's read as its LoopLM (kv_mix 0) or as both blended."""
    a = 1.0 if kv_mix is None else float(kv_mix)
    if not config.gated or a == 1:
        return ChunkCache(config, loops)
    looplm = ChunkCache(config, loops, "per_loop")
    return looplm if a == 0 else MixedCache(a, ChunkCache(config, loops), looplm)


def prefill_chunks(length: int, chunk: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk of a `length`-token prompt, counted back from its last token: only the
    first chunk may be shorter (10 tokens, chunk 4: 2 + 4 + 4). Generation's prefill and `LoopedLM.forward`
    both use it, so a forward's last position gives the logits the first token is sampled from, and left
    padding never moves a row's chunks."""
    return [(max(0, end - chunk), end) for end in range(length, 0, -chunk)][::-1]


def causal_mask(s0: int, s1: int, device: torch.device) -> Tensor:
    """Bool [1,1,n,s1]: query at slot s0+i sees keys 0..s0+i."""
    q = torch.arange(s0, s1, device=device)[:, None]
    return (torch.arange(s1, device=device)[None, :] <= q)[None, None]
