"""Loop conditioning (initial-state and history injection, Loop Gating, branch gating): identity at zero init,
the history formula on a hand-computed case, the gates per channel group, parameters and the bytes decoding keeps."""

from __future__ import annotations

import pytest
import torch

from adapters.base import AdapterError, Sampling
from adapters.engine.adapter import load_preset
from adapters.engine.kv.layouts import layout_of
from adapters.engine.kv.cache import KVCache
from adapters.engine.io.checkpoint import load_model, random_model, save_checkpoint
from adapters.engine.memory import conditioning_params, count_params, kv_bytes
from adapters.engine.model import LoopedLM, LoopTrace, with_conditioning
from adapters.engine.io.presets import preset

pytestmark = pytest.mark.numerics  # run again under a second ATen CPU capability by .ci/run

OPTIONS = [
    {"injection": "scalar"},
    {"injection": "channel"},
    {"injection": "dense"},
    {"history": "scalar", "history_window": 1},
    {"history": "channel", "history_window": 2},
    {"history": "dense", "history_window": 3},
    {"loop_gate": True},
    {"branch_gate": True},
    {"injection": "dense", "history": "dense", "history_window": 2, "loop_gate": True, "branch_gate": True},
]


def _model(name: str, **changes) -> LoopedLM:
    model = random_model(preset(name).replace(**changes), seed=1, dtype=torch.float32, device="cpu")
    with torch.no_grad():  # norms perturbed too, so every tensor matters
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


@pytest.mark.parametrize("name", ["coreloop-tiny", "ouro-tiny", "melt-tiny"])
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()))
def test_zero_init_reproduces_the_unconditioned_logits_exactly(name, option):
    plain = _model(name, chunk_size=4)
    conditioned = with_conditioning(plain, **option).eval()
    assert conditioned.model.loop_conditioning is not None
    ids = torch.randint(3, 99, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for loops in (2, 4, 6):  # 6 > T = 4: the gate reuses the last loop position
            ref, out = (
                plain(ids, loops=loops, return_loop_logits=True),
                conditioned(ids, loops=loops, return_loop_logits=True),
            )
            assert torch.equal(out.logits, ref.logits)
            assert all(torch.equal(a, b) for a, b in zip(out.loop_logits, ref.loop_logits))


def test_zero_init_decodes_the_same_tokens_through_the_cache():
    plain = load_preset("coreloop-tiny", dtype="fp32", device="cpu", loops=3)
    conditioned = load_preset(
        "coreloop-tiny",
        dtype="fp32",
        device="cpu",
        loops=3,
        injection="channel",
        history="dense",
        history_window=2,
        loop_gate=True,
    )
    greedy = Sampling(temperature=0.0, max_new_tokens=10)
    assert [g.text for g in conditioned.generate(["abc", "hello"], greedy)] == [
        g.text for g in plain.generate(["abc", "hello"], greedy)
    ]


def _identity_core(**changes) -> LoopedLM:
    """coreloop-tiny (pre-norm, 1 + 2 x 4 + 1) whose shared layers add nothing: every loop's core is the identity."""
    model = _model("coreloop-tiny", **changes)
    with torch.no_grad():
        for layer in model.shared:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def _states(model: LoopedLM, ids: torch.Tensor, loops: int) -> list[torch.Tensor]:
    trace = LoopTrace()
    with torch.no_grad():
        model(ids, loops=loops, trace=trace)
    return trace.joined()


def test_history_formula_on_a_hand_computed_case():
    """Identity core, x_l = h_{l-1} + a e + sum_j b_j (h_{l-j} - h_{l-j-1}) with h_0 = e excluded from the history:

    h_1 = (1 + a) e and h_2 = (1 + 2a) e (loops 1 and 2 see no history, although h_1 - h_0 = a e),
    h_3 = h_2 + a e + b_1 (h_2 - h_1) = (1 + 3a + a b_1) e,
    h_4 = h_3 + a e + b_1 (h_3 - h_2) + b_2 (h_2 - h_1) = h_3 + (a + b_1 (a + a b_1) + b_2 a) e.
    """
    model = _identity_core(injection="scalar", history="scalar", history_window=2)
    a, b1, b2 = 0.5, 0.25, -2.0
    with torch.no_grad():
        model.model.loop_conditioning.injection.weight.fill_(a)
        model.model.loop_conditioning.history.weight.copy_(torch.tensor([[b1], [b2]]))
    ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(1))
    e, *h = _states(model, ids, loops=4)
    h3 = 1 + 3 * a + a * b1
    expected = [1 + a, 1 + 2 * a, h3, h3 + a + b1 * (a + a * b1) + b2 * a]
    for state, k in zip(h, expected, strict=True):
        torch.testing.assert_close(state, k * e)


def test_dense_history_applies_each_lag_its_own_matrix():
    """Dense B_1 = diag(c): loop 3 adds c * (h_2 - h_1) channel by channel, the same as channel-wise B_1 = c."""
    c = torch.linspace(-1, 1, 128)
    dense, channel = (
        _identity_core(injection="scalar", history="dense"),
        _identity_core(injection="scalar", history="channel"),
    )
    for model, weight in ((dense, torch.diag(c)), (channel, c)):
        with torch.no_grad():
            model.model.loop_conditioning.injection.weight.fill_(0.5)
            model.model.loop_conditioning.history.weight[0] = weight
    ids = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(2))
    e, h1, h2, h3 = _states(dense, ids, loops=3)
    torch.testing.assert_close(h3, h2 + 0.5 * e + c * (h2 - h1))
    torch.testing.assert_close(h3, _states(channel, ids, loops=3)[-1])


def test_loop_gate_scales_each_channel_group_of_the_net_update():
    """Gate entry k of loop l scales channels [16k, 16k + 16) of loop l's update by 1 + tanh(g)."""
    gated, plain = _model("coreloop-tiny", loop_gate=True), _model("coreloop-tiny")
    g = torch.tensor([-30.0, 0.3, 0, 0, 0, 0, 0, 0])  # 1 + tanh(-30) == 0: the first group is frozen at loop 1
    with torch.no_grad():
        gated.model.loop_conditioning.gate[0] = g
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(3))
    e, h1 = _states(gated, ids, loops=1)
    _, core = _states(plain, ids, loops=1)
    torch.testing.assert_close(h1[..., :16], e[..., :16])
    torch.testing.assert_close(h1[..., 16:32], e[..., 16:32] + (1 + torch.tanh(g[1])) * (core - e)[..., 16:32])
    torch.testing.assert_close(h1[..., 32:], core[..., 32:])


def _branch_weight(model: LoopedLM, layer: int, branch: int) -> torch.Tensor:
    """The weight whose rows make shared layer `layer`'s attention (0) or MLP (1) output channels, as the gate sees them."""
    block = model.shared[layer]
    if block.sandwich:  # the sublayer's own norm runs before the gate
        return (block.input_layernorm_2, block.post_attention_layernorm_2)[branch].weight
    return (block.self_attn.o_proj, block.mlp.down_proj)[branch].weight


@pytest.mark.parametrize("name", ["ouro-tiny", "coreloop-tiny"])  # sandwich norms, and pre-norm with prelude and coda
@pytest.mark.parametrize("branch", [0, 1], ids=["attention", "mlp"])
def test_branch_gate_scales_each_branch_per_channel_group(name, branch):
    """A branch gate g on channel groups 0-3 of shared layer 1 at loop 1 scales those channels of that
    branch by 1 + tanh(g): the same logits as the model whose branch output rows are scaled so (one loop,
    so no other loop shares the weight). g = -30 removes them (1 + tanh(-30) == 0)."""
    rows = preset(name).hidden_size // 2  # groups 0-3 of 8: the first half of the channels
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(5))
    for g in (-30.0, 0.3):
        gated, scaled = _model(name, branch_gate=True), _model(name)
        with torch.no_grad():
            gated.model.loop_conditioning.branch[0, 1, branch, :4] = g
            _branch_weight(scaled, 1, branch)[:rows] *= 1 + torch.tanh(torch.tensor(g))
            logits = gated(ids, loops=1).logits
            torch.testing.assert_close(logits, scaled(ids, loops=1).logits)
            assert not torch.allclose(logits, _model(name)(ids, loops=1).logits)


@pytest.mark.parametrize("name", ["coreloop-tiny", "ouro-tiny", "melt-tiny"])
def test_parameters_and_the_bytes_decoding_keeps(name):
    cfg = preset(name).replace(injection="dense", history="channel", history_window=3, loop_gate=True, branch_gate=True)
    d = cfg.hidden_size
    assert conditioning_params(cfg) == d * d + 3 * d + cfg.loops * 8 + cfg.loops * cfg.shared_layers * 2 * 8
    assert count_params(cfg) == sum(p.numel() for p in LoopedLM(cfg).parameters())
    plain = KVCache(preset(name), layout_of(cfg), 2, 30, 4, torch.float32, "cpu")
    cache = KVCache(cfg, layout_of(cfg), 2, 30, 4, torch.float32, "cpu")
    in_flight = min(cfg.chunk_size, 30) if cfg.kv_strategy == "gated" else 1  # loops of one token run in sequence
    assert cache.kv_bytes_allocated - plain.kv_bytes_allocated == 2 * in_flight * 3 * d * 4
    assert cache.kv_bytes_allocated == kv_bytes(cfg, 30, batch=2, loops=4, dtype="fp32")


def test_conditioned_checkpoint_round_trip(tmp_path):
    model = _model("coreloop-tiny", history="channel", history_window=2, loop_gate=True)
    with torch.no_grad():
        model.model.loop_conditioning.gate.normal_()
    loaded = load_model(save_checkpoint(model, tmp_path / "ckpt"), "ouro", torch.float32, "cpu")
    ids = torch.randint(3, 99, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize(
    "changes,words",
    [
        ({"injection": "matrix"}, "injection='matrix' is not one of"),
        ({"history_window": 0}, "history_window must be a positive"),
        ({"loop_gate": True, "hidden_size": 100, "head_dim": 25 * 2}, "divisible by 8"),
        ({"branch_gate": True, "hidden_size": 100, "head_dim": 25 * 2}, "branch_gate needs hidden_size divisible by 8"),
        ({"branch_gate": "yes"}, "branch_gate must be true or false"),
        ({"loop_gate": 1}, "loop_gate must be true or false"),
        (
            {"prelude_layers": 1, "shared_layers": 0, "loops": 1, "kv_strategy": "standard", "history": "scalar"},
            "shared_layers >= 1",
        ),
    ],
)
def test_bad_conditioning_fields_name_the_field(changes, words):
    with pytest.raises(AdapterError, match=words):
        preset("coreloop-tiny").replace(**changes)
