"""KV dtypes (`kv_dtype`): int8 and fp8 rows with a float32 scale per token and head, on real tensors. The error
bounds come from the formats: int8 rounds to a step of amax / 127, so a value moves at most half a step; fp8 e4m3
keeps 3 mantissa bits, so a normal value moves at most 2^-4 of itself and a subnormal (|x / scale| < 2^-6) at
most half its spacing, 2^-10 scale. Float32's own rounding of x / scale and back adds a few ulps of amax (2^-22)."""

from __future__ import annotations

import pytest
import torch

from adapters.base import Request, Sampling
from adapters.engine.adapter import load_preset
from adapters.engine.kv.layouts import layout_of
from adapters.engine.kv.cache import KVCache
from adapters.engine.io.presets import preset
from adapters.engine.kv.format import AUTO, KV_FORMATS, SCALE_BYTES
from adapters.engine.memory import analytic_terms

ROWS = (
    torch.randn(3, 2, 7, 32, generator=torch.Generator().manual_seed(0)) * torch.logspace(-6, 2, 7)[None, None, :, None]
)
SLOP = 2**-22


def test_int8_moves_a_value_at_most_half_a_step():
    fmt = KV_FORMATS["int8"]
    packed = fmt.pack(ROWS)
    amax = ROWS.abs().amax(-1, keepdim=True)
    scale = packed[..., 32:].view(torch.float32)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == 32 + SCALE_BYTES
    assert torch.equal(scale, amax / 127)
    assert ((fmt.unpack(packed, torch.float32) - ROWS).abs() <= scale / 2 + amax * SLOP).all()


def test_fp8_keeps_three_mantissa_bits():
    fmt = KV_FORMATS["fp8"]
    packed = fmt.pack(ROWS)
    amax = ROWS.abs().amax(-1, keepdim=True)
    scale = packed[..., 32:].view(torch.float32)
    assert torch.equal(scale, amax / 448)
    error = (fmt.unpack(packed, torch.float32) - ROWS).abs()
    assert (error <= torch.maximum(ROWS.abs() * 2**-4, scale * 2**-10) + amax * SLOP).all()
    assert (
        packed[..., :32].view(torch.float8_e4m3fn).float().abs().amax(-1).eq(448).all()
    )  # each row's largest value at full range


def test_zero_rows_and_bf16_models():
    for name in ("int8", "fp8"):
        fmt = KV_FORMATS[name]
        assert torch.equal(fmt.round_trip(torch.zeros(2, 4, 8)), torch.zeros(2, 4, 8))  # no 0 / 0
        x = ROWS.to(torch.bfloat16)
        assert fmt.round_trip(x).dtype == torch.bfloat16
    x = ROWS.clone()
    assert AUTO.pack(x) is x and AUTO.unpack(x, torch.float32) is x  # auto: the rows as they are


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_a_cache_stores_bytes_and_attention_reads_them_dequantized(kv_dtype):
    """The static cache holds each row's values and scale as bytes; what `update` returns for attention is those bytes
    dequantized, earlier rows included."""
    cfg = preset("ouro-tiny").replace(kv_dtype=kv_dtype)
    cache = KVCache(cfg, layout_of(cfg), 3, 10, 4, torch.float32, "cpu")
    fmt = KV_FORMATS[kv_dtype]
    k1, k2 = ROWS[:, :, :4], ROWS[:, :, 4:6]
    cache.update(0, 0, k1, k1, slot=0)
    k, v = cache.update(0, 0, k2, k2, slot=4)
    assert cache.k.dtype == torch.uint8 and cache.k.shape[-1] == 36
    assert torch.equal(k, fmt.round_trip(torch.cat((k1, k2), dim=2))) and torch.equal(k, v)


@pytest.mark.parametrize("name", ["qwen3-tiny", "melt-tiny", "ouro-tiny"])
@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_every_family_decodes_quantized_continuous_as_static(name, kv_dtype):
    adapter = load_preset(name, dtype="fp32", device="cpu", seed=3, kv_dtype=kv_dtype, block_size=4)
    adapter.config.eos_token_id = None
    prompts, greedy = (
        ["1+2=", "x", "17*3=51; 4*4=", "abcdefghijklmnopqrstu"],
        Sampling(temperature=0.0, max_new_tokens=20),
    )
    continuous = [g.token_ids for g in adapter.generate(prompts, greedy)]
    adapter.batching = "static"
    assert [g.token_ids for g in adapter.generate(prompts, greedy)] == continuous
    ids = torch.tensor([[5, 9, 12, 7, 30, 2, 17, 3]])
    auto = load_preset(name, dtype="fp32", device="cpu", seed=3)
    assert not torch.equal(
        adapter.forward_logits(ids), auto.forward_logits(ids)
    )  # a full forward reads quantized rows too


def test_melt_int8_preemption_changes_nothing():
    adapter = load_preset("melt-tiny", dtype="fp32", device="cpu", seed=3, kv_dtype="int8", block_size=4)
    adapter.config.eos_token_id = None
    sampled = Sampling(temperature=1.0, top_p=0.7, max_new_tokens=16, n=2, seed=5)
    requests = [Request(p, sampled) for p in ["1+2=", "x", "17*3=51; 4*4=", "abcdefghijklmnopqrstu"]]

    def run() -> dict:
        got: dict = {}
        adapter.generate_requests(requests, lambda done: got.update({(r, j): g.token_ids for r, j, g in done}))
        return got

    expected = run()
    terms = analytic_terms(adapter.config, 4, "fp32")
    latent = max(8, adapter.config.chunk_size) * terms["latent_bytes_per_token"]
    adapter.kv_budget = (2 * 10 * 4 * terms["kv_bytes_per_token"] + latent) / 1e9  # two sequences' 10 blocks of eight
    assert run() == expected and adapter.preemptions > 0


def test_fp8_decodes_every_finite_code_as_torchs_cast():
    codes = torch.arange(256, dtype=torch.uint8)
    cast = codes.view(torch.float8_e4m3fn).float()
    finite = ~cast.isnan()  # 0x7f and 0xff: NaN, never written (values are clamped to +-448)
    assert finite.sum() == 254 and torch.equal(KV_FORMATS["fp8"].decode(codes)[finite], cast[finite])
