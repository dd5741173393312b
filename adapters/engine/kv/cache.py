"""K/V caches: where attention finds the rows of earlier tokens, and MELT its latent state h.

Every attention call goes through one: a gated layer first asks it for the source of its K/V
(`kv_source`: MELT's latent h), then `adapters.engine.layers.Attention.attend` hands it the call's
rows and gets back every row the call attends to (`update`). Three implementations:

- `KVCache`: the static cache of a generate call, preallocated once, written in place and
  accounted to the byte.
- `ChunkCache`: the rows of a full-sequence forward, kept as tensors per chunk (nothing is
  written in place, so autograd runs through it); same layout and semantics as `KVCache`.
- `MixedCache`: stage-1 conversion training, `KV = a * KV_melt + (1 - a) * KV_looplm`: a gated
  model's rows read as MELT and as its LoopLM, both kept, blended for attention.

Layout: which entry holds a (layer, loop)'s rows, and whether a latent is kept, is the `KVLayout` a cache is
handed (`adapters.engine.kv.layouts`: the model's family's, or the run's KV policy's): `standard` one entry per layer; `per_loop` (Ouro, Huginn) one per loop of each
shared layer, growing with r; `gated` (MELT) one per layer, shared rows overwritten at every loop, plus the
latent h of each shared layer for the tokens in flight (a prefill chunk or the decoded token).

A layout that folds a token's loops into its entry (shared mean, EMA) reads the entry before each later loop
writes it (`KVLayout.fold`); the call's own tokens attend to the loop's own K/V, later calls to the fold. Rows are stored in the config's `kv_dtype` (`adapters.engine.kv.format`): a quantized
row is its values and scale as bytes, written by `pack` and dequantized for attention by `unpack`.

`KVCache` stores k and v as [entries, batch, kv_heads, length, head_dim (+ 4 scale bytes)] and the latent as
[s, batch, chunk, hidden]. `kv_bytes_allocated` counts the K/V tensors plus the latent and the
history buffer of the loop conditioning (`history_bytes`);
`kv_bytes_used` counts the slots written so far (every row of the batch, padding included,
because those slots are occupied) plus the latent once anything is written.
`adapters.engine.memory.estimate` predicts the same numbers from the config alone (`adapters.engine.kv.accounting`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol
from collections.abc import Callable

import torch
from torch import Tensor

from adapters.engine.config import LoopConfig
from adapters.engine.kv.accounting import history_bytes
from adapters.engine.kv.format import KV_FORMATS
from adapters.engine.kv.layouts import KVLayout

Gate = Callable[[Tensor, Tensor, int], Tensor]  # MELT's update (x, h, loop) -> new h, for loops >= 1


class Cache(Protocol):
    in_place: bool  # attention goes through `attend` (a kernel over the cache's own storage), not `update` and SDPA

    def kv_source(self, layer: int, loop: int, x: Tensor, gate: Gate) -> Tensor | None:
        """What a gated layer projects K/V from at `loop` (None: from x itself, as a LoopLM does)."""

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        """Keep the rows k, v [B, Hkv, n, D] of slots slot..slot+n-1; return every row up to them."""


class InPlaceCache(Cache, Protocol):
    """A cache whose `in_place` is true (the paged pool's step with a GPU kernel, `adapters.engine.serving.paged`)."""

    def attend(self, layer: int, loop: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Keep the rows k, v as `update` does and return attention's output [B, n, H, D] for q [B, H, n, D]."""


class KVCache:
    """The static cache of one generate call (a batch of `batch` rows, `length` slots, `loops` loops, `layout`'s
    entries)."""

    in_place = False

    def __init__(
        self,
        config: LoopConfig,
        layout: KVLayout,
        batch: int,
        length: int,
        loops: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.layout, self.format, self.dtype = layout, KV_FORMATS[config.kv_dtype], dtype
        layout, fmt = self.layout, self.format
        self.loops = config.check_loops(loops)
        self.batch, self.capacity = batch, length
        entries = layout.entries(config, loops)
        shape = (entries, batch, config.num_kv_heads, length, fmt.width(config.head_dim))
        self.k = torch.zeros(shape, dtype=fmt.storage(dtype), device=device)
        self.v = torch.zeros(shape, dtype=fmt.storage(dtype), device=device)
        k, v = self.k.unbind(0), self.v.unbind(0)  # views: no per-step indexing
        self.rows = [[(k[e], v[e]) for e in row] for row in layout.table(config, loops)]
        self.prelude, self.latent = config.prelude_layers, None
        if layout.has_latent(config):
            chunk = min(config.chunk_size, length)
            self.latent = torch.zeros(
                (config.shared_layers, batch, chunk, config.hidden_size), dtype=dtype, device=device
            )
        self.length = 0  # slots written (the generate loop advances it)
        self._slot_bytes = 2 * entries * batch * config.num_kv_heads * self.k.shape[-1] * self.k.element_size()
        self._latent_bytes = 0 if self.latent is None else self.latent.numel() * self.latent.element_size()
        self._latent_bytes += history_bytes(
            config, batch * (self.latent.shape[2] if self.latent is not None else 1), dtype.itemsize
        )

    def kv_source(self, layer: int, loop: int, x: Tensor, gate: Gate) -> Tensor | None:
        """The latent h of `layer`'s tokens in flight, updated in place: x at loop 0, then the gate."""
        if self.latent is None:
            return None
        h = self.latent[layer - self.prelude, :, : x.shape[1]]
        return h.copy_(x if loop == 0 else gate(x, h, loop))

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        k_all, v_all = self.rows[layer][loop]
        end, fmt = slot + k.shape[2], self.format
        if loop and self.layout.folds:
            return self._fold(layer, loop, slot, k, v)
        k_all[:, :, slot:end], v_all[:, :, slot:end] = fmt.pack_pair(k, v)
        return fmt.unpack(k_all[:, :, :end], self.dtype), fmt.unpack(v_all[:, :, :end], self.dtype)

    def _fold(self, layer: int, loop: int, slot: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """A folding layout's loop >= 1: the call's own tokens attend to this loop's K/V (written, then read), and
        their entries keep the fold of their loops so far, what later calls read."""
        fmt, dtype, end = self.format, self.dtype, slot + k.shape[2]
        old_k, old_v = self.stored(layer, loop, slot, end)
        k_all, v_all = (rows[:, :, :end] for rows in self.rows[layer][loop])
        k_all[:, :, slot:], v_all[:, :, slot:] = fmt.pack_pair(k, v)
        read = fmt.unpack_copy(k_all, dtype), fmt.unpack_copy(v_all, dtype)
        k_all[:, :, slot:], v_all[:, :, slot:] = fmt.pack_pair(
            self.layout.fold(old_k, k, loop), self.layout.fold(old_v, v, loop)
        )
        return read

    def stored(self, layer: int, loop: int, slot: int, end: int) -> tuple[Tensor, Tensor]:
        """What (layer, loop)'s entry holds at slots slot..end-1, dequantized into memory of its own."""
        k_all, v_all = self.rows[layer][loop]
        return self.format.unpack_copy(k_all[:, :, slot:end], self.dtype), self.format.unpack_copy(
            v_all[:, :, slot:end], self.dtype
        )

    @property
    def kv_bytes_allocated(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size() + self._latent_bytes

    @property
    def kv_bytes_used(self) -> int:
        return self._slot_bytes * self.length + (self._latent_bytes if self.length else 0)

    def accounting(self) -> tuple[int, int, int]:
        """(kv_bytes_used, kv_bytes_allocated, peak_allocated), as `BlockPool.accounting` gives them."""
        return self.kv_bytes_used, self.kv_bytes_allocated, self.peak_allocated

    @property
    def peak_allocated(self) -> int:
        """A static cache holds its whole allocation from start to end (the same interface as a block pool)."""
        return self.kv_bytes_allocated

    @property
    def kv_bytes_reserved(self) -> int:
        return self.kv_bytes_allocated

    @property
    def chunk(self) -> int:
        """Most tokens one step may process (gated caches hold the latent for this many)."""
        return self.capacity if self.latent is None else self.latent.shape[2]


class ChunkCache:
    """A full-sequence forward's rows, chunk by chunk: `KVCache`'s semantics without writing in place.

    Each entry keeps its rows per chunk (keyed by the chunk's first slot), so a gated layer's later
    loops replace their chunk's rows as `KVCache` overwrites them, and later chunks see the final
    ones. `layout` may differ from the family's: a gated model read with `per_loop` rows is its LoopLM.
    """

    in_place = False

    def __init__(self, config: LoopConfig, layout: KVLayout, loops: int) -> None:
        self.layout = layout
        self.format = KV_FORMATS[config.kv_dtype]
        self.entries = layout.table(config, loops)
        self.rows: defaultdict[int, dict[int, tuple[Tensor, Tensor]]] = defaultdict(
            dict
        )  # entry -> chunk's slot -> rows
        self.gated = layout.has_latent(config)
        self.latent: dict[int, Tensor] = {}  # layer -> h of the current chunk

    def kv_source(self, layer: int, loop: int, x: Tensor, gate: Gate) -> Tensor | None:
        if not self.gated:
            return None
        h = self.latent[layer] = x if loop == 0 else gate(x, self.latent[layer], loop)
        return h

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        rows, fmt = self.rows[self.entries[layer][loop]], self.format
        own = fmt.round_trip(k), fmt.round_trip(v)  # what the chunk's tokens attend to at this loop
        if loop and self.layout.folds:  # ... and what their entries keep for later chunks: the fold
            rows[slot] = (
                fmt.round_trip(self.layout.fold(rows[slot][0], k, loop)),
                fmt.round_trip(self.layout.fold(rows[slot][1], v, loop)),
            )
        else:
            rows[slot] = own
        if len(rows) == 1:
            return own
        keys, values = zip(*(own if s == slot else kv for s, kv in rows.items()))
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)


class MixedCache:
    """Stage-1 conversion: attention sees `a * KV_melt + (1 - a) * KV_looplm` for 0 < a < 1.

    The K/V source of a gated layer is the pair (h, x) stacked on a leading dim; `melt` keeps the
    rows from h, `looplm` those from x, each with its own layout, and attention gets their blend.
    Prelude and coda layers have no latent: their rows are the same in both and kept once.
    """

    in_place = False

    def __init__(self, a: float, melt: ChunkCache, looplm: ChunkCache) -> None:
        self.a, self.melt, self.looplm = a, melt, looplm

    def kv_source(self, layer: int, loop: int, x: Tensor, gate: Gate) -> Tensor:
        h = self.melt.kv_source(layer, loop, x, gate)
        assert h is not None  # `melt` keeps the gated layout's latent
        return torch.stack((h, x))

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        if k.dim() == 4:  # rows from x alone: a prelude or coda layer
            return self.looplm.update(layer, loop, k, v, slot)
        k_melt, v_melt = self.melt.update(layer, loop, k[0], v[0], slot)
        k_loop, v_loop = self.looplm.update(layer, loop, k[1], v[1], slot)
        return self.a * k_melt + (1 - self.a) * k_loop, self.a * v_melt + (1 - self.a) * v_loop
