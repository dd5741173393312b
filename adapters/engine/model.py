"""The looped decoder: Qwen3, Ouro (LoopLM) and MELT from one `LoopConfig`, gpt-fast style.

Layers run as prelude (p), shared (s) x loops (r), coda (c). Two entry points share the blocks:

- `LoopedLM.forward(tokens, ...)`: cache-free, autograd-friendly full-sequence pass used by
  `forward_logits` and by training. Gated (MELT) models run it chunk by chunk, exactly like prefill,
  and may blend the K/V attention sees, `KV = a * KV_melt + (1 - a) * KV_looplm` (stage-1
  conversion training); it can return per-loop logits, per-(loop, shared layer) attention outputs
  (stage-2 alignment loss) and Ouro's exit probabilities.
- `LoopedLM.step(tokens, positions, cache, slot, mask, loops)`: one prefill chunk or decode step
  against a preallocated `adapters.engine.cache.KVCache`, written in place.

MELT choices the method leaves open (also in the README):
- The latent state h of a shared layer starts as the first loop's normalised input x (loop 1 gives
  h = x, so its K/V equal the LoopLM's) and is carried across loops for the tokens in flight;
  the gate runs from loop 2 on. A converted model therefore starts close to its LoopLM.
- Attention inside a chunk sees the chunk's own rows as of the current loop; earlier chunks are seen
  through their final rows. With chunk size 1 this is token-by-token decoding.
- Fresh elementwise gates start with small weights and bias -2 (z ~ 0.12): h stays close to x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.config import LoopConfig

if TYPE_CHECKING:
    from adapters.engine.cache import KVCache

Mix = Callable[[Tensor], Tensor]  # normalised block input x -> attention output (after o_proj)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, as transformers' Qwen3RMSNorm does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms(x, self.eps, self.weight, self.__dict__.get("_eps"))


def rms(x: Tensor, eps: float, weight: Tensor | None = None, eps_tensor: Tensor | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, times `weight`; float32 inside, cast back.

    Decoding in float32 with `eps_tensor` (eps as a 0-dim tensor, which `LoopedLM.prepare_inference`
    makes) takes a five-kernel form built on `vector_norm`: on the CPU `torch.rms_norm` is a
    composite of about ten small kernels, and a tiny model runs 13 norms per decoded token, so this
    is ~5% of its decode speed. It agrees with the textbook form to float rounding (~1e-6).
    Training and other dtypes use the textbook form (transformers' order).
    """
    if x.dtype == torch.float32:
        if eps_tensor is None or torch.is_grad_enabled():
            return F.rms_norm(x, x.shape[-1:], weight, eps)
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # sqrt(sum x^2)
        y = x.div(torch.addcmul(eps_tensor, norm, norm, value=1 / x.shape[-1]).sqrt_())
        return y if weight is None else y.mul_(weight)
    x32 = x.float()
    y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else weight * y


class Rotary:
    """RoPE tables (rotate-half convention, computed in float32, cast once per dtype), indexed by position.

    The sine table carries rotate-half's sign (-sin on the first half), so applying RoPE is
    `x * cos + roll(x, D/2) * sin`: four ops, exactly transformers' `x * cos + rotate_half(x) * sin`.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, theta
        self.tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}  # not buffers: never saved

    def __call__(self, positions: Tensor, dtype: torch.dtype, length: int | None = None) -> tuple[Tensor, Tensor]:
        """positions [B, n] (all < `length` when given) -> cos, signed sin [B, 1, n, head_dim] in `dtype`."""
        need = int(positions.max()) + 1 if length is None else length
        key = (positions.device, dtype)
        table = self.tables.get(key)
        if table is None or table[0].shape[0] < need:
            size = max(need, 2 * (0 if table is None else table[0].shape[0]), 256)
            device = positions.device
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim))
            freqs = torch.outer(torch.arange(size, dtype=torch.float32, device=device), inv_freq)
            cos, sin = freqs.cos(), freqs.sin()
            table = self.tables[key] = (torch.cat((cos, cos), -1).to(dtype), torch.cat((-sin, sin), -1).to(dtype))
        index = positions[:, None, :]
        return table[0][index], table[1][index]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def packed(module: "Attention | MLP", key: str) -> Tensor:
    """The row-wise concatenation of `module.packed_params()[key]`, whose row blocks ARE the parameters.

    Decoding a small model costs per-op overhead, not FLOPs: one matmul for q, k and v (and one for
    gate and up) instead of three (two). With autograd off, the parameters are moved into one buffer
    and made views of it, so there is no second copy of the weights and in-place updates (optimizer
    steps, `load_state_dict`) keep it current. The buffer is kept in `module.__dict__[key]`; the
    per-token path only looks it up, and `LoopedLM.prepare_inference` (once per generate call)
    drops it if the parameters were replaced since. With autograd on it returns `torch.cat(params)`,
    so gradients reach the separate parameters (which keep HF's names).
    """
    if torch.is_grad_enabled():
        return torch.cat(module.packed_params()[key])
    buf = module.__dict__.get(key)
    if buf is not None:
        return buf
    params = module.packed_params()[key]
    with torch.inference_mode(False), torch.no_grad():  # parameters must stay ordinary (trainable) tensors
        buf = torch.cat([p.detach() for p in params])
        offset = 0
        for p in params:
            p.data = buf[offset : offset + p.shape[0]]
            offset += p.shape[0]
    module.__dict__[key] = buf
    return buf


def still_packed(buf: Tensor, params: tuple[Tensor, ...]) -> bool:
    """Whether `params` are still the consecutive row blocks of `buf` (False once one was replaced)."""
    ptr = buf.data_ptr()
    for p in params:
        if p.data_ptr() != ptr or p.dtype != buf.dtype:
            return False
        ptr += p.numel() * p.element_size()
    return True


class Attention(nn.Module):
    """GQA attention; K/V may be projected from another input than q, because MELT takes them from h."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.eps = cfg.num_heads, cfg.num_kv_heads, hd, cfg.norm_eps
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def packed_params(self) -> dict[str, tuple[Tensor, ...]]:
        return {"_qkv": (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)}

    def project(self, x: Tensor, rope: tuple[Tensor, Tensor], src: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q from x, k and v from `src` (default x): q [B,H,n,D], k, v [B,Hkv,n,D], with q/k norm and RoPE."""
        b, n, _ = x.shape
        h, kv, d = self.n_heads, self.n_kv, self.head_dim
        w = packed(self, "_qkv")  # q, k and v projections as one [(H + 2 Hkv) D, d] matrix
        if src is None:
            qkv = F.linear(x, w).view(b, n, h + 2 * kv, d)
            qk, v = qkv[:, :, : h + kv], qkv[:, :, h + kv :]
        else:
            q = F.linear(x, w[: h * d]).view(b, n, h, d)
            kv_ = F.linear(src, w[h * d :]).view(b, n, 2 * kv, d)
            qk, v = torch.cat((q, kv_[:, :, :kv]), dim=2), kv_[:, :, kv:]
        if self.q_norm is not None:  # per-head RMSNorm of q and k in one pass (weights stacked per head)
            qk = self.qk_norm_weight() * rms(qk, self.eps, None, self.__dict__.get("_eps"))
        qk = apply_rope(qk.transpose(1, 2), *rope)
        return qk[:, :h], qk[:, h:], v.transpose(1, 2)

    def qk_norm_weight(self) -> Tensor:
        """q_norm and k_norm weights stacked per head [H + Hkv, D], so one multiply norms q and k together.

        With autograd off the stack is kept (a copy: `LoopedLM.prepare_inference` rebuilds it once per
        generate call, so weights changed in between are seen).
        """
        w = None if torch.is_grad_enabled() else self.__dict__.get("_qk_norm")
        if w is None:
            w = torch.cat((self.q_norm.weight.expand(self.n_heads, -1), self.k_norm.weight.expand(self.n_kv, -1)))
            if not torch.is_grad_enabled():
                self.__dict__["_qk_norm"] = w
        return w

    def keys_values(self, src: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """k, v [B,Hkv,n,D] from `src` alone (MELT rows when q and the LoopLM's K/V come from x)."""
        b, n, _ = src.shape
        kv_ = F.linear(src, packed(self, "_qkv")[self.n_heads * self.head_dim :]).view(b, n, 2 * self.n_kv, self.head_dim)
        k, v = kv_[:, :, : self.n_kv], kv_[:, :, self.n_kv :]
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k.transpose(1, 2), *rope), v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
        """q [B,H,n,D], k/v [B,Hkv,L,D], mask bool [B,1,n,L] (True = attend) -> [B,n,d]."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n_heads != self.n_kv)
        b, _, n, _ = q.shape
        return F.linear(y.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim), self.o_proj.weight)


class MLP(nn.Module):
    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)

    def packed_params(self) -> dict[str, tuple[Tensor, ...]]:
        return {"_gate_up": (self.gate_proj.weight, self.up_proj.weight)}

    def forward(self, x: Tensor) -> Tensor:
        gate, up = F.linear(x, packed(self, "_gate_up")).chunk(2, dim=-1)
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
    """One decoder layer. `pre`: h + attn(norm(h)); `sandwich` (Ouro) also norms each sublayer's output."""

    def __init__(self, cfg: LoopConfig, gated: bool) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.norm_eps
        self.self_attn, self.mlp = Attention(cfg), MLP(cfg)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.sandwich = cfg.norm_layout == "sandwich"
        if self.sandwich:
            self.input_layernorm_2, self.post_attention_layernorm_2 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.melt_gate = MeltGate(cfg) if gated else None

    def forward(self, h: Tensor, mix: Mix) -> Tensor:
        a = mix(self.input_layernorm(h))
        h = h + (self.input_layernorm_2(a) if self.sandwich else a)
        m = self.mlp(self.post_attention_layernorm(h))
        return h + (self.post_attention_layernorm_2(m) if self.sandwich else m)


class Backbone(nn.Module):
    """Holds the tensors under HF's `model.` prefix so checkpoints map one to one."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        p, s = cfg.prelude_layers, cfg.shared_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        gated = cfg.kv_strategy == "gated"
        self.layers = nn.ModuleList(Block(cfg, gated and p <= i < p + s) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.early_exit_gate = nn.Linear(cfg.hidden_size, 1) if cfg.exit_gate else None


@dataclass
class ForwardOutput:
    """What the cache-free forward returns. Lists are indexed by loop t (0-based)."""

    logits: Tensor  # [B, N, V] from the final state
    loop_logits: list[Tensor] | None = None  # r x [B, N, V]: each loop's normed state through lm_head
    attn_outputs: list[list[Tensor]] | None = None  # [t][j] -> [B, N, d]: shared layer j's o_proj output at loop t
    exit_probs: Tensor | None = None  # [r, B, N]: Ouro exit distribution over loops


@dataclass
class StepOutput:
    """What a cached step returns, for the last position of each row only (what sampling needs)."""

    states: list[Tensor]  # normed final states [B, d]; one per loop when keep_loops, else one
    gate_logits: Tensor | None  # [r, B] exit-gate logits when the model has an exit gate and keep_loops


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
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        p, s = cfg.prelude_layers, cfg.shared_layers
        self.prelude = list(self.model.layers[:p])
        self.shared = list(self.model.layers[p : p + s])
        self.coda = list(self.model.layers[p + s :])

    # ----------------------------------------------------------------------------------- helpers
    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 (nn.Module's signature)
        """Moving or casting weights (`.to`, `.cuda`, `.half`) drops the packed inference buffers first."""
        self._drop_inference_buffers(everything=True)
        return super()._apply(fn, recurse)

    def prepare_inference(self) -> None:
        """Make the kept inference buffers safe to use without checks for one generate call or forward.

        Packed projections whose parameters were replaced since (e.g. `load_state_dict(assign=True)`)
        are dropped and rebuilt on first use; the stacked q/k-norm weights, being copies, are always
        rebuilt; each norm gets its eps as a 0-dim tensor on the weights' device (see `rms`). The
        per-token path then only looks them up.
        """
        self._drop_inference_buffers(everything=False)
        weight = self.model.embed_tokens.weight
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention)):
                module.__dict__["_eps"] = torch.tensor(module.eps, dtype=weight.dtype, device=weight.device)

    def _drop_inference_buffers(self, everything: bool) -> None:
        for module in self.modules():
            module.__dict__.pop("_qk_norm", None)
            module.__dict__.pop("_eps", None)
            if isinstance(module, (Attention, MLP)):
                for key, params in module.packed_params().items():
                    buf = module.__dict__.get(key)
                    if buf is not None and (everything or not still_packed(buf, params)):
                        del module.__dict__[key]

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
        for layer in self.shared:
            if layer.melt_gate is not None:
                fresh_gate(layer.melt_gate, generator, std)

    def logits(self, normed: Tensor) -> Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(normed, weight)

    def _final(self, h: Tensor) -> Tensor:
        """State after the coda; sandwich models are already normed unless coda layers ran after the last loop."""
        if self.config.norm_layout == "sandwich" and not self.coda:
            return h
        return self.model.norm(h)

    def _loop_end(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(state fed to the next loop, the loop's normed state read by the exit gate / per-loop logits)."""
        if self.config.norm_layout == "sandwich":
            h = self.model.norm(h)
            return h, h
        return h, self.model.norm(h)

    # ----------------------------------------------------------------------- cache-free forward
    def forward(
        self,
        tokens: Tensor,
        *,
        loops: int | None = None,
        chunk_size: int | Sequence[int] | None = None,
        kv_mix: float | None = None,
        return_loop_logits: bool = False,
        return_attn_outputs: bool = False,
    ) -> ForwardOutput:
        """Full-sequence forward without cache (autograd works). tokens [B, N], no padding.

        Gated models run chunk-wise (`chunk_size`, default the config's, or a list of chunk lengths
        summing to N, e.g. a prefill's chunks followed by 1s for decoded tokens) and blend attention's K/V as
        `kv_mix * KV_melt + (1 - kv_mix) * KV_looplm` (default 1: pure MELT; 0 reproduces the LoopLM
        with the same weights exactly). Other strategies ignore both arguments.
        """
        cfg = self.config
        r = cfg.check_loops(loops if loops is not None else cfg.loops)
        b, n = tokens.shape
        if not torch.is_grad_enabled():
            self.prepare_inference()
        gated = cfg.kv_strategy == "gated"
        a = (1.0 if kv_mix is None else float(kv_mix)) if gated else 0.0
        chunk = (chunk_size or cfg.chunk_size) if gated else n
        if isinstance(chunk, int):
            bounds = [(s0, min(n, s0 + chunk)) for s0 in range(0, n, chunk)]
        else:
            ends = torch.tensor(list(chunk)).cumsum(0).tolist()
            if ends[-1] != n or min(chunk) < 1:
                raise ValueError(f"chunk lengths {list(chunk)} must be positive and sum to the sequence length {n}")
            bounds = list(zip([0] + ends[:-1], ends))
        h = self.model.embed_tokens(tokens)
        positions = torch.arange(n, device=tokens.device).expand(b, n)
        rope = self.rotary(positions, h.dtype)

        def full(attn: Attention) -> Mix:
            return lambda x: attn.attend(*attn.project(x, rope), None, causal=True)

        for layer in self.prelude:
            h = layer(h, full(layer.self_attn))

        s = len(self.shared)
        final_rows: list[list[tuple[Tensor, Tensor]]] = [[] for _ in range(s)]  # MELT rows after the last loop
        loop_rows: list[list[list[tuple[Tensor, Tensor]]]] = [[[] for _ in range(s)] for _ in range(r)]  # LoopLM rows
        loop_states: list[list[Tensor]] = [[] for _ in range(r)]
        attn_outs: list[list[list[Tensor]]] = [[[] for _ in range(s)] for _ in range(r)]
        outputs: list[Tensor] = []
        for s0, s1 in bounds:
            more = s1 < n
            hc = h[:, s0:s1]
            rope_c = (rope[0][:, :, s0:s1], rope[1][:, :, s0:s1])
            mask = None if s0 == 0 else causal_mask(s0, s1, tokens.device)
            latent: list[Tensor | None] = [None] * s
            for t in range(r):
                for j, layer in enumerate(self.shared):

                    def mix(x: Tensor, t: int = t, j: int = j, layer: Block = layer) -> Tensor:
                        attn = layer.self_attn
                        if a > 0:
                            latent[j] = x if t == 0 else layer.melt_gate(x, latent[j], t)
                        if a < 1:
                            q, kl, vl = attn.project(x, rope_c)
                            if a > 0:
                                km, vm = attn.keys_values(latent[j], rope_c)
                        else:
                            q, km, vm = attn.project(x, rope_c, latent[j])
                        k_all = km if a == 1 else kl if a == 0 else a * km + (1 - a) * kl
                        v_all = vm if a == 1 else vl if a == 0 else a * vm + (1 - a) * vl
                        if s0 > 0:  # earlier chunks: MELT final rows and/or the LoopLM's loop-t rows
                            k_prev, v_prev = 0.0, 0.0
                            if a > 0:
                                k_prev = a * torch.cat([k for k, _ in final_rows[j]], dim=2)
                                v_prev = a * torch.cat([v for _, v in final_rows[j]], dim=2)
                            if a < 1:
                                k_prev = k_prev + (1 - a) * torch.cat([k for k, _ in loop_rows[t][j]], dim=2)
                                v_prev = v_prev + (1 - a) * torch.cat([v for _, v in loop_rows[t][j]], dim=2)
                            k_all, v_all = torch.cat((k_prev, k_all), dim=2), torch.cat((v_prev, v_all), dim=2)
                        if more and a < 1:
                            loop_rows[t][j].append((kl, vl))
                        if more and a > 0 and t == r - 1:
                            final_rows[j].append((km, vm))
                        out = attn.attend(q, k_all, v_all, mask, causal=mask is None)
                        if return_attn_outputs:
                            attn_outs[t][j].append(out)
                        return out

                    hc = layer(hc, mix)
                hc, normed = self._loop_end(hc)
                if return_loop_logits or self.model.early_exit_gate is not None:
                    loop_states[t].append(normed)
            outputs.append(hc)
        h = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]
        for layer in self.coda:
            h = layer(h, full(layer.self_attn))
        out = ForwardOutput(logits=self.logits(self._final(h)))
        if s and (return_loop_logits or self.model.early_exit_gate is not None):
            states = [torch.cat(z, dim=1) for z in loop_states]
            if return_loop_logits:
                out.loop_logits = [self.logits(z) for z in states]
            if self.model.early_exit_gate is not None:
                out.exit_probs = exit_probabilities(torch.stack([self.model.early_exit_gate(z).squeeze(-1) for z in states]))
        if return_attn_outputs and s:
            out.attn_outputs = [[torch.cat(z, dim=1) for z in row] for row in attn_outs]
        return out

    # ------------------------------------------------------------------------------ cached step
    def step(self, tokens: Tensor, positions: Tensor, cache: "KVCache", slot: int, mask: Tensor | None, loops: int, keep_loops: bool = False) -> StepOutput:
        """Run tokens [B, n] at cache slots slot..slot+n-1 (positions [B, n]), writing K/V in place.

        `mask` [B,1,n,slot+n] bool, or None for plain causal attention. For gated caches n must not
        exceed the cache's latent chunk. Returns the last position's normed state(s). Callers run
        `prepare_inference()` once before a series of steps (`adapters.engine.generate.generate` does).
        """
        cfg = self.config
        p, s = cfg.prelude_layers, cfg.shared_layers
        per_loop, gated = cfg.kv_strategy == "per_loop", cfg.kv_strategy == "gated"
        n = tokens.shape[1]
        h = self.model.embed_tokens(tokens)
        end = slot + n
        rope = self.rotary(positions, h.dtype, length=end)  # positions never exceed slots
        causal = mask is None and n > 1

        def cached(attn: Attention, entry: int, latent: int | None = None, loop: int = 0, gate: MeltGate | None = None) -> Mix:
            def mix(x: Tensor) -> Tensor:
                src = None
                if latent is not None:
                    src = cache.latent[latent, :, :n]
                    src.copy_(x if loop == 0 else gate(x, src, loop))
                q, k, v = attn.project(x, rope, src)
                k_cache, v_cache = cache.entry_k[entry], cache.entry_v[entry]
                k_cache[:, :, slot:end] = k
                v_cache[:, :, slot:end] = v
                return attn.attend(q, k_cache[:, :, :end], v_cache[:, :, :end], mask, causal)

            return mix

        for i, layer in enumerate(self.prelude):
            h = layer(h, cached(layer.self_attn, i))
        states, gates = [], []
        for t in range(loops):
            for j, layer in enumerate(self.shared):
                entry = p + (t * s + j if per_loop else j)
                h = layer(h, cached(layer.self_attn, entry, j if gated else None, t, layer.melt_gate))
            if s and keep_loops:
                h, normed = self._loop_end(h)
                states.append(normed[:, -1])
                if self.model.early_exit_gate is not None:
                    gates.append(self.model.early_exit_gate(normed[:, -1]).squeeze(-1))
            elif s and cfg.norm_layout == "sandwich":
                h = self.model.norm(h)
        base = p + (s * loops if per_loop else s)
        for k, layer in enumerate(self.coda):
            h = layer(h, cached(layer.self_attn, base + k))
        if not states:
            states = [self._final(h[:, -1:])[:, -1]]
        return StepOutput(states=states, gate_logits=torch.stack(gates) if gates else None)

    # ------------------------------------------------------------------------------ conversion
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


def causal_mask(s0: int, s1: int, device: torch.device) -> Tensor:
    """Bool [1,1,n,s1]: query at slot s0+i sees keys 0..s0+i."""
    q = torch.arange(s0, s1, device=device)[:, None]
    return (torch.arange(s1, device=device)[None, :] <= q)[None, None]

