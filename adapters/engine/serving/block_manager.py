"""Block bookkeeping of the paged KV pool: block tables, the free list, reference counts, bytes held.

No tensors here (`adapters.engine.serving.paged.BlockPool` holds them): the manager answers the policy's
questions (how many blocks are free, how many a prompt needs) and keeps the exact accounting that
`EngineAdapter.memory` reads through the pool. Blocks are reference-counted, so the n samples of one
prompt share its full prefilled blocks. A sequence holds only the blocks its tokens fill, as they fill.

Accounting, exact (`adapters.engine.memory.analytic_terms` gives the same coefficients):
- `kv_bytes_used`: tokens held (each slot written once, shared blocks once) x bytes per token, plus
  the latent of the tokens in flight (MELT's h, and the history buffer of history injection, which
  `Backbone.run` keeps as activations);
- `kv_bytes_allocated`: blocks held x block_size x bytes per token, plus the same latent.
(`BlockPool.kv_bytes_reserved`, the tensors themselves, is the pool's.)
"""

from __future__ import annotations

import threading
from collections import deque

from adapters.engine.serving.sequence import Sequence


class BlockManager:
    """`num_blocks` blocks of `block_size` slots: which are free, who holds them, how full they are."""

    def __init__(self, num_blocks: int, block_size: int, bytes_per_token: int, latent_bytes_per_token: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.bytes_per_token, self.latent_bytes_per_token = bytes_per_token, latent_bytes_per_token
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.filled = [0] * num_blocks  # slots written in each block
        self.tokens_held = 0  # sum of `filled` over held blocks
        self.in_flight = 0  # tokens of the current step (their latent state is live)
        self.peak_allocated = 0
        self.lock = threading.Lock()  # the counters change in the generate thread and are read in the sampler's

    # ------------------------------------------------------------------------------ sequences
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def hold(self, seq: Sequence, tokens: int) -> None:
        """`seq` holds blocks for its first `tokens` tokens (new blocks taken from the free list)."""
        for _ in range(self.blocks_for(tokens) - len(seq.blocks)):
            seq.blocks.append(self.allocate())

    def deallocate(self, seq: Sequence) -> None:
        """`seq` gives its blocks back (a shared block is freed by its last holder)."""
        self.release(seq.blocks)
        seq.blocks = []

    def wrote(self, seqs: list[Sequence], n: int) -> None:
        """Each of `seqs` has written its next `n` tokens into its blocks."""
        size, updates = self.block_size, []
        for seq in seqs:
            begin = seq.written
            seq.written += n
            updates += [
                (seq.blocks[b], min(size, seq.written - b * size))
                for b in range(begin // size, (seq.written - 1) // size + 1)
            ]
        self.mark_written(updates)

    # --------------------------------------------------------------------------------- blocks
    def allocate(self) -> int:
        with self.lock:
            block = self.free.popleft()
            self.refs[block], self.filled[block] = 1, 0
            self.peak_allocated = max(self.peak_allocated, self.kv_bytes_allocated)
        return block

    def share(self, blocks: list[int]) -> None:
        for block in blocks:
            self.refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        with self.lock:
            for block in blocks:
                self.refs[block] -= 1
                if self.refs[block] == 0:
                    self.tokens_held -= self.filled[block]
                    self.free.append(block)

    def mark_written(self, updates: list[tuple[int, int]]) -> None:
        """Each (block, filled): the block now holds `filled` slots (writes only ever extend a block)."""
        with self.lock:
            for block, filled in updates:
                self.tokens_held += filled - self.filled[block]
                self.filled[block] = filled

    def mark_one_more(self, blocks: list[int]) -> None:
        """Each of `blocks` holds one more slot (a decode step's: one token per sequence)."""
        with self.lock:
            for block in blocks:
                self.filled[block] += 1
            self.tokens_held += len(blocks)

    def begin_step(self, tokens: int) -> None:
        """A step of `tokens` tokens starts: their latent state (MELT's h, the history buffer) is live."""
        if tokens == self.in_flight:  # decode steps of an unchanged batch: nothing to update
            return
        with self.lock:
            self.in_flight = tokens
            self.peak_allocated = max(self.peak_allocated, self.kv_bytes_allocated)

    # ----------------------------------------------------------------------------- accounting
    def reset_peak(self) -> None:
        """The peak starts again from what is allocated now (`EngineAdapter.reset_memory_peak`)."""
        with self.lock:
            self.peak_allocated = self.kv_bytes_allocated

    def accounting(self) -> tuple[int, int, int]:
        """(kv_bytes_used, kv_bytes_allocated, peak_allocated) read together: another thread's reading never
        falls between two counter updates (used <= allocated <= peak always holds in it)."""
        with self.lock:
            return self.kv_bytes_used, self.kv_bytes_allocated, self.peak_allocated

    @property
    def held_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def latent_bytes(self) -> int:
        return self.latent_bytes_per_token * self.in_flight

    @property
    def kv_bytes_used(self) -> int:
        return self.tokens_held * self.bytes_per_token + self.latent_bytes

    @property
    def kv_bytes_allocated(self) -> int:
        return self.held_blocks * self.block_size * self.bytes_per_token + self.latent_bytes
