"""`EngineAdapter`: loading by preset and spec, overrides, token-id prompts, the loop count and the exit policy."""

from __future__ import annotations

import pytest
import torch

import adapters
from adapters.base import AdapterError, Sampling
from adapters.engine.adapter import EngineAdapter, load_preset
from adapters.engine.io.checkpoint import random_model

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)


def test_unknown_preset_override_and_spec():

    with pytest.raises(AdapterError, match="qwen3-tiny"):
        load_preset("qwen9")
    with pytest.raises(AdapterError, match="max_batch"):
        load_preset("qwen3-tiny", beam=4)
    with pytest.raises(AdapterError, match="fp32"):
        load_preset("qwen3-tiny", dtype="int3")
    assert isinstance(adapters.load("preset:melt-tiny"), EngineAdapter)


def test_token_id_prompts_without_tokenizer():
    model = random_model("ouro-tiny", 0, torch.float32, "cpu")
    adapter = EngineAdapter("test", model, None)
    gen = adapter.generate([[1, 2, 3]], GREEDY)[0]
    assert gen.text is None and gen.generated_tokens >= 1
    with pytest.raises(AdapterError, match="token ids"):
        adapter.generate(["text"], GREEDY)


def test_loop_override_changes_output_and_cache():
    adapter = load_preset("ouro-tiny", dtype="fp32", device="cpu", loops=8)
    assert adapter.describe()["kv_bytes_per_token"] == 2 * 2 * 8 * 2 * 32 * 4
    ids = torch.tensor([[1, 4, 5, 6]])
    eight = adapter.forward_logits(ids)
    adapter.loops = 2
    assert (adapter.forward_logits(ids) - eight).abs().max() > 1e-4
    with pytest.raises(AdapterError, match="loops"):
        adapter.loops = 0
    with pytest.raises(AdapterError, match="standard"):
        load_preset("qwen3-tiny", loops=2)
    d = load_preset("melt-tiny", loops=8).describe()
    assert d["kv_strategy"] == "gated" and d["gate"] == "elementwise" and d["trained_loops"] == 4 and d["loops"] == 8
    assert d["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4 and d["config"]["shared_layers"] == 2


@pytest.mark.parametrize("fill", ["read", "copy"])
def test_exit_policies_record_loops_and_read_that_loop(fill):
    """Read semantics: every loop runs, the policy's loop is read. A fixed loop reads the same under `copy`, which
    skips the later loops: loop 2 attends only to loops 1 and 2's K/V, which `copy` leaves as they are."""
    adapter = load_preset("ouro-tiny", dtype="fp32", device="cpu", exit_policy="fixed", exit_loop=2, exit_fill=fill)
    adapter.config.eos_token_id = None
    prompt = [1, 11, 12, 13]
    gen = adapter.generate([prompt], Sampling(temperature=0, max_new_tokens=6))[0]
    assert gen.loops_used == [2] * 6
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        loop2 = adapter.model(ids, return_loop_logits=True).loop_logits[1]
    assert loop2[0, len(prompt) - 1 : -1].argmax(-1).tolist() == gen.token_ids
    thr = load_preset(
        "ouro-tiny", dtype="fp32", device="cpu", exit_policy="threshold", exit_threshold=0.5, exit_fill="read"
    )
    with torch.no_grad():  # a gate that exits early for some tokens and late for others
        thr.model.model.early_exit_gate.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    gen = thr.generate([prompt], Sampling(temperature=0, max_new_tokens=30))[0]
    probs = thr.model(torch.tensor([prompt + gen.token_ids])).exit_probs[:, 0, len(prompt) - 1 : -1]
    expected = ((probs.cumsum(0) < 0.5).sum(0) + 1).clamp(max=4).tolist()
    assert gen.loops_used == expected[: len(gen.loops_used)] and len(set(expected)) > 1
    alone = load_preset("ouro-tiny", exit_threshold=0.5).describe()["exit_policy"]  # a threshold below 1 is the policy
    assert (alone["kind"], alone["threshold"]) == ("threshold", 0.5)
