"""The analytic memory model (`memory.py`) against the model's parameters and the caches the engine allocates."""

from __future__ import annotations

import threading

import pytest
import torch

from adapters.base import Sampling
from adapters.engine.adapter import load_preset
from adapters.engine.kv.layouts import layout_of
from adapters.engine.kv.cache import KVCache
from adapters.engine.io.presets import PRESETS, preset
from adapters.engine.memory import count_params, estimate, kv_bytes
from adapters.engine.model import LoopedLM

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)


def test_params_match_the_model_for_every_preset():
    for name in PRESETS:
        with torch.device("meta"):
            model = LoopedLM(preset(name))
        assert count_params(preset(name)) == sum(p.numel() for p in model.parameters()), name
    assert count_params(preset("qwen3-1.7b")) == 1_720_574_976


@pytest.mark.parametrize(
    "name",
    [
        "qwen3-tiny",
        "ouro-tiny",
        "melt-tiny",
        "coreloop-tiny",
        "qwen3-1.7b",
        "ouro-1.4b",
        "ouro-2.6b",
        "melt-1.6b",
        "huginn-0125",
        "retrofit-llama-3.2-1b",
        "retrofit-tinyllama-1.1b",
    ],
)
def test_analytic_kv_equals_allocated(name):
    cfg = preset(name)
    loop_counts = [1] if cfg.kv_strategy == "standard" else [1, 2, 4, 8]
    for batch, tokens in [(1, 5), (3, 17), (2, 100)]:
        for dtype, torch_dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
            for r in loop_counts:
                cache = KVCache(cfg, layout_of(cfg), batch, tokens, r, torch_dtype, "meta")
                assert (
                    cache.kv_bytes_allocated
                    == kv_bytes(cfg, tokens, batch, r, dtype)
                    == estimate(cfg, tokens, batch, r, dtype).kv_bytes
                )
            by_r = [kv_bytes(cfg, tokens, batch, r, "bf16") for r in loop_counts]
            if cfg.kv_strategy == "gated":
                assert len(set(by_r)) == 1
            if (
                cfg.kv_strategy == "per_loop"
            ):  # one entry per executed layer, p + s * r + c (for p = c = 0 proportional to r)
                per_entry = by_r[0] // layout_of(cfg).entries(cfg, 1)
                assert by_r == [
                    per_entry * (cfg.prelude_layers + cfg.shared_layers * r + cfg.coda_layers) for r in loop_counts
                ]


def test_static_generate_allocates_what_the_estimate_says_and_tracks_usage():
    adapter = load_preset("ouro-tiny", dtype="fp32", device="cpu", batching="static")
    adapter.config.eos_token_id, adapter.tokenizer = None, None  # no end of sequence: all 60 tokens
    seen: list[dict] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            seen.append(adapter.memory())
            stop.wait(0.0005)

    thread = threading.Thread(target=sampler)
    thread.start()
    gens = adapter.generate([[1, 5, 6, 7], [1, 8]], Sampling(temperature=1.0, max_new_tokens=60, seed=0))
    stop.set()
    thread.join()
    tokens = 4 + 60
    expected = estimate(adapter.config, tokens, batch=2, loops=4, dtype="fp32")
    mem = adapter.memory()
    assert mem["kv_bytes_peak"] == expected.kv_bytes and mem["weights_bytes"] == expected.weights_bytes
    assert mem["kv_bytes_allocated"] == 0  # the cache lives only during generate
    live = [m for m in seen if m["kv_bytes_allocated"]]
    assert live and all(m["kv_bytes_used"] <= m["kv_bytes_allocated"] == expected.kv_bytes for m in live)
    used = [m["kv_bytes_used"] for m in live]
    assert used == sorted(used) and used[-1] > used[0]
    assert all(g.loops_used == [4] * 60 for g in gens)
    adapter.loops = 2
    adapter.generate([[1, 5]], Sampling(temperature=0, max_new_tokens=3))
    assert adapter.memory()["kv_bytes_peak"] == expected.kv_bytes  # peak kept until reset
    adapter.reset_memory_peak()
    assert adapter.memory()["kv_bytes_peak"] == 0
