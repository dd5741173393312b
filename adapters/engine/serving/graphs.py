"""The model runner's GPU decode path: decode steps padded to fixed shapes and captured as CUDA graphs.

A decode step of a small batch is launch-bound on a GPU: every layer of every loop is a dozen small
kernels, each costing more to launch than to run. A CUDA graph records a step's kernels once and
replays them with one launch. A graph replays fixed shapes on fixed buffers, so a step is padded
to a bucket: the batch to the next of `BATCH_BUCKETS` (the engine's cap is the last bucket), the
block table to the next power of two of blocks. Padding rows decode token 0 at position 0 into the
pool's spare block and are dropped; padding table columns point at the spare block and the mask
hides them. The slots and the mask are computed inside the graph from the positions and the table,
so a replay copies in three small tensors and reads back the last states. One graph is captured per
(batch, width) bucket on first use, all drawing on one memory pool.

Capture runs the step for real first (a warm-up on a side stream, which also writes the step's K/V:
the replay writes the same values again), so nothing in the step may allocate lazily after it: the
RoPE table is grown to the pool's longest sequence up front.

`DecodeGraphs(capture=False)` runs the same padded steps eagerly. On the CPU there is nothing to
capture and the model runner calls the unpadded step; the eager mode is how the padding is tested
there (`tests/adapters/engine/serving/test_continuous.py`), and the capture itself runs only on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from adapters.engine.model import LoopedLM, StepOutput
from adapters.engine.serving.paged import BlockPool, PagedStep, key_mask

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def bucket(value: int, sizes: list[int]) -> int:
    """The smallest size that holds `value` (sizes ascending; the last one holds everything allowed)."""
    return next(size for size in sizes if size >= value)


@dataclass
class _Graph:
    """One bucket's fixed inputs and outputs, and its graph (None when run eagerly)."""

    tokens: Tensor  # [B, 1]
    positions: Tensor  # [B, 1]
    blocks: Tensor  # [B, W]
    out: StepOutput | None = None
    graph: Any = None  # torch.cuda.CUDAGraph


class DecodeGraphs:
    """Decode steps of `model` on `pool` (which must have a spare block) at fixed, padded shapes."""

    def __init__(
        self,
        model: LoopedLM,
        pool: BlockPool,
        *,
        loops: int,
        keep_loops: bool,
        max_seqs: int,
        max_blocks: int,
        capture: bool,
    ) -> None:
        if pool.spare is None:
            raise ValueError("padded decode steps need a pool with a spare block")
        self.model, self.pool, self.loops, self.keep_loops, self.capture = model, pool, loops, keep_loops, capture
        self.spare: int = pool.spare
        limit = min(max_seqs, pool.latent_tokens if pool.latent is not None else max_seqs)
        self.batch_sizes = sorted({b for b in BATCH_BUCKETS if b < limit} | {limit})
        self.widths = sorted({1 << k for k in range(max_blocks.bit_length()) if 1 << k < max_blocks} | {max_blocks})
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.memory_pool = torch.cuda.graph_pool_handle() if capture else None
        weight = model.model.embed_tokens.weight
        model.rotary(
            torch.zeros(1, 1, dtype=torch.long, device=weight.device), weight.dtype, length=max_blocks * pool.block_size
        )

    def step(self, tokens: Tensor, positions: Tensor, blocks: Tensor) -> StepOutput:
        """One decode token for each of B rows (tokens, positions [B, 1]; blocks [B, W]): the rows' last states."""
        b, w = blocks.shape
        key = (bucket(b, self.batch_sizes), bucket(w, self.widths))
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._buffers(*key)
        self._load(entry, tokens, positions, blocks)
        if self.capture and entry.graph is None:
            self._capture(entry)
        if entry.graph is not None:
            entry.graph.replay()
        else:
            entry.out = self._run(entry)
        out = entry.out
        assert out is not None  # run or captured above
        return StepOutput(states=[s[:b] for s in out.states])

    def _load(self, entry: _Graph, tokens: Tensor, positions: Tensor, blocks: Tensor) -> None:
        """Copy a step's inputs into the bucket's buffers; padding rows and columns point at the spare block."""
        b, w = blocks.shape
        entry.tokens.zero_()[:b].copy_(tokens, non_blocking=True)
        entry.positions.zero_()[:b].copy_(positions, non_blocking=True)
        entry.blocks.fill_(self.spare)[:b, :w].copy_(blocks, non_blocking=True)

    def _run(self, entry: _Graph) -> StepOutput:
        """The padded step over the whole table width (slots and mask are computed inside the graph too)."""
        length = entry.blocks.shape[1] * self.pool.block_size
        cache = PagedStep(self.pool, entry.positions, entry.blocks, length)
        mask = None if cache.in_place else key_mask(entry.positions, length)  # the kernel masks by position itself
        return self.model.step(
            entry.tokens, entry.positions, cache, length - 1, mask, loops=self.loops, keep_loops=self.keep_loops
        )

    def _buffers(self, batch: int, width: int) -> _Graph:
        device = self.pool.k.device
        return _Graph(
            tokens=torch.zeros(batch, 1, dtype=torch.long, device=device),
            positions=torch.zeros(batch, 1, dtype=torch.long, device=device),
            blocks=torch.zeros(batch, width, dtype=torch.long, device=device),
        )

    def _capture(self, entry: _Graph) -> None:
        """Warm up on a side stream, then record the step (PyTorch's documented whole-network capture).
        The buffers hold the current step's inputs, so the warm-up's K/V writes are the step's own."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._run(entry)
        torch.cuda.current_stream().wait_stream(stream)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self.memory_pool):
            entry.out = self._run(entry)
