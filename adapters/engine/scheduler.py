"""Continuous batching: a queue of sequences, a running set that decodes one token per step, paged KV.

Every sample of every request is a `Sequence`. Sequences wait in a queue; the running set, at most
`max_seqs` of them, decodes one token each per step (`LoopedLM.step` on a `PagedStep`). A sequence
that finishes leaves at once and its blocks return to the pool, and waiting ones are admitted in
its place: the n samples of one prompt are prefilled once (chunked for MELT exactly as the static
path: chunks counted back from the prompt's end) and then share its full blocks.

When a running sequence needs a block and the pool has none, the youngest running sequence is
preempted: its blocks are freed and it waits at the head of the queue. On readmission its prompt is
prefilled again and its generated tokens are fed back one per step (as they were first decoded, so
a MELT latent sees the same chunks) without sampling, after which it samples on. Its random stream
is keyed by (request seed, sample index, token index) (`generate.stream_key`, `exponential_noise`),
so its output is the same as if it had never been preempted, and the same at any concurrency.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Callable

import torch
from torch import Tensor

from adapters.base import Finished, Generation, Sampling
from adapters.engine.generate import ExitPolicy, int_tensor, is_looped, output_text, read_logits, sample, stop_reason, stream_rows
from adapters.engine.graphs import DecodeGraphs
from adapters.engine.model import LoopedLM, StepOutput, prefill_chunks
from adapters.engine.paged import BlockPool, PagedStep, key_mask
from adapters.engine.rows import DecodeRows, RowsInputs, RowsStep


@dataclass(eq=False, slots=True)
class Sequence:
    """One sample of one request: its tokens (prompt, then generated), its blocks and how far they are written."""

    request: int  # index of its request in the workload
    sample: int  # sample index within the request
    key: int  # its random stream (`stream_key(request seed, sample)`)
    prompt_len: int
    tokens: list[int]
    capacity: int  # prompt + new tokens it may reach (within the context)
    sampling: Sampling
    blocks: list[int] = field(default_factory=list)
    written: int = 0  # tokens whose K/V the blocks hold
    order: int = -1  # admission order: the largest is the youngest, preempted first
    loops: list[int] = field(default_factory=list)
    finish: str | None = None
    prefill_seconds: float = 0.0
    decode_began: float = 0.0

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def fresh(self) -> bool:
        """Nothing generated yet: a first admission, which may share its prompt's prefill with its siblings."""
        return len(self.tokens) == self.prompt_len


def setting(sampling: Sampling) -> tuple[float, float, int | None]:
    """What one `sample` call must share: sequences with other settings are drawn in calls of their own."""
    return sampling.temperature, sampling.top_p, sampling.top_k


class Scheduler:
    """Runs sequences to completion on one block pool, reporting each step's finished samples."""

    def __init__(self, model: LoopedLM, pool: BlockPool, *, loops: int, policy: ExitPolicy, eos_ids: set[int],
                 tokenizer: Any | None, max_seqs: int, on_finished: Callable[[list[Finished]], None],
                 graphs: DecodeGraphs | None = None) -> None:
        self.model, self.pool, self.loops, self.policy = model, pool, loops, policy
        self.eos_ids, self.tokenizer, self.max_seqs, self.on_finished = eos_ids, tokenizer, max_seqs, on_finished
        self.graphs = graphs
        self.device = model.model.embed_tokens.weight.device
        self.chunk = model.config.chunk_size if model.config.gated else None
        self.looped = is_looped(model, loops)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in the order of their decode rows (`rows`), when there are rows
        self.rows: DecodeRows | None = None
        self.next_inputs: RowsInputs | None = None  # the next decode step's, while the running set stays the same
        self.prefilling: list[Sequence] = []  # admitted, holding blocks, not yet running
        self.admissions = count()
        self.preemptions = 0
        self.one_setting = True  # every sequence samples with the same temperature, top-p and top-k

    def run(self, sequences: list[Sequence]) -> None:
        self.waiting.extend(sequences)
        self.one_setting = len({setting(seq.sampling) for seq in sequences}) == 1
        rows, longest = min(self.max_seqs, len(sequences)), max(seq.capacity for seq in sequences)
        if self.graphs is None and DecodeRows.fits(self.pool, rows, longest):
            self.rows = DecodeRows(self.pool, rows, longest)
        with torch.inference_mode():
            while self.waiting or self.running:
                if self.waiting:
                    self._admit()
                if self.running:
                    self._decode()

    # ----------------------------------------------------------------------------- admission
    def _admit(self) -> None:
        """Take waiting groups while the cap and the pool allow (keeping a block of headroom per running
        sequence), then prefill them together."""
        groups, room, free = [], self.max_seqs - len(self.running), len(self.pool.free) - len(self.running)
        while self.waiting and room > 0:
            group, need = self._group(room, free)
            if not group:
                break
            for _ in group:
                self.waiting.popleft()
            groups.append(group)
            room, free = room - len(group), free - need
        if groups:
            self._prefill(groups)

    def _group(self, room: int, free: int) -> tuple[list[Sequence], int]:
        """The head of the queue and its fresh siblings, as many as the room and `free` blocks allow, and the
        blocks they will hold."""
        head, pool = self.waiting[0], self.pool
        siblings = [head]
        if head.fresh:
            for seq in list(self.waiting)[1:room]:
                if seq.request != head.request or not seq.fresh:
                    break
                siblings.append(seq)
        need = pool.blocks_for(head.prompt_len)
        if need > free:
            return [], 0
        if head.prompt_len % pool.block_size:  # each further sibling copies the partly filled last block
            siblings = siblings[: 1 + free - need]
            return siblings, need + len(siblings) - 1
        return siblings, need

    def _prefill(self, groups: list[list[Sequence]]) -> None:
        """Prefill each group's prompt once into its first sequence's blocks, all groups together; the
        other sequences of a group share its full blocks.

        Prompts go chunk by chunk (MELT: chunks counted back from each prompt's end; otherwise the whole
        prompt is one chunk), the k-th chunks of all prompts in one step per chunk length, so a MELT
        admission of many prompts costs about as many steps as its longest prompt has chunks.
        """
        began, pool = time.perf_counter(), self.pool
        firsts = self.prefilling = [group[0] for group in groups]
        plans = [prefill_chunks(seq.prompt_len, self.chunk or seq.prompt_len) for seq in firsts]
        last: dict[int, tuple[Tensor, Tensor | None]] = {}  # group -> its prompt's next-token logits and exit loop
        for k in range(max(len(plan) for plan in plans)):
            by_length: dict[int, list[int]] = {}
            for i, plan in enumerate(plans):
                if k < len(plan):
                    by_length.setdefault(plan[k][1] - plan[k][0], []).append(i)
            for length, members in by_length.items():
                for part in self._rows_per_step(members, length):
                    for i in part:  # held as filled
                        firsts[i].blocks += [pool.allocate() for _ in range(pool.blocks_for(plans[i][k][1]) - len(firsts[i].blocks))]
                    out = self._step([firsts[i] for i in part], [firsts[i].tokens[slice(*plans[i][k])] for i in part])
                    ending = [row for row, i in enumerate(part) if k == len(plans[i]) - 1]
                    if ending:
                        logits, exit_loop = read_logits(self.model, out, self.policy)
                        last.update({part[row]: (logits[row], None if exit_loop is None else exit_loop[row]) for row in ending})
        self.prefilling = []
        ready, rows = [], []  # the first tokens of every group, drawn in one call
        for i, group in enumerate(groups):
            self._share_prompt(group, began)
            fresh = [seq for seq in group if seq.fresh]  # a readmitted sequence replays its tokens first
            ready += fresh
            rows += [i] * len(fresh)
        if ready:
            exit_loop = None if last[0][1] is None else torch.stack([last[i][1] for i in rows])
            self._sample(ready, torch.stack([last[i][0] for i in rows]), exit_loop)

    def _rows_per_step(self, members: list[int], length: int) -> list[list[int]]:
        """`members` split so one step's tokens in flight fit the pool's latent buffer (MELT's h)."""
        rows = len(members) if self.pool.latent is None else max(1, self.pool.latent_tokens // length)
        return [members[i : i + rows] for i in range(0, len(members), rows)]

    def _share_prompt(self, group: list[Sequence], began: float) -> None:
        """The group's siblings share its first sequence's full prompt blocks and copy the partly filled last one;
        each joins the running set (with its decode row filled: its prefill ends and its decode begins there)."""
        first, pool = group[0], self.pool
        self.next_inputs = None  # the running set changes
        full, tail = divmod(first.prompt_len, pool.block_size)
        for seq in group[1:]:
            pool.share(first.blocks[:full])
            seq.blocks = first.blocks[:full] + ([pool.copy(first.blocks[full], tail)] if tail else [])
            seq.written = first.prompt_len
        for seq in group:
            seq.order = next(self.admissions)
            if self.rows is not None:
                self.rows.reserve(seq.written)
                self.rows.fill(len(self.running), seq.blocks, seq.written)
            self.running.append(seq)
            seq.decode_began = time.perf_counter()
            seq.prefill_seconds = seq.decode_began - began

    # -------------------------------------------------------------------------------- decode
    def _decode(self) -> None:
        """One token per running sequence: the one after its written ones, sampled from or replayed."""
        self._provision()
        seqs = list(self.running)
        out = self._rows_step(seqs) if self.rows is not None else self._step(seqs, [[seq.tokens[seq.written]] for seq in seqs])
        ready = [i for i, seq in enumerate(seqs) if seq.written == len(seq.tokens)] if self.preemptions else None
        if ready is None or len(ready) == len(seqs):  # none is replaying tokens it decoded before a preemption
            ids = self._sample(seqs, *read_logits(self.model, out, self.policy))
            if self.next_inputs is not None:  # none finished either
                self.next_inputs.advance(ids)
            return
        self.next_inputs = None
        if ready:
            logits, exit_loop = read_logits(self.model, out, self.policy)
            rows = self._tensor(ready)
            self._sample([seqs[i] for i in ready], logits[rows], None if exit_loop is None else exit_loop[rows])

    def _provision(self) -> None:
        """A slot for every running sequence's next token, oldest first, preempting the youngest when the pool is empty."""
        size = self.pool.block_size
        full = [seq for seq in self.running if seq.written == len(seq.blocks) * size]
        for seq in sorted(full, key=lambda s: s.order) if full else ():
            while not self.pool.free and seq.blocks:  # a lone sequence always fits (the pool holds one at its capacity)
                self._preempt(max(self.running, key=lambda s: s.order))
            if seq.blocks:  # not preempted itself
                seq.blocks.append(self.pool.allocate())

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks)
        self._stop_running(seq)
        seq.blocks, seq.written = [], 0
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def _step(self, seqs: list[Sequence], tokens: list[list[int]]) -> StepOutput:
        """Run `tokens` (n per sequence) of `seqs` at their next slots through the model; their blocks hold them afterwards.

        A step of one token per sequence goes through `graphs` when there is one (the GPU path); other
        steps gather from the pool. (Decode steps on the decode rows are `_rows_step`.)
        """
        pool, n = self.pool, len(tokens[0])
        end = max(seq.written for seq in seqs) + n
        width = pool.blocks_for(end)
        blocks = self._tensor([b for seq in seqs for b in (seq.blocks + [0] * width)[:width]], len(seqs))  # padded with block 0, which the mask hides
        positions = self._tensor([seq.written + j for seq in seqs for j in range(n)], len(seqs))
        inputs = self._tensor([t for row in tokens for t in row], len(seqs))
        pool.begin_step(len(seqs) * n)
        if self.graphs is not None and n == 1:
            out = self.graphs.step(inputs, positions, blocks)
        else:
            plain = len(seqs) == 1 and (n == 1 or seqs[0].written == 0)  # plain causal attention over the one sequence's rows
            out = self.model.step(inputs, positions, PagedStep(pool, positions, blocks, end), end - n,
                                  None if plain else key_mask(positions, end), self.loops, self.policy.kind != "none")
        size, written = pool.block_size, []
        for seq in seqs:
            begin = seq.written
            seq.written += n
            written += [(seq.blocks[b], min(size, seq.written - b * size)) for b in range(begin // size, (seq.written - 1) // size + 1)]
        pool.mark_written(written)
        return out

    def _rows_step(self, seqs: list[Sequence]) -> StepOutput:
        """A decode step of the running set (row i is `seqs[i]`) on the decode rows: its inputs are the last
        step's advanced (`RowsInputs`) or go to the device as one tensor, and a block the step fills goes back to the pool."""
        size, rows, pool = self.pool.block_size, self.rows, self.pool
        step = self.next_inputs
        if step is None or step.end > rows.length:  # a changed running set, or rows to grow (their row slots move)
            step = RowsInputs.build(rows, [seq.tokens[seq.written] for seq in seqs], [seq.written for seq in seqs], self.device)
        pool.begin_step(len(seqs))
        mask = None if step.aligned else key_mask(step.positions, step.end)  # None: every row sees every key
        out = self.model.step(step.tokens, step.positions, RowsStep(pool, rows, step.row_slots, step.end), step.end - 1, mask,
                              self.loops, self.policy.kind != "none")
        self.next_inputs = step
        blocks = []
        for i, seq in enumerate(seqs):
            block, seq.written = seq.blocks[seq.written // size], seq.written + 1
            blocks.append(block)
            if seq.written % size == 0:
                rows.write_back(i, block, seq.written - size)
        pool.mark_one_more(blocks)
        return out

    def _tensor(self, values: list[int], rows: int | None = None) -> Tensor:
        """Host ints on the model's device (`int_tensor`), as `rows` rows when given."""
        tensor = int_tensor(values, self.device)
        return tensor if rows is None else tensor.view(rows, -1)

    # ------------------------------------------------------------------------------ sampling
    def _sample(self, seqs: list[Sequence], logits: Tensor, exit_loop: Tensor | None) -> Tensor:
        """Draw each sequence's next token from its own stream, record it, and retire the finished ones; the ids [B]."""
        drawn = self._draw(seqs, logits)
        ids = drawn.tolist()
        loops = [self.loops] * len(seqs) if exit_loop is None else exit_loop.tolist()
        done: list[Finished] = []
        for seq, token, loop in zip(seqs, ids, loops):
            seq.tokens.append(token)
            seq.loops.append(loop)
            seq.finish = stop_reason(seq.tokens, self.eos_ids, seq.sampling, self.tokenizer, start=seq.prompt_len)
            if seq.finish is None and len(seq.tokens) >= seq.capacity:  # its new tokens or the context used up
                seq.finish = "length"
            if seq.finish is not None:
                done.append((seq.request, seq.sample, self._retire(seq)))
        if done:
            self.on_finished(done)
        return drawn

    def _draw(self, seqs: list[Sequence], logits: Tensor) -> Tensor:
        """Each sequence's next token from its stream at its token index: one `sample` per distinct setting."""
        rows = stream_rows([seq.key for seq in seqs], [len(seq.tokens) - seq.prompt_len for seq in seqs])
        if self.one_setting:
            return sample(logits, seqs[0].sampling, self._tensor(rows))
        groups: dict[tuple, list[int]] = {}
        for i, seq in enumerate(seqs):
            groups.setdefault(setting(seq.sampling), []).append(i)
        ids = torch.empty(len(seqs), dtype=torch.long, device=self.device)
        for members in groups.values():
            index = self._tensor(members)
            ids[index] = sample(logits[index], seqs[members[0]].sampling, self._tensor([rows[i] for i in members]))
        return ids

    def _stop_running(self, seq: Sequence) -> None:
        """`seq` leaves the running set; the last running sequence takes its place (and its decode row)."""
        self.next_inputs = None
        i, last = self.running.index(seq), self.running.pop()
        if last is not seq:
            self.running[i] = last
            if self.rows is not None:
                self.rows.move(len(self.running), i, last.written)

    def _retire(self, seq: Sequence) -> Generation:
        self.pool.release(seq.blocks)
        self._stop_running(seq)
        seq.blocks = []
        ids = seq.tokens[seq.prompt_len :]
        return Generation(
            token_ids=ids, text=output_text(ids, seq.finish, seq.sampling, self.tokenizer), finish_reason=seq.finish,
            prompt_tokens=seq.prompt_len, generated_tokens=len(ids), loops_used=seq.loops if self.looped else None,
            prefill_seconds=seq.prefill_seconds, decode_seconds=time.perf_counter() - seq.decode_began,
        )
