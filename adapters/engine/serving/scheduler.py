"""The continuous-batching policy: which sequences wait, which run, who is admitted and who is preempted.

Every sample of every request is a `Sequence`. Sequences wait in a queue; the running set, at most
`max_seqs` of them, decodes one token each per step. A sequence that finishes leaves at once and its
blocks return to the pool, and waiting ones are admitted in its place: the n samples of one prompt
in one group, whose prompt is prefilled once and whose full blocks they then share.

When a running sequence needs a block and the pool has none, the youngest running sequence is
preempted: its blocks are freed and it waits at the head of the queue. On readmission its prompt is
prefilled again and its generated tokens are fed back one per step (as they were first decoded, so
a MELT latent sees the same chunks) without sampling, after which it samples on. Its random stream
is keyed by (request seed, sample index, token index) (`streams.stream_key`, `exponential_noise`),
so its output is the same as if it had never been preempted, and the same at any concurrency.

The policy decides from the block manager's answers alone (free blocks, blocks a prompt needs) and
holds no tensors; `adapters.engine.serving.continuous` runs what it decides.
"""

from __future__ import annotations

from collections import deque
from itertools import count
from collections.abc import Callable

from adapters.engine.serving.block_manager import BlockManager
from adapters.engine.serving.sequence import Sequence


class Scheduler:
    """The waiting queue and the running set (in the order of their decode rows) over one block manager.

    `on_leave(row, last_row, last)`: a sequence left the running set at `row`, and the last running one,
    `last`, moved there from `last_row` (the same row when the leaver was the last).
    """

    def __init__(self, manager: BlockManager, max_seqs: int, on_leave: Callable[[int, int, Sequence], None]) -> None:
        self.manager, self.max_seqs, self.on_leave = manager, max_seqs, on_leave
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.admissions = count()
        self.preemptions = 0

    def admit(self) -> list[list[Sequence]]:
        """Waiting groups taken while the cap and the pool allow, keeping a block of headroom per running sequence."""
        groups, room, free = [], self.max_seqs - len(self.running), len(self.manager.free) - len(self.running)
        while self.waiting and room > 0:
            group, need = self._group(room, free)
            if not group:
                break
            for _ in group:
                self.waiting.popleft()
            groups.append(group)
            room, free = room - len(group), free - need
        return groups

    def _group(self, room: int, free: int) -> tuple[list[Sequence], int]:
        """The head of the queue and its fresh siblings, as many as the room and `free` blocks allow, and the
        blocks they will hold."""
        head, size = self.waiting[0], self.manager.block_size
        siblings = [head]
        if head.fresh:
            for seq in list(self.waiting)[1:room]:
                if seq.request != head.request or not seq.fresh:
                    break
                siblings.append(seq)
        need = self.manager.blocks_for(head.prompt_len)
        if need > free:
            return [], 0
        if head.prompt_len % size:  # each further sibling copies the partly filled last block
            siblings = siblings[: 1 + free - need]
            return siblings, need + len(siblings) - 1
        return siblings, need

    def start(self, seq: Sequence) -> None:
        """`seq`, prefilled, joins the running set as its youngest member."""
        seq.order = next(self.admissions)
        self.running.append(seq)

    def provision(self) -> None:
        """A slot for every running sequence's next token, oldest first, preempting the youngest when the pool is empty."""
        full = [seq for seq in self.running if seq.written == len(seq.blocks) * self.manager.block_size]
        for seq in sorted(full, key=lambda s: s.order) if full else ():
            while (
                not self.manager.free and seq.blocks
            ):  # a lone sequence always fits (the pool holds one at its capacity)
                self._preempt(max(self.running, key=lambda s: s.order))
            if seq.blocks:  # not preempted itself
                self.manager.hold(seq, seq.written + 1)

    def _preempt(self, seq: Sequence) -> None:
        self.finish(seq)
        seq.written = 0
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """`seq` leaves the running set and gives its blocks back; the last running sequence takes its place."""
        self.manager.deallocate(seq)
        i, last = self.running.index(seq), self.running.pop()
        if last is not seq:
            self.running[i] = last
        self.on_leave(i, len(self.running), last)
