"""The RavenConfig layout (Huginn-0125, retrofits): configs read by their official names, and the official tensors
renamed, split and reordered into the engine's, with real tensors."""

from __future__ import annotations

import math

import pytest
import torch

from adapters.base import AdapterError
from adapters.engine.io.presets import preset
from adapters.engine.io.raven import (
    check_official,
    engine_tensors,
    huginn_config,
    is_retrofit,
    retrofit_config,
    rope_order,
)
from adapters.engine.model import LoopedLM
from adapters.testing import (
    TINY_HUGINN,
    TINY_RETROFIT,
    _with_char_vocab,
    public_config,
    tiny_huginn_tensors,
    tiny_retrofit_tensors,
)


def test_the_channel_order_turns_pairwise_rope_into_rotate_half():
    """The official RoPE rotates channel pairs (2j, 2j+1) by angle j; the engine rotates (j, j + D/2). Taking each
    head's channels evens first, then odds, the second is the first: the same values, channel for channel."""
    d, g = 8, torch.Generator().manual_seed(0)
    x, angle = torch.randn(5, d, generator=g), torch.randn(5, d // 2, generator=g)
    cos, sin = angle.cos(), angle.sin()
    pairwise = torch.stack((x[:, 0::2] * cos - x[:, 1::2] * sin, x[:, 0::2] * sin + x[:, 1::2] * cos), -1).flatten(1)
    y = x[:, rope_order(d)]
    half = torch.cat((y[:, : d // 2] * cos - y[:, d // 2 :] * sin, y[:, d // 2 :] * cos + y[:, : d // 2] * sin), -1)
    assert rope_order(d).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    torch.testing.assert_close(half, pairwise[:, rope_order(d)], rtol=0, atol=0)


def test_the_public_configs_read_back_as_the_presets():
    huginn = huginn_config(public_config(preset("huginn-0125")))
    want = preset("huginn-0125")
    assert (
        huginn.replace(bos_token_id=want.bos_token_id, eos_token_id=want.eos_token_id, pad_token_id=want.pad_token_id)
        == want
    )
    retrofit = retrofit_config(public_config(preset("retrofit-llama-3.2-1b")))
    assert retrofit.num_kv_heads == 8 and retrofit.rope_scaling == preset("retrofit-llama-3.2-1b").rope_scaling
    assert math.isclose(retrofit.state_std, math.sqrt(2 / (5 * 5280)))


def test_each_loader_refuses_the_other_family_s_config():
    assert not is_retrofit(TINY_HUGINN) and is_retrofit(TINY_RETROFIT)
    with pytest.raises(AdapterError, match="retrofit:DIR"):
        huginn_config(TINY_RETROFIT)
    with pytest.raises(AdapterError, match="huginn:DIR"):
        retrofit_config(TINY_HUGINN)
    with pytest.raises(AdapterError, match="model_type"):
        huginn_config({**TINY_HUGINN, "model_type": "llama"})


@pytest.mark.parametrize(
    "tensors,config", [(tiny_huginn_tensors, huginn_config), (tiny_retrofit_tensors, retrofit_config)]
)
def test_the_official_tensors_become_exactly_the_engine_s(tensors, config):
    cfg = config(_with_char_vocab(TINY_HUGINN if config is huginn_config else TINY_RETROFIT))
    official = tensors()
    wqkv = official["transformer.core_block.0.attn.Wqkv.weight"].clone()
    out = engine_tensors(dict(official), cfg)
    with torch.device("meta"):
        want = {name: tuple(t.shape) for name, t in LoopedLM(cfg).state_dict().items()}
    assert {name: tuple(t.shape) for name, t in out.items()} == want
    h, hd = cfg.num_heads, cfg.head_dim
    q = out[f"model.layers.{cfg.prelude_layers}.self_attn.q_proj.weight"]
    order = rope_order(hd) if cfg.family == "huginn" else torch.arange(hd)  # a retrofit's RoPE is rotate-half already
    torch.testing.assert_close(q, wqkv[: h * hd].view(h, hd, -1)[:, order].reshape(q.shape), rtol=0, atol=0)


def test_a_missing_or_misshapen_tensor_is_named_before_anything_is_split():
    cfg = huginn_config(_with_char_vocab(TINY_HUGINN))
    tensors = tiny_huginn_tensors()
    del tensors["transformer.coda.0.mlp.proj.weight"]
    with pytest.raises(AdapterError, match="lacks tensor transformer.coda.0.mlp.proj.weight"):
        check_official(tensors, cfg)
    tensors = tiny_huginn_tensors()
    tensors["transformer.adapter.weight"] = tensors["transformer.adapter.weight"][:, :-1]
    with pytest.raises(AdapterError, match="transformer.adapter.weight has shape"):
        engine_tensors(tensors, cfg)
