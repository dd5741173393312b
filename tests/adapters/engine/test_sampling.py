"""What both generation paths share (`adapters.engine.sampling`): the draw, stops and the request check, on real tensors
and the tiny presets' real tokenizer."""

from __future__ import annotations

import pytest
import torch

from adapters.base import AdapterError, Sampling
from adapters.engine.io.presets import preset
from adapters.engine.io.tokenizer import char_tokenizer
from adapters.engine.model import LoopedLM
from adapters.engine.sampling import check_request, output_text, sample, stop_reason
from adapters.engine.streams import stream_rows

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


def rows(keys: list[int], step: int = 0) -> torch.Tensor:
    return torch.tensor(stream_rows(keys, [step] * len(keys)), dtype=torch.int64)


def test_greedy_is_the_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert sample(logits, Sampling(temperature=0.0), rows([1, 2])).tolist() == [1, 0]


def test_the_nucleus_keeps_the_tokens_up_to_the_one_reaching_top_p():
    """At top-p 0.6 the nucleus is {0, 1} (0.5 alone falls short, 0.5 + 0.3 reaches it): 2000 streams draw both, never 2 or 3,
    and token 0 about 0.5 / 0.8 of the time (5 standard errors of a binomial proportion: 0.054)."""
    drawn = sample(LOGITS.expand(2000, -1), Sampling(top_p=0.6), rows(list(range(2000))))
    assert set(drawn.tolist()) == {0, 1}
    assert abs((drawn == 0).float().mean().item() - 0.625) < 5 * (0.625 * 0.375 / 2000) ** 0.5


def test_a_row_s_draw_depends_on_its_stream_only():
    """The same stream and step draw the same token whatever rows sit beside it, and other steps draw anew."""
    keys = list(range(50))
    alone = [sample(LOGITS[None], Sampling(), rows([k])).item() for k in keys]
    assert sample(LOGITS.expand(50, -1), Sampling(), rows(keys)).tolist() == alone
    assert sample(LOGITS.expand(50, -1), Sampling(), rows(keys, step=1)).tolist() != alone


def test_stops_and_the_text_cut_before_the_stop():
    tok = char_tokenizer()
    ids = tok("12;34", add_special_tokens=False)["input_ids"]
    eos = {tok.eos_token_id}
    assert stop_reason(ids[:2], eos, Sampling(stop=(";",)), tok) is None
    assert stop_reason(ids[:3], eos, Sampling(stop=(";",)), tok) == "stop"
    assert stop_reason([*ids[:2], tok.eos_token_id], eos, Sampling(), tok) == "eos"
    assert output_text(ids[:3], "stop", Sampling(stop=(";",)), tok) == "12"
    assert output_text(ids, "length", Sampling(), None) is None


def test_a_request_is_checked_against_the_context_and_the_tokenizer():
    model = LoopedLM(preset("qwen3-tiny").replace(max_position=16))
    assert check_request(model, [1, 2, 3], Sampling(max_new_tokens=5), None) == 8
    assert check_request(model, [1, 2, 3], Sampling(max_new_tokens=50), None) == 16  # capped by the context
    with pytest.raises(AdapterError, match="empty prompt"):
        check_request(model, [], Sampling(), None)
    with pytest.raises(AdapterError, match="does not fit the model's context of 16"):
        check_request(model, list(range(16)), Sampling(), None)
    with pytest.raises(AdapterError, match="stop strings need a tokenizer"):
        check_request(model, [1], Sampling(stop=("\n",)), None)


def test_top_p_never_samples_outside_the_nucleus():
    probs = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])  # nucleus at 0.7: 0.4 + 0.25 + 0.15 (0.65 < 0.7)
    logits = probs.log().expand(4000, -1).contiguous()
    keys = list(range(4000))  # 4000 streams, one draw each
    rows, later = torch.tensor(stream_rows(keys, [0] * 4000)), torch.tensor(stream_rows(keys, [1] * 4000))
    drawn = sample(logits, Sampling(temperature=1.0, top_p=0.7), rows)
    assert set(drawn.tolist()) == {1, 3, 4}
    frac = torch.bincount(drawn, minlength=6).float() / 4000  # renormalised: 0.4/0.8, 0.25/0.8, 0.15/0.8
    assert abs(frac[1] - 0.5) < 0.04 and abs(frac[3] - 0.3125) < 0.04
    top_k = sample(logits, Sampling(temperature=1.0, top_p=1.0, top_k=2), later)
    assert set(top_k.tolist()) == {1, 3}
    assert sample(logits[:3], Sampling(temperature=0.0), rows[:3]).tolist() == [1, 1, 1]
