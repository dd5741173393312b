"""The bytes a layout holds per token (`kv_terms`, `history_bytes`) against the tensors a static cache allocates, for
the natives and the sharing policies, in every KV dtype."""

from __future__ import annotations

import pytest
import torch

from adapters.engine.io.presets import preset
from adapters.engine.kv.accounting import history_bytes, kv_terms
from adapters.engine.kv.cache import KVCache
from adapters.engine.kv.layouts import GATED, PER_LOOP, STANDARD, policy_layout
from adapters.engine.kv.policies import KV_DTYPES
from measures import analytic_kv_bytes


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize(
    ("name", "policy"),
    [("qwen3-tiny", "standard"), ("ouro-tiny", "per-loop"), ("ouro-tiny", "shared-mean"), ("melt-tiny", "gated")],
)
def test_the_terms_are_the_bytes_a_static_cache_allocates(name, policy, kv_dtype):
    cfg = preset(name).replace(kv_dtype=kv_dtype)
    layout, loops = policy_layout(policy), 1 if cfg.kv_strategy == "standard" else 3
    terms = kv_terms(cfg, layout, loops, 4)
    for batch, tokens in [(1, 5), (2, 70)]:
        cache = KVCache(cfg, layout, batch, tokens, loops, torch.float32, "meta")
        assert cache.kv_bytes_allocated == analytic_kv_bytes(terms, tokens, batch)


def test_per_loop_grows_with_the_loops_and_sharing_keeps_the_plain_stack_s_count():
    cfg = preset("ouro-tiny")
    per_loop = [kv_terms(cfg, PER_LOOP, r, 2)["kv_bytes_per_token"] for r in (1, 2, 4)]
    assert per_loop[1] == 2 * per_loop[0] and per_loop[2] == 4 * per_loop[0]
    shared = kv_terms(cfg, policy_layout("shared-last"), 4, 2)
    assert shared == kv_terms(cfg, STANDARD, 4, 2) and shared["kv_bytes_per_token"] == per_loop[0]


def test_the_latent_is_melt_s_h_and_the_loop_history():
    melt = preset("melt-tiny")
    assert kv_terms(melt, GATED, 4, 2)["latent_bytes_per_token"] == melt.shared_layers * melt.hidden_size * 2
    assert kv_terms(melt, GATED, 4, 2)["latent_tokens"] == melt.chunk_size
    plain = preset("ouro-tiny")
    assert history_bytes(plain, 3, 4) == 0 and kv_terms(plain, PER_LOOP, 4, 4)["latent_tokens"] == 0
    conditioned = plain.replace(history="channel", history_window=3)
    assert history_bytes(conditioned, 5, 4) == 3 * plain.hidden_size * 5 * 4
    terms = kv_terms(conditioned, PER_LOOP, 4, 4)
    assert terms["latent_bytes_per_token"] == 3 * plain.hidden_size * 4 and terms["latent_tokens"] == 1
