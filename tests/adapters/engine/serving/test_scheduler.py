"""The continuous-batching policy (`Scheduler`) on its own: admission under the cap and the pool, sibling groups,
preemption of the youngest, and row bookkeeping when a sequence leaves.

As vLLM's tests/core/test_scheduler.py drives its scheduler over a block manager with a handful of blocks and no
model, these drive the policy over a `BlockManager` of a few blocks: it holds no tensors, so the real one is as
cheap as a fake and its answers (free blocks, blocks a prompt needs) are the ones the engine gets.
"""

from __future__ import annotations

from adapters.base import Sampling
from adapters.engine.serving.block_manager import BlockManager
from adapters.engine.serving.scheduler import Scheduler
from adapters.engine.serving.sequence import Sequence

SAMPLING = Sampling(temperature=1.0, max_new_tokens=8, seed=0)


def sequences(request: int, prompt_len: int, n: int = 1) -> list[Sequence]:
    return [
        Sequence(
            request=request,
            sample=i,
            key=i,
            prompt_len=prompt_len,
            tokens=[4] * prompt_len,
            capacity=prompt_len + 8,
            sampling=SAMPLING,
        )
        for i in range(n)
    ]


def scheduler(num_blocks: int, max_seqs: int, block_size: int = 4) -> tuple[Scheduler, list[tuple[int, int, int]]]:
    """A scheduler over `num_blocks` blocks, and the (row, last_row, request) of every `on_leave` call."""
    left: list[tuple[int, int, int]] = []
    manager = BlockManager(num_blocks, block_size, bytes_per_token=8, latent_bytes_per_token=0)
    return Scheduler(manager, max_seqs, lambda row, last_row, last: left.append((row, last_row, last.request))), left


def run(s: Scheduler, groups: list[list[Sequence]]) -> None:
    """What the engine does with admitted groups: hold each prompt's blocks, prefill it, start its sequences."""
    for group in groups:
        for seq in group:
            s.manager.hold(seq, seq.prompt_len)
            s.manager.wrote([seq], seq.prompt_len)
            s.start(seq)


def test_admission_stops_at_the_cap():
    s, _ = scheduler(num_blocks=32, max_seqs=2)
    s.waiting.extend(sequences(0, 4) + sequences(1, 4) + sequences(2, 4))
    groups = s.admit()
    assert [[seq.request for seq in g] for g in groups] == [[0], [1]]
    run(s, groups)
    assert s.admit() == [] and [seq.request for seq in s.waiting] == [2]


def test_a_prompt_s_fresh_samples_are_admitted_as_one_group():
    s, _ = scheduler(num_blocks=32, max_seqs=8)
    s.waiting.extend(sequences(0, 8, n=3) + sequences(1, 8, n=2))
    groups = s.admit()
    assert [[(seq.request, seq.sample) for seq in g] for g in groups] == [[(0, 0), (0, 1), (0, 2)], [(1, 0), (1, 1)]]


def test_siblings_of_a_partly_filled_last_block_need_a_block_each():
    """A 6-token prompt on blocks of 4 needs 2 blocks, and each further sample copies the half-full second one:
    with 3 blocks free, the head and one sibling fit, and the third sample waits."""
    s, _ = scheduler(num_blocks=3, max_seqs=8)
    s.waiting.extend(sequences(0, 6, n=3))
    groups = s.admit()
    assert [[seq.sample for seq in g] for g in groups] == [[0, 1]]
    assert [seq.sample for seq in s.waiting] == [2]


def test_admission_keeps_a_block_of_headroom_per_running_sequence():
    s, _ = scheduler(num_blocks=5, max_seqs=8)
    s.waiting.extend(sequences(0, 8))
    run(s, s.admit())  # 2 blocks held, 3 free
    s.waiting.extend(sequences(1, 8) + sequences(2, 4))
    # 3 free minus 1 of headroom for the running sequence: request 1's 2 blocks fit, then none is left for request 2
    assert [[seq.request for seq in g] for g in s.admit()] == [[1]]
    assert [seq.request for seq in s.waiting] == [2]


def test_a_full_pool_preempts_the_youngest_which_waits_at_the_head():
    s, _ = scheduler(num_blocks=2, max_seqs=4)
    old, young = sequences(0, 4)[0], sequences(1, 4)[0]
    s.waiting.extend([old, young])
    run(s, s.admit())  # one block each, both full, none free
    s.waiting.append(sequences(2, 4)[0])
    s.provision()  # the oldest's next token needs a block: the youngest gives its own back
    assert s.running == [old] and s.preemptions == 1
    assert [seq.request for seq in s.waiting] == [1, 2]
    assert young.blocks == [] and young.written == 0 and len(old.blocks) == 2


def test_the_oldest_is_provisioned_first_and_a_sequence_with_room_takes_no_block():
    s, _ = scheduler(num_blocks=4, max_seqs=4)
    roomy, old, young = sequences(0, 5)[0], sequences(1, 4)[0], sequences(2, 4)[0]
    s.waiting.extend([roomy, old, young])
    run(s, s.admit())  # 2 + 1 + 1 blocks: the pool is empty
    s.provision()  # old and young are full; roomy has 3 free slots in its second block
    assert s.running == [roomy, old] and s.preemptions == 1 and young.blocks == []
    assert len(roomy.blocks) == 2 and len(old.blocks) == 2


def test_a_leaver_s_row_is_taken_by_the_last_running_sequence():
    s, left = scheduler(num_blocks=32, max_seqs=4)
    s.waiting.extend(sequences(0, 4) + sequences(1, 4) + sequences(2, 4))
    run(s, s.admit())
    first = s.running[0]
    s.finish(first)
    assert [seq.request for seq in s.running] == [2, 1] and left == [(0, 2, 2)]
    s.finish(s.running[-1])  # the last row's leaver: nothing moves
    assert [seq.request for seq in s.running] == [2] and left[-1] == (1, 1, 1)
    assert s.manager.held_blocks == 1
