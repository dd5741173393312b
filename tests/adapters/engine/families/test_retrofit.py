"""Retrofitted recurrence (a Llama cut into prelude, core and coda) in the engine against the official modelling code.

The reference (`tests/adapters/engine/data/retrofit_reference.json`) comes from `scripts/retrofit_reference.py`, which ran the
official `raven_modeling_minimal_llama.py` on the tiny checkpoint `adapters.testing.save_tiny_retrofit` builds from a
seed (GQA, untied lm_head, Llama 3 RoPE scaling); the tests build the same checkpoint. As for Huginn-0125
(`test_huginn.py`): the zero initial state at r = 1, 4 and 32, and the random state at r = 4, the logits within what
float32 rounding allows on this checkpoint (`tests/support/rounding.py`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import adapters
from adapters.base import AdapterError, Sampling
from adapters.engine.io.checkpoint import load_model, read_config, save_checkpoint
from adapters.engine.io.raven import retrofit_config
from adapters.engine.memory import analytic_terms, count_params
from adapters.engine.model import LoopedLM
from adapters.engine.io.presets import preset
from adapters.engine.kv.layouts import layout_of
from adapters.testing import TINY_RETROFIT, public_config, save_tiny_huginn, save_tiny_retrofit, tiny_retrofit_tensors
from harness.cli import main
from tests.support.recurrent_reference import (
    DISCRIMINATES,
    assert_greedy_is_the_reference,
    assert_logits_are_the_reference,
    assert_paged_accounting,
    max_diff,
    reference_engine,
)

pytestmark = pytest.mark.numerics  # run again under a second ATen CPU capability by .ci/run

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "retrofit_reference.json").read_text())
SEEDED = REFERENCE["seeded_state"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_retrofit(tmp_path_factory.mktemp("retrofit"), seed=REFERENCE["checkpoint"]["seed"])


def engine(checkpoint: Path, loops: int, scale: float = 0.0, **overrides) -> adapters.Adapter:
    """`reference_engine` on the checkpoint, without the tokenizer: the character tokenizer's <eos> (2) is a token the
    reference decodes like any other."""
    adapter = reference_engine(f"retrofit:{checkpoint}", SEEDED["seed"], loops, scale, **overrides)
    adapter.tokenizer = None
    return adapter


def test_retrofit_reference_names_its_source():
    ref = REFERENCE["reference"]
    assert (
        ref["repository"] == "LoopedLMs/retrofitting-recurrence"
        and ref["file"] == "convert_pretrained_model/raven_modeling_minimal_llama.py"
    )
    assert len(ref["commit"]) == 40 and REFERENCE["checkpoint"]["config"] == TINY_RETROFIT


@pytest.mark.parametrize("loops", [1, 4, 32])
def test_retrofit_logits_match_the_official_code(checkpoint, loops):
    model = load_model(checkpoint, "retrofit", torch.float32, "cpu")
    model.seed_state(0, 0.0)
    for prompt, expected in zip(REFERENCE["prompts"], REFERENCE["zero_state"][str(loops)]["logits"]):
        assert_logits_are_the_reference(model, prompt, loops, expected)
    other = 4 if loops != 4 else 32  # the loop count shows in the logits
    assert (
        max_diff(model, REFERENCE["prompts"][0], other, REFERENCE["zero_state"][str(loops)]["logits"][0])
        > DISCRIMINATES
    )


def test_llama3_rope_scaling_shows_in_the_reference(checkpoint):
    """Plain RoPE at the same theta misses the reference: the fixture checks the Llama 3 scaling, band by band."""
    model = load_model(checkpoint, "retrofit", torch.float32, "cpu")
    model.seed_state(0, 0.0)
    model.rotary.scaling, model.rotary.tables = None, {}
    assert max_diff(model, REFERENCE["prompts"][2], 4, REFERENCE["zero_state"]["4"]["logits"][2]) > DISCRIMINATES


@pytest.mark.parametrize("loops", [1, 4, 32])
def test_retrofit_greedy_continuations_match_the_official_code(checkpoint, loops):
    """GQA's paged per-step KV included."""
    assert_greedy_is_the_reference(engine(checkpoint, loops), REFERENCE, loops)


def test_retrofit_random_initial_state_is_the_official_draw(checkpoint):
    """The forward seeded as the official code after `torch.manual_seed(seed)`, with the config's std (the cloned Huginn-0125
    value) and no sqrt(d) scale: the same state, so the same logits. On this checkpoint the state moves the logits but no
    greedy token, so generation, which draws its own per-sample state (`test_state_draws.py`), gives the official continuation."""
    prompt = REFERENCE["prompts"][SEEDED["prompt"]]
    model = load_model(checkpoint, "retrofit", torch.float32, "cpu")

    def drawn_state() -> None:
        model.seed_state(SEEDED["seed"])

    assert_logits_are_the_reference(model, prompt, SEEDED["loops"], SEEDED["logits"], drawn_state)
    model.seed_state(SEEDED["seed"], 0.0)
    assert max_diff(model, prompt, SEEDED["loops"], SEEDED["logits"]) > DISCRIMINATES  # the state matters
    adapter = engine(checkpoint, SEEDED["loops"], scale=1.0, batching="static")
    assert (
        adapter.generate([prompt], Sampling(temperature=0.0, max_new_tokens=REFERENCE["new_tokens"]))[0].token_ids
        == SEEDED["greedy"]
    )


def test_retrofit_params_and_kv_follow_the_official_model(checkpoint):
    """Parameters: the official tensors, the untied lm_head included; KV: one entry per prelude layer, (step, core layer)
    and coda layer, each of the 2 KV heads only (GQA), as the paged pool accounts them after every step."""
    cfg = read_config(checkpoint)
    assert cfg.family == "retrofit" and count_params(cfg) == sum(t.numel() for t in tiny_retrofit_tensors().values())
    assert analytic_terms(cfg, 4, "fp32")["kv_bytes_per_token"] == 2 * (1 + 2 * 4 + 1) * 2 * 16 * 4
    assert_paged_accounting(engine(checkpoint, 4, block_size=4, max_batch=3), REFERENCE["prompts"], 4)


@pytest.mark.parametrize(
    ("name", "shape"), [("retrofit-llama-3.2-1b", (2, 4, 2, 8)), ("retrofit-tinyllama-1.1b", (4, 8, 4, 4))]
)
def test_presets_are_the_conversion_s_configs(name, shape):
    """A preset written out as convert_llama.py saves a RavenConfig reads back as itself (the token ids, which the
    reader leaves to the tokenizer, aside), its parameters are the model's, and its KV holds 2 + 4r + 2 (Llama-3.2)
    or 4 + 8r + 4 (TinyLlama) entries of its KV heads."""
    cfg = preset(name)
    assert retrofit_config(public_config(cfg)) == cfg.replace(bos_token_id=None, eos_token_id=None)
    assert (cfg.prelude_layers, cfg.shared_layers, cfg.coda_layers, cfg.num_kv_heads) == shape
    assert layout_of(cfg).entries(cfg, 32) == shape[0] + shape[1] * 32 + shape[2]
    with torch.device("meta"):
        assert count_params(cfg) == sum(p.numel() for p in LoopedLM(cfg).parameters())


def test_an_engine_checkpoint_of_a_retrofit_is_the_same_model(checkpoint, tmp_path):
    """Saved in the engine's format and read back: the same config (Llama 3 scaling and state std included) and logits."""
    model = load_model(checkpoint, "retrofit", torch.float32, "cpu")
    again = load_model(save_checkpoint(model, tmp_path / "engine"), "retrofit", torch.float32, "cpu")
    assert again.config == model.config and again.config.rope_scaling["original_max_position_embeddings"] == 64
    ids = torch.tensor([REFERENCE["prompts"][1]])
    model.seed_state(3)
    again.seed_state(3)
    with torch.no_grad():
        assert torch.equal(model.forward(ids, loops=4).logits, again.forward(ids, loops=4).logits)


def test_huginn_and_retrofit_specs_refuse_each_other_s_checkpoints(checkpoint, tmp_path, capsys):
    """One line each, naming the spec that reads the folder; an OLMo-2 retrofit's tensors are refused by name."""
    huginn = save_tiny_huginn(tmp_path / "huginn")
    for spec, needle in (
        (f"huginn:{checkpoint}", "load it as retrofit:DIR"),
        (f"retrofit:{huginn}", "load it as huginn:DIR"),
    ):
        assert main(["estimate", spec, "--tokens", "8"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err
    olmo = tmp_path / "olmo"
    shutil.copytree(checkpoint, olmo)
    tensors = load_file(str(olmo / "model.safetensors"))
    save_file({**tensors, "transformer.prelude.0.attn.q_norm.weight": torch.ones(64)}, str(olmo / "model.safetensors"))
    with pytest.raises(AdapterError, match="OLMo-2 retrofit"):
        load_model(olmo, "retrofit", torch.float32, "cpu")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"init_values": {"std": 0.01, "embed_scale": 45.25}}, "embed_scale 1"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'llama3'"),
        ({"num_key_value_heads": 3}, "num_kv_heads=3"),
        ({"test_time_noise": 0.1}, "test_time_noise"),
    ],
)
def test_bad_retrofit_configs_are_refused_by_field(change, message):
    with pytest.raises(AdapterError, match=message):
        retrofit_config({**TINY_RETROFIT, **change})
