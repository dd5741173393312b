"""The bytes a layout holds per token, from the config alone: what the caches allocate and the memory model predicts.

`adapters.engine.memory.analytic_terms` adds the weights to these terms; the paged pool sizes its blocks and its
manager counts its bytes with them, and `KVCache` allocates exactly as many (the tests hold the two together).
"""

from __future__ import annotations

from adapters.engine.config import LoopConfig
from adapters.engine.kv.format import KV_FORMATS
from adapters.engine.kv.layouts import KVLayout


def history_bytes(config: LoopConfig, tokens: int, size: int) -> int:
    """Bytes of the history buffer for `tokens` tokens in flight: the last w loop differences, w x d each.

    Loops of one token run in sequence, so decoding keeps them for the token being decoded only (a
    gated prefill for its chunk). `Backbone.run` holds them as activations; `KVCache` accounts them with the latent.
    """
    return config.history_window * config.hidden_size * tokens * size if config.history != "none" else 0


def kv_terms(cfg: LoopConfig, layout: KVLayout, loops: int, size: int) -> dict[str, int]:
    """Per-token K/V bytes of `layout` at `loops` on a model of `size` bytes per value, and the latent's.

    K/V bytes follow the layout's entries and the config's `kv_dtype` (a quantized row's scale included). The
    "latent" is the state kept per token in flight: MELT's h of each shared layer, for a prefill chunk, plus the
    history buffer of the loop conditioning (w x d, for one decoded token unless gated).
    """
    history = history_bytes(cfg, 1, size)
    row = KV_FORMATS[cfg.kv_dtype].row_bytes(cfg.head_dim, size)  # one token and head: values, and a scale
    return {
        "kv_bytes_per_token": 2 * layout.entries(cfg, loops) * cfg.num_kv_heads * row,
        "latent_bytes_per_token": layout.latent_width(cfg) * size + history,
        "latent_tokens": layout.latent_tokens(cfg) or (1 if history else 0),
    }
