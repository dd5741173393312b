"""Ouro at Ouro-2.6B's layer count (48 shared layers) in the engine against the official modelling code.

The reference (`tests/adapters/engine/data/ouro_reference.json`) comes from `scripts/ouro_reference.py`, which ran the official
`modeling_ouro.py` (a public copy of the one on the model hub; the fixture records which) in float32 on the tiny checkpoint
`adapters.testing.save_tiny_ouro` builds from a seed: 48 layers of width 64, 4 trained loops. The tests build the same
checkpoint, load it through `ouro:DIR` as a user would, and compare the logits of every position at r = 1, 4 and 6,
within what float32 rounding allows on this checkpoint (`tests/support/rounding.py`): up to 288 layer passes, whose
rounding the kernels of another CPU (AVX512, AVX2, scalar) round differently.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import adapters
from adapters.engine.kv.cache import KVCache
from adapters.engine.kv.layouts import layout_of
from adapters.engine.memory import estimate
from adapters.engine.io.presets import preset
from adapters.testing import TINY_OURO_26B, save_tiny_ouro
from tests.support.recurrent_reference import DISCRIMINATES
from tests.support.rounding import FIXTURE_DIGITS, rounding_bound

pytestmark = pytest.mark.numerics  # run again under a second ATen CPU capability by .ci/run

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "ouro_reference.json").read_text())


@pytest.fixture(scope="module")
def ouro(tmp_path_factory) -> adapters.Adapter:
    folder = save_tiny_ouro(tmp_path_factory.mktemp("ouro"), seed=REFERENCE["checkpoint"]["seed"])
    return adapters.load(f"ouro:{folder}", dtype="fp32", device="cpu")


def test_the_fixture_is_of_this_checkpoint_and_the_2_6b_layer_count(ouro):
    assert REFERENCE["checkpoint"]["config"] == TINY_OURO_26B
    cfg = ouro.config
    assert (cfg.family, cfg.shared_layers, cfg.loops, cfg.kv_strategy) == (
        "ouro",
        preset("ouro-2.6b").shared_layers,
        4,
        "per_loop",
    )


def logits(ouro: adapters.Adapter, prompt: list[int], loops: int) -> torch.Tensor:
    return ouro.model(torch.tensor([prompt]), loops=loops).logits[0]


@pytest.mark.parametrize("loops", [1, 4, 6])
def test_logits_match_the_official_code(ouro, loops):
    """Every position of every prompt, one forward without a cache; r = 6 is depth extrapolation past the trained 4."""
    for prompt, expected in zip(REFERENCE["prompts"], REFERENCE["logits"][str(loops)]):
        run = functools.partial(logits, ouro, prompt, loops)
        bound = rounding_bound(ouro.model, run) + FIXTURE_DIGITS
        with torch.no_grad():
            diff = (run() - torch.tensor(expected)).abs().max().item()
        assert diff < bound < DISCRIMINATES, (loops, prompt, diff, bound)


def test_the_loaded_checkpoint_holds_what_the_estimate_counts(ouro):
    assert ouro.memory()["weights_bytes"] == estimate(ouro.config, 1, dtype="fp32").weights_bytes


DECODE = REFERENCE["decode"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_ouro(tmp_path_factory.mktemp("ouro-policies"), seed=REFERENCE["checkpoint"]["seed"])


def decode_logits(model: torch.nn.Module) -> torch.Tensor:
    """The engine's logits decoding the fixture's continuation one token a step through its static cache (the
    config's KV policy): the prompt's last position, then each step's."""
    loops, prompt, continuation = DECODE["loops"], DECODE["prompt"], DECODE["continuation"]
    cache = KVCache(
        model.config, layout_of(model.config), 1, len(prompt) + len(continuation), loops, torch.float32, "cpu"
    )
    rows, slot = [], 0
    for ids in [prompt, *([t] for t in continuation)]:
        out = model.step(torch.tensor([ids]), torch.arange(slot, slot + len(ids))[None], cache, slot, None, loops=loops)
        rows.append(model.logits(out.states[-1])[0])
        slot += len(ids)
    return torch.stack(rows)


@pytest.mark.parametrize("policy", list(DECODE["logits"]))
def test_decoding_under_each_kv_policy_matches_the_official_code(checkpoint, policy):
    """The engine's cached decoding at r = 4 against the official code's own cache (per-loop) and a cache sharing
    K/V across loops over its interface (`scripts/ouro_reference.py`: shared-last keeps a token's last loop,
    shared-mean the mean of its loops, the step's own token at its current loop). The sharing policies move the
    logits far more than rounding allows, so a policy computed any other way fails here."""
    ouro = adapters.load(f"ouro:{checkpoint}", dtype="fp32", device="cpu", kv_policy=policy)
    run = functools.partial(decode_logits, ouro.model)
    bound = rounding_bound(ouro.model, run) + FIXTURE_DIGITS
    with torch.no_grad():
        got = run()
    expected = torch.tensor(DECODE["logits"][policy])
    assert (got - expected).abs().max().item() < bound < DISCRIMINATES, policy
    if policy != "per-loop":  # sharing acts at decoding only: the prompt's logits are per-loop's
        per_loop = torch.tensor(DECODE["logits"]["per-loop"])
        assert torch.equal(expected[0], per_loop[0]) and (expected[1:] - per_loop[1:]).abs().max() > 100 * bound
