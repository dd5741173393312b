"""`BlockManager`: block tables, the free list, shared blocks and the exact byte accounting the pool reports."""

from __future__ import annotations

from adapters.base import Sampling
from adapters.engine.serving.block_manager import BlockManager
from adapters.engine.serving.sequence import Sequence

BYTES, LATENT = 96, 40  # per token: K/V, and the latent of a token in flight


def seq(prompt_len: int, request: int = 0, sample: int = 0) -> Sequence:
    return Sequence(
        request=request,
        sample=sample,
        key=0,
        prompt_len=prompt_len,
        tokens=[3] * prompt_len,
        capacity=prompt_len + 8,
        sampling=Sampling(temperature=0.0, max_new_tokens=8),
    )


def test_a_sequence_holds_the_blocks_its_tokens_fill():
    manager = BlockManager(num_blocks=6, block_size=4, bytes_per_token=BYTES, latent_bytes_per_token=LATENT)
    a = seq(9)
    assert manager.blocks_for(9) == 3 and manager.blocks_for(8) == 2 and manager.blocks_for(1) == 1
    manager.hold(a, 9)
    assert a.blocks == [0, 1, 2] and list(manager.free) == [3, 4, 5]
    manager.hold(a, 12)  # the third block has room for tokens 9..12
    assert a.blocks == [0, 1, 2]
    manager.hold(a, 13)
    assert a.blocks == [0, 1, 2, 3] and manager.held_blocks == 4
    manager.deallocate(a)
    assert a.blocks == [] and manager.held_blocks == 0 and sorted(manager.free) == list(range(6))


def test_bytes_used_count_written_slots_and_allocated_count_whole_blocks():
    manager = BlockManager(num_blocks=8, block_size=4, bytes_per_token=BYTES, latent_bytes_per_token=LATENT)
    a, b = seq(6), seq(3, request=1)
    manager.hold(a, 6)
    manager.hold(b, 3)
    manager.wrote([a], 6)  # the prefills
    manager.wrote([b], 3)
    assert manager.filled[a.blocks[0]] == 4 and manager.filled[a.blocks[1]] == 2 and manager.tokens_held == 9
    assert manager.accounting() == (9 * BYTES, 3 * 4 * BYTES, 3 * 4 * BYTES)
    manager.wrote([a, b], 1)  # one decode step: a's token 7 and b's token 4
    assert (a.written, b.written, manager.tokens_held) == (7, 4, 11)
    assert manager.filled[a.blocks[1]] == 3 and manager.filled[b.blocks[0]] == 4


def test_the_latent_of_the_tokens_in_flight_counts_in_both_figures_and_the_peak():
    manager = BlockManager(num_blocks=4, block_size=4, bytes_per_token=BYTES, latent_bytes_per_token=LATENT)
    a = seq(5)
    manager.hold(a, 5)
    manager.begin_step(5)  # a 5-token prefill
    assert manager.kv_bytes_allocated == 2 * 4 * BYTES + 5 * LATENT
    manager.begin_step(1)  # decoding one token
    assert manager.kv_bytes_allocated == 2 * 4 * BYTES + LATENT
    assert manager.peak_allocated == 2 * 4 * BYTES + 5 * LATENT
    manager.reset_peak()
    assert manager.peak_allocated == manager.kv_bytes_allocated


def test_a_shared_block_is_freed_by_its_last_holder():
    manager = BlockManager(num_blocks=4, block_size=4, bytes_per_token=BYTES, latent_bytes_per_token=0)
    first, second = seq(8), seq(8, sample=1)
    manager.hold(first, 8)
    manager.wrote([first], 8)
    second.blocks = list(first.blocks)
    manager.share(second.blocks)
    assert manager.refs[:2] == [2, 2] and manager.tokens_held == 8  # a shared slot is held once
    manager.deallocate(first)
    assert manager.held_blocks == 2 and manager.tokens_held == 8
    manager.deallocate(second)
    assert manager.held_blocks == 0 and manager.tokens_held == 0


def test_a_decode_step_adds_one_slot_per_block():
    manager = BlockManager(num_blocks=4, block_size=4, bytes_per_token=BYTES, latent_bytes_per_token=0)
    a, b = seq(2), seq(3, request=1)
    manager.hold(a, 3)
    manager.hold(b, 4)
    manager.wrote([a], 2)
    manager.wrote([b], 3)
    manager.mark_one_more([a.blocks[0], b.blocks[0]])
    assert manager.filled[a.blocks[0]] == 3 and manager.filled[b.blocks[0]] == 4 and manager.tokens_held == 7
