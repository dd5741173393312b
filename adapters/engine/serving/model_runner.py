"""The model runner: a step's inputs, the model call (on the decode rows, a CUDA graph or the pool), sampling.

It owns every tensor a step touches besides the model's: the step's inputs (`StepInputs`, or the decode
rows' `RowsInputs`, advanced in place while the running set stays the same), the decode rows
(`adapters.engine.serving.rows`, the CPU's decode path) or the CUDA graphs (`adapters.engine.serving.graphs`, the GPU's),
and the draw of each sequence's next token from its own random stream (which a recurrent model's initial
states are drawn from too: the step gets each row's key). What runs is the policy's question
(`adapters.engine.serving.scheduler`); the runner only runs it and tells the block manager what it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from adapters.engine.exits import ExitPolicy
from adapters.engine.sampling import int_tensor, read_logits, sample
from adapters.engine.streams import stream_rows
from adapters.engine.serving.graphs import DecodeGraphs
from adapters.engine.model import LoopedLM, StepOutput
from adapters.engine.serving.paged import BlockPool, PagedStep, key_mask
from adapters.engine.serving.rows import DecodeRows, RowsInputs
from adapters.engine.serving.sequence import Sequence, setting


@dataclass(slots=True)
class StepInputs:
    """A step of n tokens for each of B sequences, on the model's device."""

    tokens: Tensor  # [B, n]
    positions: Tensor  # [B, n]
    blocks: Tensor  # [B, W]: each block table up to the step's end, padded with block 0 (the mask hides it)
    end: int  # the keys the step attends to: the longest sequence's, with its new tokens
    plain: bool  # plain causal attention over one sequence's rows: no mask needed
    start: int | None  # one sequence whose blocks lie in one run: its first slot (`PagedStep` reads in place)

    @classmethod
    def build(cls, seqs: list[Sequence], tokens: list[list[int]], pool: BlockPool, device: torch.device) -> StepInputs:
        """`tokens` (n per sequence) of `seqs` at their next slots in `pool`, as the device tensors a step reads."""
        n, rows = len(tokens[0]), len(seqs)
        end = max(seq.written for seq in seqs) + n
        width = pool.manager.blocks_for(end)

        def tensor(values: list[int]) -> Tensor:
            return int_tensor(values, device).view(rows, -1)

        blocks = tensor([b for seq in seqs for b in (seq.blocks + [0] * width)[:width]])
        positions = tensor([seq.written + j for seq in seqs for j in range(n)])
        inputs = tensor([t for row in tokens for t in row])
        run = seqs[0].blocks[:width]
        start = (
            run[0] * pool.block_size
            if rows == 1 and len(run) == width and run == list(range(run[0], run[0] + width))
            else None
        )
        return cls(inputs, positions, blocks, end, plain=rows == 1 and (n == 1 or seqs[0].written == 0), start=start)


class ModelRunner:
    """Runs steps of `model` on `pool` for the engine, and samples their next tokens."""

    def __init__(
        self, model: LoopedLM, pool: BlockPool, *, loops: int, policy: ExitPolicy, graphs: DecodeGraphs | None
    ) -> None:
        self.model, self.pool, self.manager, self.loops, self.policy, self.graphs = (
            model,
            pool,
            pool.manager,
            loops,
            policy,
            graphs,
        )
        self.keep_loops = policy.reads_loops(bool(model.coda))
        self.device = model.model.embed_tokens.weight.device
        self.rows: DecodeRows | None = None
        self.next_inputs: RowsInputs | None = None  # the next decode step's, while the running set stays the same

    def use_rows(self, rows: int, longest: int) -> None:
        """Decode on rows for `rows` sequences of up to `longest` tokens when there are no graphs, no attention kernel
        (which reads the blocks in place: rows would be a copy) and they fit."""
        if self.graphs is None and self.pool.attention is None and DecodeRows.fits(self.pool, rows, longest):
            self.rows = DecodeRows(self.pool, rows, longest)

    # ------------------------------------------------------------------------- the running set
    def start(self, row: int, seq: Sequence) -> None:
        """`seq` joins the running set at `row`: its decode row filled from its blocks."""
        self.next_inputs = None
        if self.rows is not None:
            self.rows.reserve(seq.written)
            self.rows.fill(row, seq.blocks, seq.written)

    def leave(self, row: int, last_row: int, last: Sequence) -> None:
        """A sequence left the running set at `row`; the one at `last_row` (`last`) takes its place and its decode row."""
        self.next_inputs = None
        if self.rows is not None and last_row != row:
            self.rows.move(last_row, row, last.written)

    # ----------------------------------------------------------------------------------- steps
    def decode(self, seqs: list[Sequence]) -> StepOutput:
        """One token per running sequence (row i is `seqs[i]`): the one after its written ones."""
        if self.rows is not None:
            return self.rows_step(seqs)
        return self.step(seqs, [[seq.tokens[seq.written]] for seq in seqs], decoding=True)

    def step(self, seqs: list[Sequence], tokens: list[list[int]], decoding: bool = False) -> StepOutput:
        """Run `tokens` (n per sequence) of `seqs` through the model; their blocks hold them afterwards.

        A step of one token per sequence goes through `graphs` when there is one (the GPU path); other
        steps gather from the pool. (Decode steps on the decode rows are `rows_step`.) Only a `decoding`
        step applies a skipping exit policy: a prompt's tokens run every loop, a one-token chunk too.
        """
        x, n = StepInputs.build(seqs, tokens, self.pool, self.device), len(tokens[0])
        self.manager.begin_step(len(seqs) * n)
        if self.graphs is not None and n == 1:
            out = self.graphs.step(x.tokens, x.positions, x.blocks)
        else:
            ran = self.ran_keys(seqs, x.end) if decoding else None
            cache = PagedStep(
                self.pool, x.positions, x.blocks, x.end, x.start, in_place=ran is None
            )  # `ran` masks by loop: SDPA
            mask = None if x.plain or cache.in_place else key_mask(x.positions, x.end)
            out = self.model.step(
                x.tokens,
                x.positions,
                cache,
                x.end - n,
                mask,
                loops=self.loops,
                keep_loops=self.keep_loops,
                exits=self.policy if decoding else None,
                ran=ran,
                streams=self.draw_streams(seqs, n),
            )
        self.manager.wrote(seqs, n)
        return out

    def rows_step(self, seqs: list[Sequence]) -> StepOutput:
        """A decode step of the running set on the decode rows: its inputs are the last step's advanced
        (`RowsInputs`) or go to the device as one tensor, and a block the step fills goes back to the pool."""
        rows, manager, size = self.rows, self.manager, self.pool.block_size
        assert rows is not None  # `decode` steps on the rows only when there are some
        x = self.next_inputs
        if x is None or x.end > rows.length:  # a changed running set, or rows to grow (their row slots move)
            x = RowsInputs.build(
                rows, [seq.tokens[seq.written] for seq in seqs], [seq.written for seq in seqs], self.device
            )
        manager.begin_step(len(seqs))
        mask = None if x.aligned else key_mask(x.positions, x.end)  # None: every row sees every key
        out = self.model.step(
            x.tokens,
            x.positions,
            x.cache,
            x.end - 1,
            mask,
            loops=self.loops,
            keep_loops=self.keep_loops,
            exits=self.policy,
            ran=self.ran_keys(seqs, x.end),
            streams=self.draw_streams(seqs, 1),
        )
        self.next_inputs = x
        blocks = []
        for i, seq in enumerate(seqs):
            block, seq.written = seq.blocks[seq.written // size], seq.written + 1
            blocks.append(block)
            if seq.written % size == 0:
                rows.write_back(i, block, seq.written - size)
        manager.mark_one_more(blocks)
        return out

    def ran_keys(self, seqs: list[Sequence], end: int) -> Tensor | None:
        """Under the fill `masked`, [B, end]: the loops the token at each slot of each sequence ran (prompt tokens
        and the token in flight: all; a generated token: its decode step's, the loops of the token drawn from it)."""
        if not (self.policy.skips and self.policy.fill == "masked"):
            return None
        rows = []
        for seq in seqs:
            ran = [self.loops] * seq.prompt_len + seq.loops[1 : seq.written - seq.prompt_len + 1] + [self.loops]
            rows += ran + [self.loops] * (end - len(ran))
        return self.tensor(rows).view(len(seqs), end)

    def draw_streams(self, seqs: list[Sequence], n: int) -> Tensor | None:
        """[B, n]: the stream each of the step's tokens draws its initial state from (`Sequence.draw_key`, `LoopedLM.step`)
        when the model draws one, else None."""
        if not self.model.draws_state:
            return None
        return self.tensor([seq.draw_key(seq.written + j) for seq in seqs for j in range(n)]).view(len(seqs), n)

    def advance(self, ids: Tensor | None) -> None:
        """The next decode step's inputs from this one's and the `ids` [B] just sampled (while the running set stays
        the same); None: not these ids (a sequence replays its tokens), so the next step builds them afresh."""
        if ids is None:
            self.next_inputs = None
        elif self.next_inputs is not None:
            self.next_inputs.advance(ids)

    # -------------------------------------------------------------------------------- sampling
    def logits(self, out: StepOutput) -> tuple[Tensor, Tensor | None]:
        """Each row's next-token logits and, under an exit policy, the loop they come from."""
        return read_logits(self.model, out, self.policy)

    def tensor(self, values: list[int]) -> Tensor:
        """Host ints on the model's device (`int_tensor`)."""
        return int_tensor(values, self.device)


def sample_next(seqs: list[Sequence], logits: Tensor, one_setting: bool, device: torch.device) -> Tensor:
    """Each sequence's next token [B] (on `device`) from its stream at its token index: one `sample` per distinct setting."""
    rows = stream_rows(
        [seq.key for seq in seqs], [len(seq.tokens) - seq.prompt_len for seq in seqs]
    )  # each its token index
    if one_setting:
        return sample(logits, seqs[0].sampling, int_tensor(rows, device))
    groups: dict[tuple[float, float, int | None], list[int]] = {}
    for i, seq in enumerate(seqs):
        groups.setdefault(setting(seq.sampling), []).append(i)
    ids = torch.empty(len(seqs), dtype=torch.long, device=device)
    for members in groups.values():
        index = int_tensor(members, device)
        ids[index] = sample(logits[index], seqs[members[0]].sampling, int_tensor([rows[i] for i in members], device))
    return ids
