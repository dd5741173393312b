"""Decode rows: each running sequence's K/V gathered once into a row of its own and kept across decode steps.

The pool keeps a sequence's K/V in blocks spread over it, and on the CPU no attention kernel reads
blocks in place (torch's FlexAttention runs there only under torch.compile, at a compile per shape
and with other float rounding). Gathering every running sequence's blocks at every layer and loop of
every decode step made a continuous decode step cost well over a static one on a tiny model. So the
model runner keeps the running sequences' K/V contiguous: row i of `DecodeRows` holds running sequence
i's K/V for every entry, gathered from the pool once, when the sequence starts decoding. A decode step
(`RowsStep`) writes its new K/V to the rows, where attention reads `rows[:B, :length]` as a view (the
values a gather would give). A row goes back to the pool, the KV store that is measured, a block at
a time: when a decode step fills a sequence's block, the block's slots are copied from the row
(`write_back`, two copies per block where copying every step's tokens cost four kernels a step, 2-3%
of a tiny model's batch-1 step). So the pool holds every full block; the tokens of a sequence's
partly filled last block are in its row only, and nothing reads them from the pool: a finished or
preempted sequence frees its blocks, and a readmitted one prefills its prompt again.

Memory: entries x rows x length x one token's K/V, the length grown by doubling as sequences grow
(from `FIRST_LENGTH`, or the longest sequence's capacity when that is less). It is a working copy of
the K/V that the pool's blocks account for, as the per-step gathers it replaces were, so the KV
measures leave it out and the process's RSS shows it. Workloads whose rows would pass `LIMIT_BYTES` gather per
step instead (`DecodeRows.fits`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from adapters.engine.sampling import int_tensor
from adapters.engine.serving.paged import BlockPool, PoolStep

LIMIT_BYTES = 64 * 2**20
FIRST_LENGTH = 1024  # slots per row at first: most workloads' sequences fit without a copy


class DecodeRows:
    """K/V rows [entries, rows, length, Hkv, D] of the running sequences, row i for running sequence i."""

    def __init__(self, pool: BlockPool, rows: int, longest: int) -> None:
        self.pool, self.rows, self.longest = pool, rows, longest
        self.length = 0  # slots per row allocated so far
        self.k = self.v = torch.empty(0)
        self.k_flat: list[Tensor] = []  # per entry, [rows * length, Hkv, 1, D]: where a step writes its new tokens
        self.v_flat: list[Tensor] = []
        self.k_rows: tuple[Tensor, ...] = ()  # per row, [entries, length, Hkv, D]: what `write_back` copies from
        self.v_rows: tuple[Tensor, ...] = ()
        self.pool_k = pool.k.unflatten(
            1, (-1, pool.block_size)
        )  # [entries, blocks, block_size, Hkv, D]: where it copies to
        self.pool_v = pool.v.unflatten(1, (-1, pool.block_size))

    @staticmethod
    def fits(pool: BlockPool, rows: int, longest: int) -> bool:
        """Whether rows for `rows` sequences of up to `longest` slots stay within `LIMIT_BYTES`."""
        return 2 * pool.k.shape[0] * rows * longest * pool.k[0, 0].numel() * pool.k.element_size() <= LIMIT_BYTES

    def reserve(self, length: int) -> None:
        """Room for `length` slots per row: at first `FIRST_LENGTH` or the longest sequence's capacity if
        that is less, then doubling (each time a copy of what the rows hold)."""
        if length <= self.length:
            return
        new = max(length, 2 * self.length, min(FIRST_LENGTH, self.longest))
        shape = (self.pool.k.shape[0], self.rows, new, *self.pool.k.shape[2:])
        k, v = self.pool.k.new_zeros(shape), self.pool.v.new_zeros(shape)  # zeros: a masked slot is read, never NaN
        if self.length:
            k[:, :, : self.length], v[:, :, : self.length] = self.k, self.v
        self.k, self.v, self.length = k, v, new
        flat = (
            -1,
            shape[3],
            1,
            shape[4],
        )  # [rows * length, Hkv, 1, D]: a decode step's k [B, Hkv, 1, D] indexes in as it is
        self.k_flat, self.v_flat = [e.view(flat) for e in k.unbind(0)], [e.view(flat) for e in v.unbind(0)]
        self.k_rows, self.v_rows = k.unbind(1), v.unbind(1)

    def fill(self, row: int, blocks: list[int], written: int) -> None:
        """Row `row` from a sequence's blocks in the pool: its first `written` slots of every entry."""
        pool, size = self.pool, self.pool.block_size
        index = torch.tensor(blocks[: pool.manager.blocks_for(written)], device=pool.k.device)
        for rows, store in ((self.k, pool.k), (self.v, pool.v)):
            gathered = store.view(store.shape[0], -1, size * store[0, 0].numel()).index_select(1, index)
            rows[:, row, :written] = gathered.view(store.shape[0], -1, *store.shape[2:])[:, :written]

    def write_back(self, row: int, block: int, start: int) -> None:
        """Block `block` of the pool from row `row`'s slots `start` to `start + block_size` (a block the row has filled)."""
        size = self.pool.block_size
        self.pool_k.select(1, block).copy_(self.k_rows[row].narrow(1, start, size))
        self.pool_v.select(1, block).copy_(self.v_rows[row].narrow(1, start, size))

    def move(self, src: int, dst: int, written: int) -> None:
        """Row `src`'s first `written` slots into row `dst` (the last running sequence taking a finished one's row)."""
        self.k[:, dst, :written] = self.k[:, src, :written]
        self.v[:, dst, :written] = self.v[:, src, :written]


@dataclass(eq=False, slots=True)
class RowsInputs:
    """A decode step's inputs on the device: `tokens` [B, 1], `positions` [B, 1] and `row_slots` [B], the
    tokens' slots in the rows (row i, position p: i * length + p).

    While the running set stays the same and the rows hold the next token, the next step's inputs are these
    advanced in place (`advance`): the tokens just sampled, and every position and slot one further in one
    kernel, where building them from host lists each step cost a share of a tiny model's step. The step's
    `Cache` (`RowsStep`) is kept with them and reads one more key per step, not built anew each step.
    """

    tokens: Tensor
    place: Tensor  # [2, B, 1]: positions and row slots, advanced together; `positions` and `row_slots` are views of it
    positions: Tensor
    row_slots: Tensor
    end: int  # the keys the step attends to: the longest sequence's, with its new token
    aligned: bool  # every sequence has written as many slots (no mask needed)
    cache: RowsStep  # what the step attends through

    @classmethod
    def build(cls, rows: DecodeRows, tokens: list[int], written: list[int], device: torch.device) -> RowsInputs:
        """Inputs from the host: each sequence's next token and how many slots it has written (the rows
        reserved for them first)."""
        end = max(written) + 1
        rows.reserve(end)
        data = int_tensor(tokens + written + [i * rows.length + w for i, w in enumerate(written)], device).view(
            3, -1, 1
        )
        row_slots = data[2].view(-1)
        return cls(
            data[0],
            data[1:],
            data[1],
            row_slots,
            end,
            min(written) == end - 1,
            RowsStep(rows.pool, rows, row_slots, end),
        )

    def advance(self, sampled: Tensor) -> None:
        """The next step's inputs: the `sampled` ids [B] as tokens, positions and slots one further."""
        self.tokens = sampled.view(-1, 1)
        self.place.add_(1)
        self.end += 1
        self.cache.extend()


class RowsStep(PoolStep):
    """The `Cache` of one decode step on `DecodeRows`: one new token for each of the first B rows.

    `row_slots` [B]: the tokens' slots in the rows, flattened (row i, position p: i * rows.length + p);
    `length`: the keys attention reads (the longest sequence's, with the new token).
    """

    def __init__(self, pool: BlockPool, rows: DecodeRows, row_slots: Tensor, length: int) -> None:
        b = row_slots.shape[0]
        super().__init__(pool, b)
        self.rows, self.row_slots = rows, row_slots
        _, r, l, h, d = (
            rows.k.shape
        )  # what attention reads of an entry: its first B rows and `length` slots, [B, Hkv, L, D]
        self.size, self.stride, self.entry_stride = (b, h, length, d), (l * h * d, d, h * d, 1), r * l * h * d

    def extend(self) -> None:
        """Attention reads one more key per row: the next decode step of the same rows (their slots advanced in place)."""
        b, h, length, d = self.size
        self.size = (b, h, length + 1, d)

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        """As `PagedStep.update`: a folding layout's loop >= 1 reads a copy with the token's own loop-t K/V, then
        writes the fold of the token's loops over them."""
        entry, rows, pool = self.pool.entries[layer][loop], self.rows, self.pool
        fmt, dtype, folding = pool.format, pool.dtype, loop and pool.layout.folds
        if folding:  # the token's entry so far, dequantized
            old_k = fmt.unpack(rows.k_flat[entry].index_select(0, self.row_slots), dtype)
            old_v = fmt.unpack(rows.v_flat[entry].index_select(0, self.row_slots), dtype)
        self._write(entry, k, v)
        offset = entry * self.entry_stride
        k_all, v_all = (
            rows.k.as_strided(self.size, self.stride, offset),
            rows.v.as_strided(self.size, self.stride, offset),
        )
        unpack = fmt.unpack_copy if folding else fmt.unpack
        k_all, v_all = unpack(k_all, dtype), unpack(v_all, dtype)
        if folding:
            self._write(entry, pool.layout.fold(old_k, k, loop), pool.layout.fold(old_v, v, loop))
        return (k_all, v_all) if self.index is None else (k_all[self.index], v_all[self.index])

    def _write(self, entry: int, k: Tensor, v: Tensor) -> None:
        """One token per row, k, v [B, Hkv, 1, D], into its slot of `entry` in the rows."""
        k, v = self.pool.format.pack_pair(k, v)
        self.rows.k_flat[entry].index_copy_(0, self.row_slots, k)
        self.rows.v_flat[entry].index_copy_(0, self.row_slots, v)

    def narrow(self, index: Tensor) -> RowsStep:
        """The step of rows `index` only (the still-looping rows): their slots, and their rows read by index."""
        step = copy.copy(self)
        step.row_slots, step.index = self.row_slots[index], index
        return step

    def copy_entry(self, src: int, dst: int, index: Tensor) -> None:
        """Entry `dst` of rows `index`'s new tokens from entry `src`, in the decode rows."""
        slots = self.row_slots[index]
        for flat in (self.rows.k_flat, self.rows.v_flat):
            flat[dst].index_copy_(0, slots, flat[src].index_select(0, slots))
