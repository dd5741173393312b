"""Paged KV: the pool's tensors, and the `Cache` one engine step attends through.

The pool holds every K/V entry of the layout it is handed (`adapters.engine.kv.layouts`: `standard`, `per_loop`
with r entries per shared layer, `gated` and the sharing policies with one row per layer) for
`num_blocks * block_size` token slots, stored flat as [entries, slots, kv_heads, head_dim] in the config's
`kv_dtype` (a quantized row: head_dim value bytes and its 4 scale bytes, `adapters.engine.kv.format`). Which
blocks are free, who holds them and how full they are is the `BlockManager`'s bookkeeping
(`adapters.engine.serving.block_manager`, `pool.manager`), which also keeps the exact byte accounting.
The n samples of one prompt share its full prefilled blocks; the partly filled last one is copied
(`BlockPool.fork`: each sample writes its own tokens there).

A step (`PagedStep`) writes its tokens' K/V to their slots (`index_copy_`) and, where the pool has an attention
kernel (`BlockPool.attention`: a GPU with triton, `adapters.engine.kernels`), attends over the blocks in place
(`attend`); elsewhere it gathers every sequence's blocks into [B, kv_heads, L, head_dim] for SDPA (`update`), L the
longest context in the step; the mask hides the rest. MELT's latent h for the tokens in flight lives in one buffer sized for the
largest step (the concurrency cap, or a prefill chunk), reused by every step. Shapes depend only on
B, n and L, which is what a captured decode step needs. On the CPU a decode step goes through the
model runner's decode rows instead (`adapters.engine.serving.rows`), which hand each block back when it fills.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from adapters.base import AdapterError
from adapters.engine.config import LoopConfig
from adapters.engine.families import family_of
from adapters.engine.kv.accounting import kv_terms
from adapters.engine.kv.cache import Gate
from adapters.engine.kv.format import KV_FORMATS
from adapters.engine.kv.layouts import KVLayout
from adapters.engine.serving.block_manager import BlockManager
from adapters.engine.serving.sequence import Sequence
from measures import GB

Read = TypeVar("Read")
PagedAttention = Callable[..., Tensor]  # `adapters.engine.kernels.attention.paged_attention`'s signature
DEFAULT_BLOCK_SIZE = 16
KEEP_BYTES = 64 * 2**20  # gathered K/V rows a gated step may keep across its loops (`PagedStep`)
KV_FRACTION = 0.9  # of the GPU's free memory, the most a default pool takes


def pool_blocks(
    config: LoopConfig, layout: KVLayout, loops: int, budget_bytes: int, block_size: int, latent_tokens: int, size: int
) -> int:
    """Blocks a budget of `budget_bytes` holds once the latent buffer of `latent_tokens` is set aside, on a model of
    `size` bytes per value."""
    terms = kv_terms(config, layout, loops, size)
    return (budget_bytes - terms["latent_bytes_per_token"] * latent_tokens) // (
        terms["kv_bytes_per_token"] * block_size
    )


class BlockPool:
    """K/V blocks for every entry of `layout` at `loops` (the tensors), and their `BlockManager`."""

    def __init__(
        self,
        config: LoopConfig,
        layout: KVLayout,
        loops: int,
        num_blocks: int,
        block_size: int,
        latent_tokens: int,
        dtype: torch.dtype,
        device: torch.device | str,
        spare: bool = False,
        attention: PagedAttention | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise AdapterError(
                f"a KV pool needs at least one block of at least one token (got {num_blocks} x {block_size})"
            )
        self.block_size = block_size
        self.layout, self.format, self.dtype = layout, KV_FORMATS[config.kv_dtype], dtype
        fmt = self.format
        self.entries = layout.table(config, loops)
        # a spare block past the last one, never allocated: padded decode steps (`graphs`) write their padding rows there
        self.spare = num_blocks if spare else None
        shape = (
            layout.entries(config, loops),
            (num_blocks + spare) * block_size,
            config.num_kv_heads,
            fmt.width(config.head_dim),
        )
        self.k = torch.zeros(shape, dtype=fmt.storage(dtype), device=device)
        self.v = torch.zeros(shape, dtype=fmt.storage(dtype), device=device)
        self.k_entries, self.v_entries = self.k.unbind(0), self.v.unbind(0)  # views made once, not at every write
        self.prelude, self.shared, self.latent_tokens = config.prelude_layers, config.shared_layers, latent_tokens
        self.latent = None
        self.attention = (
            attention  # the kernel steps attend through in place, where one runs (a GPU: `adapters.engine.kernels`)
        )
        if layout.has_latent(config):
            self.latent = torch.zeros(
                (config.shared_layers, latent_tokens, config.hidden_size), dtype=dtype, device=device
            )
        terms = kv_terms(config, layout, loops, dtype.itemsize)
        self.manager = BlockManager(
            num_blocks, block_size, terms["kv_bytes_per_token"], terms["latent_bytes_per_token"]
        )

    @classmethod
    def for_workload(
        cls,
        config: LoopConfig,
        layout: KVLayout,
        loops: int,
        capacities: list[int],
        *,
        max_seqs: int,
        kv_budget: float | None,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        spare: bool,
        attention: PagedAttention | None = None,
    ) -> BlockPool:
        """A workload's pool: `kv_budget` GB, else what sequences of `capacities` need at the cap `max_seqs` (on a GPU
        at most `KV_FRACTION` of free memory); never smaller than one sequence at its full length."""
        longest, rows = max(-(-c // block_size) for c in capacities), min(max_seqs, len(capacities))
        latent = max(rows, family_of(config).prefill_chunk or 1)  # tokens one step may hold in flight
        if kv_budget is not None:
            blocks = pool_blocks(config, layout, loops, int(kv_budget * GB), block_size, latent, dtype.itemsize)
        else:
            blocks = rows * longest
            if device.type == "cuda":
                free = int(torch.cuda.mem_get_info(device)[0] * KV_FRACTION)
                blocks = min(blocks, pool_blocks(config, layout, loops, free, block_size, latent, dtype.itemsize))
        if blocks < longest:
            per_token = kv_terms(config, layout, loops, dtype.itemsize)["kv_bytes_per_token"]
            raise AdapterError(
                f"the KV pool holds {max(blocks, 0) * block_size} tokens ({max(blocks, 0) * block_size * per_token / GB:.3f} GB) but one "
                f"sequence needs {longest * block_size}: raise kv_budget, or lower max_new_tokens or the loops"
            )
        return cls(config, layout, loops, blocks, block_size, latent, dtype, device, spare=spare, attention=attention)

    # ------------------------------------------- the KV store `EngineAdapter.memory` reads, as it reads a `KVCache`
    @property
    def kv_bytes_reserved(self) -> int:
        """The whole pool (with the GPU path's spare block) and the latent state of the largest step, held
        from the first step to the last."""
        return self.k.numel() * self.k.element_size() * 2 + self.manager.latent_bytes_per_token * self.latent_tokens

    @property
    def kv_bytes_allocated(self) -> int:
        return self.manager.kv_bytes_allocated

    def accounting(self) -> tuple[int, int, int]:
        """(kv_bytes_used, kv_bytes_allocated, peak_allocated), read together (`BlockManager.accounting`)."""
        return self.manager.accounting()

    def reset_peak(self) -> None:
        self.manager.reset_peak()

    # ------------------------------------------------------------------------------ prompts
    def rows_per_step(self, members: list[int], length: int) -> list[list[int]]:
        """`members` split so one step's tokens in flight (`length` each) fit the latent buffer (MELT's h)."""
        rows = len(members) if self.latent is None else max(1, self.latent_tokens // length)
        return [members[i : i + rows] for i in range(0, len(members), rows)]

    def fork(self, first: Sequence, seq: Sequence) -> None:
        """`seq` takes `first`'s prefilled prompt: its full blocks shared, its partly filled last block copied."""
        full, tail = divmod(first.prompt_len, self.block_size)
        self.manager.share(first.blocks[:full])
        seq.blocks = first.blocks[:full] + ([self._copy(first.blocks[full], tail)] if tail else [])
        seq.written = first.prompt_len

    def _copy(self, src: int, filled: int) -> int:
        """A new block holding the first `filled` slots of block `src` (a sample's own copy of a shared tail)."""
        dst, size = self.manager.allocate(), self.block_size
        self.k[:, dst * size : dst * size + filled] = self.k[:, src * size : src * size + filled]
        self.v[:, dst * size : dst * size + filled] = self.v[:, src * size : src * size + filled]
        self.manager.mark_written([(dst, filled)])
        return dst


def key_mask(positions: Tensor, length: int) -> Tensor:
    """Bool [B, 1, n, length]: each new token sees the slots of its sequence up to its own position."""
    return (torch.arange(length, device=positions.device) <= positions[:, :, None])[:, None]


class PoolStep:
    """What every engine step's `Cache` shares: MELT's latent h of the tokens in flight lives in the
    pool's buffer. Subclasses say where the new K/V go and where attention reads from.

    Under per-token exits a decode step's later loops run on its still-looping rows only: `narrow` gives the
    step of those rows (`index`, rows of the whole step: their latent h is theirs in the whole step's buffer),
    and `fill_skipped` fills the loops an exited row skips with its exit loop's K/V (`adapters.engine.exits`)."""

    in_place = False  # whether attention goes through `attend` (the pool's kernel) rather than `update` and SDPA

    def __init__(self, pool: BlockPool, in_flight: int) -> None:
        self.pool, self.in_flight, self.layout = pool, in_flight, pool.layout
        self.index: Tensor | None = None  # the rows of the whole step this one runs (None: all)

    def kv_source(self, layer: int, loop: int, x: Tensor, gate: Gate) -> Tensor | None:
        """The latent h of `layer`'s tokens in flight, updated in place: x at loop 0, then the gate."""
        if self.pool.latent is None:
            return None
        h = self.pool.latent[layer - self.pool.prelude, : self.in_flight]
        if self.index is None:
            h = h.view(x.shape)
            return h.copy_(x if loop == 0 else gate(x, h, loop))
        h = h.view(-1, *x.shape[1:])
        new = x if loop == 0 else gate(x, h[self.index], loop)
        h[self.index] = new
        return new

    def fill_skipped(self, index: Tensor, loop: int, loops: int) -> None:
        """Rows `index` of the step stop after `loop` (0-based): their K/V entries of loops loop+1..loops-1 at every
        shared layer get their loop-`loop` K/V (one entry per layer, as gated layers keep, needs nothing)."""
        pool = self.pool
        for layer in range(pool.prelude, pool.prelude + pool.shared):
            src = pool.entries[layer][loop]
            for dst in dict.fromkeys(pool.entries[layer][loop + 1 : loops]):
                if dst != src:
                    self.copy_entry(src, dst, index)

    def copy_entry(self, src: int, dst: int, index: Tensor) -> None:
        raise NotImplementedError


class PagedStep(PoolStep):
    """The `Cache` of one step that gathers what attention reads from the pool: B sequences, n tokens each.

    `positions` [B, n]: the new tokens' positions; `blocks` [B, W]: each sequence's block table up to
    the end of this step (padded with any block; the step's mask, `key_mask`, hides what is not the
    sequence's). The new tokens' K/V go to their pool slots (`slots`, row-major); attention reads
    whole blocks (one index per block, not per token) and the first `length` rows of them. `in_place`: attend
    through the pool's kernel, when it has one (`attend`; each token sees its sequence's keys up to its
    position, so the step needs no mask: a caller whose mask hides more, the exit fill `masked`, passes False).

    A step of one sequence whose blocks lie in one run of the pool (`start`: its first slot; a long
    prompt prefilled alone on a fresh pool) reads the rows in place instead: a slice of the entry,
    the same values in the same layout as the gather, so attention gives the same bits and nothing is
    copied. A folding layout does not (its fold overwrites the rows before attention reads them).
    MELT's long prefill is the case: 500 chunk steps of 64 tokens at 32000 tokens, each attending to
    the whole prefix at every layer and loop, gathered it 96 times a step.

    Otherwise a gated (MELT) layer attends to the same rows at every loop but the step's own, which each
    loop overwrites. So when the gathered rows of all shared layers fit in `KEEP_BYTES`, the step keeps
    each layer's gathered rows from loop 1 and later loops write only the new rows into them: one
    gather per layer instead of one per layer and loop (on the CPU the gathers were a quarter of a
    long-tailed MELT workload's time). Larger steps gather at every loop, so a step never holds more
    than `KEEP_BYTES` beyond one layer's rows.
    """

    def __init__(
        self,
        pool: BlockPool,
        positions: Tensor,
        blocks: Tensor,
        length: int,
        start: int | None = None,
        in_place: bool = True,
    ) -> None:
        size = pool.block_size
        super().__init__(pool, positions.numel())
        self.in_place = in_place and pool.attention is not None
        self.slots = (
            blocks.gather(1, positions // size) * size + positions % size
        ).flatten()  # the new tokens', row-major
        self.positions, self.blocks, self.length = positions, blocks, length
        self.start = None if pool.layout.folds else start  # a fold overwrites the rows before attention reads them
        self.rows, self.tokens = positions.shape
        gathered = 2 * blocks.numel() * pool.block_size * pool.k[0, 0].numel() * pool.k.element_size() * pool.shared
        keeps = pool.latent is not None and gathered <= KEEP_BYTES and not self.in_place and self.start is None
        self.kept: dict[int, tuple[Tensor, Tensor]] | None = {} if keeps else None
        if self.kept is not None:  # with `positions`: where the new rows go in kept K/V
            self.row_index = torch.arange(self.rows, device=positions.device)[:, None]

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        """Write the step's rows, read what attention sees (gathered); a folding layout's loop >= 1 then writes the fold
        over them (the step's tokens attend to this loop's K/V, later steps read the fold; a gather reads a copy)."""
        return self._through(layer, loop, k, v, self._gathered)

    def attend(self, layer: int, loop: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """`update` and attention in one: the kernel reads the entry's blocks where they lie (`in_place`).
        q [B, H, n, D] -> [B, n, H, D]."""
        pool, attention = self.pool, self.pool.attention
        assert attention is not None  # `in_place`
        return self._through(
            layer,
            loop,
            k,
            v,
            lambda entry, *_: attention(
                q,
                pool.k_entries[entry],
                pool.v_entries[entry],
                self.blocks,
                self.positions,
                block_size=pool.block_size,
                kv_dtype=pool.format.name,
            ),
        )

    def _through(
        self, layer: int, loop: int, k: Tensor, v: Tensor, read: Callable[[int, Tensor, Tensor], Read]
    ) -> Read:
        """Write the step's rows k, v [B, Hkv, n, D] to (layer, loop)'s entry, `read(entry, k, v as stored)`, and under a
        folding layout's loop >= 1 write the fold over the rows after the read."""
        entry, pool = self.pool.entries[layer][loop], self.pool
        k_new, v_new = k.transpose(1, 2), v.transpose(1, 2)  # [B, n, Hkv, D]
        folding = loop and pool.layout.folds
        if folding:
            old_k, old_v = (
                self._own(pool.k_entries[entry]).view(k_new.shape),
                self._own(pool.v_entries[entry]).view(v_new.shape),
            )
        out = read(entry, *self._write(entry, k_new, v_new))
        if folding:
            self._write(entry, pool.layout.fold(old_k, k_new, loop), pool.layout.fold(old_v, v_new, loop))
        return out

    def _gathered(self, entry: int, k_packed: Tensor, v_packed: Tensor) -> tuple[Tensor, Tensor]:
        """The entry's rows of every sequence, gathered (or the kept ones, the step's new rows written in), dequantized
        as [B, Hkv, length, D]."""
        pool = self.pool
        kept = None if self.kept is None else self.kept.get(entry)
        if self.start is not None:  # one run of blocks: the rows where they lie
            rows = slice(self.start, self.start + self.length)
            kept = pool.k_entries[entry][rows].unsqueeze(0), pool.v_entries[entry][rows].unsqueeze(0)
        elif kept is None:
            kept = (self._read(pool.k[entry]), self._read(pool.v[entry]))
            if self.kept is not None:
                self.kept[entry] = kept
        else:
            kept[0][self.row_index, self.positions] = k_packed
            kept[1][self.row_index, self.positions] = v_packed
        return pool.format.unpack(kept[0], pool.dtype).transpose(1, 2), pool.format.unpack(
            kept[1], pool.dtype
        ).transpose(1, 2)

    def _write(self, entry: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Rows k, v [B, n, Hkv, D] into the step's slots of `entry`, as stored (returned)."""
        pool = self.pool
        k, v = pool.format.pack_pair(k, v)
        pool.k_entries[entry].index_copy_(0, self.slots, k.flatten(0, 1))
        pool.v_entries[entry].index_copy_(0, self.slots, v.flatten(0, 1))
        return k, v

    def _own(self, rows: Tensor) -> Tensor:
        """The step's tokens' rows of one entry [B * n, Hkv, D], dequantized: what a folding layout's loop reads."""
        return self.pool.format.unpack(rows.index_select(0, self.slots), self.pool.dtype)

    def narrow(self, index: Tensor) -> PagedStep:
        """The step of rows `index` only (a decode step's still-looping rows)."""
        step = PagedStep(self.pool, self.positions[index], self.blocks[index], self.length, in_place=self.in_place)
        step.in_flight, step.index = self.in_flight, index
        return step

    def copy_entry(self, src: int, dst: int, index: Tensor) -> None:
        """Entry `dst` of rows `index`'s new tokens from entry `src` (a decode step: one token per row)."""
        slots = self.slots[index]
        for store in (self.pool.k_entries, self.pool.v_entries):
            store[dst].index_copy_(0, slots, store[src].index_select(0, slots))

    def _read(self, rows: Tensor) -> Tensor:
        """[slots, Hkv, D] -> each sequence's first `length` rows [B, length, Hkv, D], gathered by block."""
        b, w = self.blocks.shape
        blocks = rows.view(-1, self.pool.block_size * rows[0].numel()).index_select(
            0, self.blocks.flatten()
        )  # index_select: faster than [] on CPU
        return blocks.view(b, w * self.pool.block_size, *rows.shape[1:])[:, : self.length]
