"""The IFM Part II family in the engine against the release's evaluation, and its KV against the analytic model.

The reference (`tests/adapters/engine/data/ifm_reference.json`) comes from `scripts/ifm_reference.py`, which computes the
official evaluation (`DepthControlledHuginn.terminal_kv_forward` of ifm-ai/xllm-loop and the `xllm.modules` it runs)
on the tiny artifacts `adapters.testing.save_tiny_ifm` writes from a seed, in the artifact's own names and conventions
(zero-centred norm weights, pair-wise RoPE); the tests build the same artifacts. Every row of the release is covered:
a Table 2 row (fixed R = 5; the sampled-depth and learned-prior rows differ only in training fields, one of them is
here), the three Table 3 injections (Huginn-Linear with its exit norm, Parcae-Decay with its prelude norm, OrthoInj)
and D4. Logits agree within what float32 rounding allows on each artifact (`tests/support/rounding.py`); greedy
continuations decode through terminal KV (the family's `shared-last`) on the paged pool and the static path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adapters.base import Sampling
from adapters.engine.adapter import eos_ids
from adapters.engine.families import family_of
from adapters.engine.io.xllm import model_config
from adapters.engine.io.checkpoint import load_model
from adapters.engine.io.presets import preset
from adapters.engine.kv.layouts import layout_of
from adapters.engine.memory import analytic_terms, count_params, estimate
from adapters.engine.model import LoopedLM
from adapters.testing import IFM_VARIANTS, save_tiny_ifm, tiny_ifm_fields, tiny_ifm_tensors
from harness.cli import main
from tests.support.recurrent_reference import (
    DISCRIMINATES,
    assert_logits_are_the_reference,
    assert_paged_accounting,
    max_diff,
    reference_engine,
)

pytestmark = pytest.mark.numerics  # run again under a second ATen CPU capability by .ci/run

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "ifm_reference.json").read_text())


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ifm")
    seed = REFERENCE["checkpoint"]["seed"]
    return {variant: save_tiny_ifm(root / variant, variant=variant, seed=seed) for variant in IFM_VARIANTS}


def loops_of(variant: str) -> int:
    return 1 if variant == "d4" else 5


def test_ifm_reference_names_its_source_and_covers_every_row():
    ref = REFERENCE["reference"]
    assert ref["repository"] == "ifm-ai/xllm-loop" and len(ref["commit"]) == 40
    assert set(REFERENCE["rows"]) == set(IFM_VARIANTS) and REFERENCE["state"] == {"seed": 42, "example_id": 0}


@pytest.mark.parametrize("variant", list(IFM_VARIANTS))
def test_ifm_logits_match_the_official_evaluation(artifacts, variant):
    model = load_model(artifacts[variant], "ifm", torch.float32, "cpu")
    for prompt, expected in zip(REFERENCE["prompts"], REFERENCE["rows"][variant]["logits"]):
        assert_logits_are_the_reference(model, prompt, loops_of(variant), expected)


def test_a_wrong_recurrence_count_is_told_apart(artifacts):
    """The bound the logits are held to is far below what one recurrence more or less moves them."""
    model = load_model(artifacts["fixed-r5"], "ifm", torch.float32, "cpu")
    prompt, expected = REFERENCE["prompts"][0], REFERENCE["rows"]["fixed-r5"]["logits"][0]
    assert min(max_diff(model, prompt, r, expected) for r in (4, 6)) > DISCRIMINATES


@pytest.mark.parametrize("variant", list(IFM_VARIANTS))
def test_ifm_greedy_decoding_with_terminal_kv_is_the_official_one(artifacts, variant):
    """Token by token through terminal KV, as the release's generation stages decode: the continuous engine (paged KV,
    the prompts batched), then the static path. A continuation ends at the tokenizer's end token, as the reference's
    would have."""
    adapter = reference_engine(f"ifm:{artifacts[variant]}", 0, loops_of(variant))
    assert layout_of(adapter.config).policy == ("standard" if variant == "d4" else "shared-last")
    greedy = Sampling(temperature=0.0, max_new_tokens=REFERENCE["new_tokens"])
    end = eos_ids(adapter.config, adapter.tokenizer)
    expected = [until_end(tokens, end) for tokens in REFERENCE["rows"][variant]["greedy"]]
    assert [g.token_ids for g in adapter.generate(REFERENCE["prompts"], greedy)] == expected
    adapter.batching = "static"
    assert [g.token_ids for g in adapter.generate(REFERENCE["prompts"], greedy)] == expected


def until_end(tokens: list[int], end: set[int]) -> list[int]:
    """`tokens` up to and including the first end token."""
    stops = [i for i, token in enumerate(tokens) if token in end]
    return tokens[: stops[0] + 1] if stops else tokens


def test_ifm_params_follow_the_official_tensors():
    """Parameters: the official tensors plus the final norm the official count leaves out (present in the weights)."""
    for variant in IFM_VARIANTS:
        fields = tiny_ifm_fields(variant)
        official = sum(t.numel() for t in tiny_ifm_tensors(fields, 0).values())
        assert count_params(model_config(fields)) == official, variant
    for name in ("ifm-s", "ifm-m", "ifm-d4-s", "ifm-d4-m"):
        with torch.device("meta"):
            assert count_params(preset(name)) == sum(p.numel() for p in LoopedLM(preset(name)).parameters())


def test_ifm_paged_kv_accounting_equals_the_analytic_model(artifacts):
    """Terminal KV: one entry per physical layer whatever R, so a token holds what the dense D4 row holds."""
    adapter = reference_engine(f"ifm:{artifacts['fixed-r5']}", 0, 5, block_size=4, max_batch=3)
    terms = analytic_terms(adapter.config, 5, "fp32")
    assert terms["kv_bytes_per_token"] == 2 * 4 * 2 * 16 * 4  # K and V x 4 layers x 2 KV heads x head dim x fp32
    assert_paged_accounting(adapter, REFERENCE["prompts"], 5)


@pytest.mark.parametrize(
    ("name", "params"),
    [("ifm-s", 303_579_648), ("ifm-m", 819_495_936), ("ifm-d4-s", 301_217_280), ("ifm-d4-m", 810_052_608)],
)
def test_ifm_estimate_prints_its_terms(capsys, name, params):
    """The official parameter count (`Transformer.num_parameters`: embeddings and head, four blocks, the injection)
    plus the final norm; KV: K and V x 4 layer entries x KV heads x 64 x bf16, for the looped rows at any R."""
    code = main(["estimate", name, "--tokens", "8192"])
    out = capsys.readouterr().out
    expected = estimate(preset(name), 8192)
    kv_heads = preset(name).num_kv_heads
    assert code == 0 and expected.params == params and f"{expected.weights_bytes:,}" in out
    assert expected.kv_bytes == 2 * 4 * kv_heads * 64 * 2 * 8192 and f"{expected.kv_bytes:,}" in out
    if name.startswith("ifm-d4"):
        return
    assert estimate(preset(name), 8192, loops=32).kv_bytes == expected.kv_bytes  # terminal KV does not grow with R
    per_loop = estimate(preset(name).replace(kv_policy="per-loop"), 8192).kv_bytes
    assert per_loop == expected.kv_bytes * (1 + 2 * 5 + 1) // 4  # the full cache: 3x the terminal one at R = 5


def test_the_family_builds_llama_blocks_an_exit_norm_on_the_last_recurrent_layer_and_its_state(tmp_path):
    """Huginn-Linear's parameter-free norm closes each recurrence (the last recurrent layer's block), no other row has
    one; the state is the protocol's: the run's seed does not move it, and a row's state is its positions' alone."""
    linear = load_model(save_tiny_ifm(tmp_path / "linear", variant="huginn-linear"), "ifm", torch.float32, "cpu")
    exits = [layer.exit_eps is not None for layer in linear.model.layers]
    assert exits == [False, False, True, False] and type(family_of(linear.config)).__name__ == "Ifm"
    model = load_model(save_tiny_ifm(tmp_path / "fixed", variant="fixed-r5"), "ifm", torch.float32, "cpu")
    assert not any(layer.exit_eps is not None for layer in model.model.layers)
    state = model.model.recurrence
    e = torch.zeros(2, 6, model.config.hidden_size)
    first = state.initial_state(e, torch.tensor([[0, 1, 2, 3, 4, 5], [4, 5, 6, 7, 8, 9]]))
    model.seed_state(123)
    again = state.initial_state(e[:1, :2], torch.tensor([[4, 5]]))
    assert torch.equal(again[0], first[0, 4:]) and torch.equal(first[1, :2], first[0, 4:])
    assert abs(first.std().item() - model.config.hidden_size**-0.5) < 0.02  # N(0, 1/d), the release's stand-in
