"""Static-batch generation (`generate.py`): batched vs one by one, greedy vs the full forward, seeds, stops, the context."""

from __future__ import annotations

import pytest
import torch

from adapters.base import AdapterError, Sampling
from adapters.engine.adapter import load_preset
from adapters.engine.exits import ExitPolicy
from adapters.engine.generate import generate
from adapters.engine.io.checkpoint import random_model

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["qwen3-tiny", "ouro-tiny", "melt-tiny", "coreloop-tiny"])
def test_batched_greedy_equals_one_by_one(name):
    adapter = load_preset(name, dtype="fp32", device="cpu", seed=3)
    adapter.config.eos_token_id = None
    prompts = ["1+2=", "a much longer prompt, padded less", "x", "17*3=51; 4*4="]
    batched = adapter.generate(prompts, GREEDY)
    single = [adapter.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    assert [g.prompt_tokens for g in batched] == [len(adapter.tokenizer(p)["input_ids"]) for p in prompts]
    assert len({tuple(g.token_ids) for g in batched}) > 1


@pytest.mark.numerics
def test_greedy_generation_follows_the_full_forward():
    """Each greedy MELT token is the argmax of the cache-free chunk-wise forward with the same chunks:
    the prefill's (counted back from the prompt's end: 2 + 3 + 3) then one per decoded token."""
    adapter = load_preset("melt-tiny", dtype="fp32", device="cpu", seed=5, chunk_size=3)
    adapter.config.eos_token_id, adapter.tokenizer = None, None
    prompt = [1, 10, 20, 30, 40, 50, 60, 70]
    gen = adapter.generate([prompt], GREEDY)[0]
    ids = torch.tensor([prompt + gen.token_ids[:-1]])
    with torch.no_grad():
        logits = adapter.model(ids, chunk_size=[2, 3, 3] + [1] * (len(gen.token_ids) - 1)).logits
    assert logits[0, len(prompt) - 1 :].argmax(-1).tolist() == gen.token_ids


def test_seed_reproduces_samples_and_n_is_prompt_major():
    adapter = load_preset("qwen3-tiny", dtype="fp32", device="cpu")
    adapter.config.eos_token_id = None
    s = Sampling(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=16, n=3, seed=11)
    a, b = adapter.generate(["abc", "de"], s), adapter.generate(["abc", "de"], s)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] and len(a) == 6
    assert len({tuple(g.token_ids) for g in a[:3]}) > 1  # three different samples of prompt 0
    assert [g.prompt_tokens for g in a] == [4, 4, 4, 3, 3, 3]
    c = adapter.generate(["abc", "de"], Sampling(temperature=1.0, top_p=0.9, max_new_tokens=16, n=3, seed=12))
    assert [g.token_ids for g in c] != [g.token_ids for g in a]


def test_stop_strings_eos_and_length():
    adapter = load_preset("qwen3-tiny", dtype="fp32", device="cpu", seed=2)
    free = adapter.generate(["hello"], Sampling(temperature=0, max_new_tokens=20))[0]
    assert (
        free.finish_reason == "length"
        and free.generated_tokens == 20
        and free.text == adapter.tokenizer.decode(free.token_ids)
    )
    stop = free.text[5:7]
    cut = adapter.generate(["hello"], Sampling(temperature=0, max_new_tokens=20, stop=(stop,)))[0]
    first = free.text.find(stop)
    assert cut.finish_reason == "stop" and cut.text == free.text[:first]
    assert cut.token_ids == free.token_ids[: first + len(stop)]
    adapter.config.eos_token_id = free.token_ids[3]  # make the 4th greedy token the end of sequence
    ended = adapter.generate(["hello"], Sampling(temperature=0, max_new_tokens=20))[0]
    assert (
        ended.finish_reason == "eos"
        and ended.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[3]) + 1]
    )
    assert ended.prefill_seconds > 0 and ended.decode_seconds > 0


def test_context_limit_and_prompt_errors():
    adapter = load_preset("qwen3-tiny", dtype="fp32", device="cpu")
    adapter.config.eos_token_id = None
    gen = adapter.generate([[1] * 500], Sampling(temperature=0, max_new_tokens=100))[0]
    assert gen.finish_reason == "length" and gen.prompt_tokens + gen.generated_tokens == adapter.max_context
    with pytest.raises(AdapterError, match="context"):
        adapter.generate([[1] * 600], GREEDY)
    with pytest.raises(AdapterError, match="vocabulary"):
        adapter.generate([[1, 500]], GREEDY)


def test_generate_function_pads_left_and_reports_counts():
    model = random_model("qwen3-tiny", 1, torch.float32, "cpu")
    gens = generate(model, [[1, 5], [1, 5, 6, 7, 8]], GREEDY, loops=1, eos_ids=set(), exit_policy=ExitPolicy())
    assert [g.prompt_tokens for g in gens] == [2, 5] and all(g.generated_tokens == 12 for g in gens)
