"""Loop probes on constructed models whose loops are known, so every metric has a hand-computed value."""

from __future__ import annotations

import math

import pytest
import torch

from adapters.engine.io.checkpoint import random_model
from adapters.engine.model import LoopedLM
from adapters.engine.io.presets import preset
from adapters.engine.probes import probe

pytestmark = pytest.mark.numerics  # run again under a second ATen CPU capability by .ci/run

TEXTS = [torch.randint(3, 99, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 14)]


def _model(**changes) -> LoopedLM:
    return random_model(preset("coreloop-tiny").replace(**changes), seed=2, dtype=torch.float32, device="cpu")


def _identity_core(**changes) -> LoopedLM:
    """coreloop-tiny (pre-norm, 1 + 2 x 4 + 1) whose shared layers add nothing: the core is the identity."""
    model = _model(**changes)
    with torch.no_grad():
        for layer in model.shared:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def _table(model: LoopedLM, loops: int) -> dict[tuple[int, str, int | None], float]:
    return {(v.loop, v.metric, v.lag): v.value for v in probe(model, TEXTS, loops)}


def test_injection_only_model_moves_along_e_with_known_updates():
    """Identity core, x_l = h_{l-1} + a e: h_l = (1 + l a) e. Every state points along e (angle 0, the same
    normalised variance as e), the relative update is a / (1 + (l - 1) a), and skipping a loop leaves later
    updates (all a e) unchanged: interaction 0."""
    a = 0.5
    model = _identity_core(injection="scalar")
    with torch.no_grad():
        model.model.loop_conditioning.injection.weight.fill_(a)
    table = _table(model, 4)
    variance = {table[(l, "state_variance", None)] for l in range(1, 5)}
    assert max(variance) - min(variance) < 1e-5 and 0 < min(variance) < 1
    for l in range(1, 5):
        assert table[(l, "angular_distance", None)] < 1e-3  # arccos of a float32 cosine of 1
        assert table[(l, "relative_update", None)] == pytest.approx(a / (1 + (l - 1) * a), rel=1e-5)
        for k in range(1, l):
            assert table[(l, "interaction", k)] == pytest.approx(0.0, abs=1e-5)
    assert {key for key in table if key[1] == "interaction"} == {
        (l, "interaction", k) for l in range(2, 5) for k in range(1, l)
    }


def test_history_model_interactions_match_the_hand_computed_ratios():
    """Add history w = 1, B_1 = b: u_3 = a (1 + b) e and u_4 = a (1 + b + b^2) e. Skipping loop 2 gives
    u_3' = a e (lag 1: |b| / |1 + b|) and u_4' = a (1 + b) e (lag 2: b^2 / (1 + b + b^2)); skipping loop 3
    gives u_4' = a e (lag 1: (b + b^2) / (1 + b + b^2)); skipping loop 1 only delays (0)."""
    a, b = 0.5, 0.5
    model = _identity_core(injection="scalar", history="scalar", history_window=1)
    with torch.no_grad():
        model.model.loop_conditioning.injection.weight.fill_(a)
        model.model.loop_conditioning.history.weight.fill_(b)
    table = _table(model, 4)
    expected = {
        (3, 1): b / (1 + b),
        (3, 2): 0.0,
        (4, 1): (b + b * b) / (1 + b + b * b),
        (4, 2): b * b / (1 + b + b * b),
        (4, 3): 0.0,
    }
    for (l, k), value in expected.items():
        assert table[(l, "interaction", k)] == pytest.approx(value, abs=1e-5), (l, k)


def test_identity_after_loop_one():
    """Loop Gating at 1 + tanh(-30) == 0 from loop 2 on: the state stops after loop 1, so every later loop
    has angle, relative update 0, the same variance as loop 1, and no update to interact with (undefined)."""
    model = _model(loop_gate=True)
    with torch.no_grad():
        model.model.loop_conditioning.gate[1:] = -30.0
    table = _table(model, 4)
    assert table[(1, "angular_distance", None)] > 0.05 and table[(1, "relative_update", None)] > 0.05
    for l in (2, 3, 4):
        assert table[(l, "angular_distance", None)] < 1e-3
        assert table[(l, "relative_update", None)] < 1e-6  # x + (1 + tanh g)(y - x) is x up to rounding
        assert table[(l, "state_variance", None)] == pytest.approx(table[(1, "state_variance", None)], rel=1e-6)
        assert all(math.isnan(table[(l, "interaction", k)]) for k in range(1, l))


def test_gated_models_never_skip_loop_one():
    model = random_model(preset("melt-tiny").replace(chunk_size=4), seed=2, dtype=torch.float32, device="cpu")
    table = _table(model, 3)
    assert {key for key in table if key[1] == "interaction"} == {(3, "interaction", 1)}
