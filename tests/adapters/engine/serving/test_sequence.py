"""`Sequence`: what the scheduler asks of one sample (fresh, replaying, which stream a token draws from)."""

from __future__ import annotations

from adapters.base import Sampling
from adapters.engine.serving.sequence import Sequence, setting

GREEDY = Sampling(temperature=0.0, max_new_tokens=4)


def sequence(tokens: list[int], prompt_len: int, written: int = 0) -> Sequence:
    return Sequence(
        request=0,
        sample=0,
        key=11,
        prompt_len=prompt_len,
        tokens=tokens,
        capacity=prompt_len + 4,
        sampling=GREEDY,
        prompt_key=7,
        written=written,
    )


def test_fresh_until_it_generates():
    seq = sequence([5, 6, 7], prompt_len=3)
    assert seq.fresh
    seq.tokens.append(9)
    assert not seq.fresh


def test_a_readmitted_sequence_replays_the_tokens_its_blocks_lost():
    seq = sequence([5, 6, 7, 9, 10], prompt_len=3, written=5)
    assert not seq.replaying
    seq.written = 3  # preempted, then its prompt prefilled again
    assert seq.replaying
    seq.written = 4
    assert seq.replaying  # token 10 is still to be fed back


def test_prompt_tokens_draw_from_the_prompt_stream_and_new_ones_from_the_sample_s():
    seq = sequence([5, 6, 7, 9], prompt_len=3)
    assert [seq.draw_key(p) for p in range(4)] == [7, 7, 7, 11]


def test_setting_groups_what_one_sample_call_shares():
    a = Sampling(temperature=0.7, top_p=0.9, top_k=None, max_new_tokens=4, seed=1)
    b = Sampling(temperature=0.7, top_p=0.9, top_k=None, max_new_tokens=9, seed=2)  # length and seed are per sequence
    assert setting(a) == setting(b) == (0.7, 0.9, None)
    assert setting(Sampling(temperature=0.7, top_p=0.9, top_k=5)) != setting(a)
