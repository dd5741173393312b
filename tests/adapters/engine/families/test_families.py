"""The families' hooks (`adapters.engine.families`): each layout's entries are the ones a real prefill writes, each family
builds the blocks and parameters it declares, and the taps of a full-sequence forward skip and stop differentiating loops."""

from __future__ import annotations

import pytest
import torch

from adapters.engine.kv.cache import KVCache
from adapters.engine.kv.layouts import layout_of
from adapters.engine.config import LoopConfig
from adapters.engine.families import Family, family_of
from adapters.engine.families.huginn import Huginn, HuginnBlock, Retrofit
from adapters.engine.families.melt import GatedBlock, Melt
from adapters.engine.families.ouro import Ouro
from adapters.engine.families.standard import Standard
from adapters.engine.io.presets import preset
from adapters.engine.layers import Block
from adapters.engine.memory import count_params
from adapters.engine.model import LoopedLM, LoopTrace, Taps

TINY = dict(
    vocab_size=99,
    hidden_size=64,
    num_heads=4,
    head_dim=16,
    ffn_size=128,
    prelude_layers=1,
    shared_layers=2,
    coda_layers=1,
    loops=3,
    kv_strategy="per_loop",
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
CONFIGS = {
    "qwen3": preset("qwen3-tiny"),
    "ouro": preset("ouro-tiny"),
    "coreloop": preset("coreloop-tiny"),
    "melt": preset("melt-tiny"),
    "huginn": LoopConfig(family="huginn", num_kv_heads=4, norm_layout="sandwich", **TINY),
    "retrofit": LoopConfig(family="retrofit", num_kv_heads=2, norm_layout="pre", **TINY),
}
EXPECTED = {"qwen3": Standard, "ouro": Ouro, "coreloop": Ouro, "melt": Melt, "huginn": Huginn, "retrofit": Retrofit}


def built(cfg: LoopConfig) -> LoopedLM:
    model = LoopedLM(cfg)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_a_config_picks_its_family(name):
    assert type(family_of(CONFIGS[name])) is EXPECTED[name]


@pytest.mark.parametrize("name", CONFIGS)
def test_a_prefill_writes_exactly_the_entries_its_layout_counts(name):
    """The static cache holds the layout's entries, a 5-token prefill writes every one of them at every position, and
    every (layer, loop) maps to one of them: per-loop grows with r (p + s r + c), standard and gated do not."""
    cfg = CONFIGS[name]
    layout, r = layout_of(cfg), 1 if cfg.kv_strategy == "standard" else 3
    model, cache = built(cfg), KVCache(cfg, layout_of(cfg), 1, 8, r, torch.float32, "cpu")
    tokens, positions = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(1)), torch.arange(5)[None]
    streams = torch.zeros(1, 5, dtype=torch.int64) if model.draws_state else None
    with torch.inference_mode():
        model.step(tokens, positions, cache, 0, None, loops=r, streams=streams)
    written = cache.k[:, 0, :, :5].abs().amax(dim=(1, 3)) > 0  # [entries, positions]
    p, s, c = cfg.prelude_layers, cfg.shared_layers, cfg.coda_layers
    assert layout.entries(cfg, r) == (p + s * r + c if cfg.kv_strategy == "per_loop" else cfg.num_layers)
    assert cache.k.shape[0] == layout.entries(cfg, r) and bool(written.all())
    assert {e for row in layout.table(cfg, r) for e in row} == set(range(layout.entries(cfg, r)))
    assert cache.k[:, 0, :, 5:].abs().amax().item() == 0  # nothing past the prompt


@pytest.mark.parametrize("name", CONFIGS)
def test_only_the_gated_layout_keeps_a_latent(name):
    """MELT's latent h holds s x d values per token of a chunk, written by the prefill; the other layouts keep none."""
    cfg = CONFIGS[name]
    layout, cache = layout_of(cfg), KVCache(cfg, layout_of(cfg), 1, 8, 1, torch.float32, "cpu")
    if name != "melt":
        assert layout.latent_width(cfg) == 0 and cache.latent is None
        return
    assert (
        layout.latent_width(cfg) == cfg.shared_layers * cfg.hidden_size and layout.latent_tokens(cfg) == cfg.chunk_size
    )
    with torch.inference_mode():
        built(cfg).step(torch.tensor([[5, 6, 7]]), torch.arange(3)[None], cache, 0, None, loops=1)
    assert cache.latent.shape == (cfg.shared_layers, 1, min(cfg.chunk_size, 8), cfg.hidden_size)
    assert bool((cache.latent[:, 0, :3].abs().amax(dim=-1) > 0).all())


@pytest.mark.parametrize("name", CONFIGS)
def test_a_family_builds_the_blocks_and_parameters_it_declares(name):
    """Huginn's blocks carry q/k biases and norm each residual sum, MELT's shared layers alone carry a gate, the rest are
    plain blocks; `count_params` (the shared shape plus `extra_params`) is the parameters the model holds."""
    cfg = CONFIGS[name]
    model = built(cfg)
    kinds = [type(layer) for layer in model.model.layers]
    p, s = cfg.prelude_layers, cfg.shared_layers
    want = {
        "huginn": [HuginnBlock] * cfg.num_layers,
        "melt": [GatedBlock if p <= i < p + s else Block for i in range(cfg.num_layers)],
    }.get(name, [Block] * cfg.num_layers)
    assert kinds == want
    assert all((layer.self_attn.qk_bias is not None) == (name == "huginn") for layer in model.model.layers)
    assert count_params(cfg) == sum(t.numel() for t in model.parameters())
    assert (model.model.recurrence is not None) == (name in ("huginn", "retrofit"))
    assert model.model.embed_scale == (cfg.hidden_size**0.5 if name == "huginn" else None)


def test_the_plain_family_is_every_hook_at_its_base_value():
    family = Family(CONFIGS["qwen3"])
    assert family.forward_chunks(10, None) == [(0, 10)] and family.prefill_chunk is None and family.state() is None
    melt = family_of(CONFIGS["melt"])
    assert melt.forward_chunks(10, 4) == [(0, 2), (2, 6), (6, 10)] and melt.prefill_chunk == CONFIGS["melt"].chunk_size
    with pytest.raises(ValueError, match="sum to the sequence length"):
        melt.forward_chunks(10, [4, 4])


def test_taps_stop_differentiating_the_loops_before_the_last_grad_loops():
    h = torch.ones(3, requires_grad=True)
    taps = Taps(grad_loops=1)
    early, _ = taps.loop(0, 2, h, None, lambda attn: (h * 2, None))
    last, _ = taps.loop(1, 2, h, None, lambda attn: (h * 2, None))
    assert not early.requires_grad and last.requires_grad and torch.equal(early, last)


def test_taps_hand_a_skipped_loop_s_input_on_and_collect_attention_outputs():
    h, calls, outputs = torch.arange(4.0), [], []
    taps = Taps(attn_outputs=outputs, trace=LoopTrace(skip=frozenset({0})))

    def run(attn: list | None) -> tuple[torch.Tensor, None]:
        calls.append(attn)
        return h + 1, None

    skipped, normed = taps.loop(0, 2, h, lambda x: -x, run)
    ran, _ = taps.loop(1, 2, h, lambda x: -x, run)
    assert torch.equal(skipped, h) and torch.equal(normed, -h) and torch.equal(ran, h + 1)
    assert (
        len(calls) == 1 and calls[0] is outputs
    )  # only the loop that ran, handed the list the attention outputs go to
