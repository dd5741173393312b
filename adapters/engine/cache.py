"""Static KV caches: one preallocation per generate call, written in place, accounted to the byte.

Layout: `k` and `v` are [entries, batch, kv_heads, length, head_dim]. The entry of a token's K/V:
- `standard`: one per layer (prelude, shared, coda in order).
- `per_loop` (LoopLM / Ouro): prelude entries, then loop t of shared layer i at `p + t * s + i`
  (HF Ouro's own `t * num_hidden_layers + i` when p = 0), then coda entries. Grows with the loops r.
- `gated` (MELT): one per layer, shared rows overwritten at every loop, plus `latent`
  [s, batch, chunk, hidden]: the gate's state h for the tokens in flight (a prefill chunk or the
  decoded token). Independent of r.

`kv_bytes_allocated` counts the K/V tensors plus the MELT latent; `kv_bytes_used` counts the slots
written so far (every row of the batch, padding included, because those slots are occupied) plus
the latent once anything is written. `adapters.engine.memory.estimate` predicts the same numbers from the
config alone.
"""

from __future__ import annotations

import torch

from adapters.engine.config import LoopConfig


class KVCache:
    def __init__(self, config: LoopConfig, batch: int, length: int, loops: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.strategy = config.kv_strategy
        self.loops = config.check_loops(loops)
        self.batch, self.capacity = batch, length
        entries = config.kv_entries(loops)
        shape = (entries, batch, config.num_kv_heads, length, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.entry_k, self.entry_v = list(self.k.unbind(0)), list(self.v.unbind(0))  # views: no per-step indexing
        self.latent = None
        if self.strategy == "gated":
            chunk = min(config.chunk_size, length)
            self.latent = torch.zeros((config.shared_layers, batch, chunk, config.hidden_size), dtype=dtype, device=device)
        self.length = 0  # slots written (the generate loop advances it)
        self._slot_bytes = 2 * entries * batch * config.num_kv_heads * config.head_dim * self.k.element_size()
        self._latent_bytes = 0 if self.latent is None else self.latent.numel() * self.latent.element_size()

    @property
    def kv_bytes_allocated(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size() + self._latent_bytes

    @property
    def kv_bytes_used(self) -> int:
        return self._slot_bytes * self.length + (self._latent_bytes if self.length else 0)

    @property
    def chunk(self) -> int:
        """Most tokens one step may process (gated caches hold the latent for this many)."""
        return self.capacity if self.latent is None else self.latent.shape[2]
