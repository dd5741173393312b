"""Analytic memory model: parameters, weight bytes and KV bytes from a `LoopConfig` alone.

It never reads stored figures: the tests check it against the bytes the engine's caches allocate
(`adapters.engine.kv.cache.KVCache.kv_bytes_allocated`) and the parameters the model holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.base import DTYPE_BYTES, AdapterError, dtype_short
from adapters.engine.config import LOOP_GATE_DIM, LoopConfig
from adapters.engine.families import family_of
from adapters.engine.kv.accounting import kv_terms
from adapters.engine.kv.layouts import layout_of
from measures import analytic_kv_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    weights_bytes: int
    kv_bytes: int
    total_bytes: int


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[dtype_short(dtype, model=True)]


def count_params(cfg: LoopConfig) -> int:
    """Parameters of `adapters.engine.model.LoopedLM(cfg)`, shape by shape; what a family adds, by its hook."""
    d, hd = cfg.hidden_size, cfg.head_dim
    attn = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + (2 * hd if cfg.qk_norm else 0)
    norms = (4 if cfg.norm_layout == "sandwich" else 2) * d
    layer = attn + 3 * d * cfg.ffn_size + norms
    total = (
        cfg.num_layers * layer + cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + d
    )  # embeddings, lm_head, final norm
    return total + family_of(cfg).extra_params() + conditioning_params(cfg)


def conditioning_params(cfg: LoopConfig) -> int:
    """Parameters the loop conditioning adds (`conditioning.LoopConditioning`): A, the w maps B_j, T x 8 loop
    gates, and T x s x 2 x 8 branch gates."""
    d = cfg.hidden_size
    size = {"none": 0, "scalar": 1, "channel": d, "dense": d * d}
    gates = cfg.loops * LOOP_GATE_DIM * (int(cfg.loop_gate) + 2 * cfg.shared_layers * int(cfg.branch_gate))
    return size[cfg.injection] + cfg.history_window * size[cfg.history] + gates


def kv_bytes(cfg: LoopConfig, tokens: int, batch: int = 1, loops: int | None = None, dtype: str = "bf16") -> int:
    """Bytes of the static cache for `batch` sequences of `tokens` slots at `loops` (default: trained T)."""
    return analytic_kv_bytes(analytic_terms(cfg, loops, dtype), tokens, batch)


def estimate(
    cfg: LoopConfig, tokens: int, batch: int = 1, loops: int | None = None, dtype: str = "bf16"
) -> MemoryEstimate:
    """Weights + KV bytes for `batch` sequences of `tokens` (prompt + generated) tokens."""
    if tokens < 1 or batch < 1:
        raise AdapterError(f"tokens and batch must be >= 1, got tokens={tokens}, batch={batch}")
    params = count_params(cfg)
    weights = params * dtype_bytes(dtype)
    kv = kv_bytes(cfg, tokens, batch, loops, dtype)
    return MemoryEstimate(params=params, weights_bytes=weights, kv_bytes=kv, total_bytes=weights + kv)


def analytic_terms(cfg: LoopConfig, loops: int | None = None, dtype: str = "bf16") -> dict[str, int]:
    """`estimate(cfg, T, batch=1, loops, dtype).total_bytes` as stored coefficients, for every T >= 1
    (`measures.analytic_bytes` evaluates them; the one home of the formula).

    Engine adapters put these in `describe()`, so readers of the results database (the dashboards)
    evaluate the formula at any context length without importing the engine's packages.
    The KV terms are `adapters.engine.kv.accounting.kv_terms` of the config's layout (its KV policy's).
    """
    size = dtype_bytes(dtype)
    r = cfg.check_loops(cfg.loops if loops is None else loops)
    return {"weights_bytes": count_params(cfg) * size, **kv_terms(cfg, layout_of(cfg), r, size)}
