"""The model (`LoopedLM`) against transformers and against itself: cache vs recompute, chunked vs whole, fused vs split.

Two float32 computations of the same logits agree within what rounding allows on the model compared
(`tests/support/rounding.py`: 2 sqrt(n) u times the model's measured sensitivity), a bound that holds on any CPU's
kernels, where the fixed 1e-4 and 1e-5 were fitted to one.
"""

from __future__ import annotations

import pytest
import torch

import adapters
from adapters.base import AdapterError, Sampling
from adapters.engine.adapter import load_preset
from adapters.engine.kv.layouts import layout_of
from adapters.engine.kv.cache import KVCache
from adapters.engine.exits import ExitPolicy
from adapters.engine.generate import Decoder, Prompts, generate
from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.presets import preset
from adapters.engine.model import LoopedLM, to_melt
from tests.support.rounding import rounding_bound

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)


def tiny(name: str, **changes) -> LoopedLM:
    """A tiny preset with random weights, norms perturbed too so that every tensor matters."""
    model = random_model(preset(name).replace(**changes), seed=1, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


# --------------------------------------------------------------------------------- HF parity
@pytest.fixture(scope="module")
def hf_qwen3(tmp_path_factory):
    """A tiny random transformers Qwen3 (GQA, head_dim 24 != 64/4) saved as save_pretrained writes it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=99,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
            eos_token_id=2,
            pad_token_id=0,
        )
    ).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf_qwen3")
    hf.save_pretrained(path)
    return hf, path


@pytest.mark.numerics
def test_hf_qwen3_logits_and_greedy_match(hf_qwen3):
    hf, path = hf_qwen3
    engine = adapters.load(f"qwen3:{path}", dtype="fp32", device="cpu")
    assert engine.config.head_dim == 24 and engine.config.num_kv_heads == 2
    ids = torch.randint(3, 99, (2, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
    bound = rounding_bound(engine.model, lambda: engine.forward_logits(ids))
    assert (engine.forward_logits(ids) - ref).abs().max().item() < bound
    prompt = ids[:1, :11]
    with torch.no_grad():
        hf_out = hf.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    engine.config.eos_token_id = None  # compare the full 24 tokens, as transformers was told to
    engine.config.extra["eos_token_ids"] = []
    gen = engine.generate([prompt[0].tolist()], Sampling(temperature=0, max_new_tokens=24))[0]
    assert gen.token_ids == hf_out[0, 11:].tolist()
    assert gen.finish_reason == "length" and gen.prompt_tokens == 11 and gen.generated_tokens == 24


# ------------------------------------------------------------------ cache == full recompute
def _decode_logits(
    model: LoopedLM, ids: torch.Tensor, prefill: int, loops: int, chunk: int | None = None
) -> torch.Tensor:
    """Logits for positions prefill-1 .. N-1 from the static cache: one prefill (in chunks), then one token per step."""
    n = ids.shape[1]
    cache = KVCache(model.config, layout_of(model.config), 1, n, loops, torch.float32, "cpu")
    positions = torch.arange(n)[None]
    rows = []
    with torch.inference_mode():
        step = chunk or prefill
        for s0 in range(0, prefill, step):
            s1 = min(prefill, s0 + step)
            mask = None if s0 == 0 else torch.ones(1, 1, s1 - s0, s1, dtype=torch.bool).tril(s0)
            out = model.step(ids[:, s0:s1], positions[:, s0:s1], cache, s0, mask, loops=loops)
        rows.append(model.logits(out.states[-1]))
        for i in range(prefill, n):
            out = model.step(ids[:, i : i + 1], positions[:, i : i + 1], cache, i, None, loops=loops)
            rows.append(model.logits(out.states[-1]))
    return torch.stack(rows, dim=1)


@pytest.mark.numerics
@pytest.mark.parametrize(
    "name,loops",
    [
        ("qwen3-tiny", 1),
        ("ouro-tiny", 4),
        ("ouro-tiny", 2),
        ("melt-tiny", 4),
        ("melt-tiny", 3),
        ("coreloop-tiny", 4),
        ("coreloop-tiny", 2),
    ],
)
def test_cached_decoding_equals_full_recompute(name, loops):
    model = tiny(name, chunk_size=1)
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids, loops=loops).logits  # gated: chunk size 1, token by token
    cached = _decode_logits(model, ids, prefill=1 if name == "melt-tiny" else 7, loops=loops)
    start = ids.shape[1] - cached.shape[1]
    assert (cached - full[:, start:]).abs().max().item() < rounding_bound(model, lambda: model(ids, loops=loops).logits)


@pytest.mark.numerics
def test_melt_chunked_prefill_matches_chunkwise_forward():
    """Prefill in chunks of 4 through the cache gives the chunk-wise forward's logits at every chunk end."""
    model = tiny("melt-tiny", chunk_size=4)
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(ids).logits
        one_chunk = model(ids, chunk_size=12).logits
    bound = rounding_bound(model, lambda: model(ids).logits)
    for end in (4, 8, 12):
        cached = _decode_logits(model, ids[:, :end], prefill=end, loops=4, chunk=4)
        assert (cached[:, 0] - full[:, end - 1]).abs().max().item() < bound
    assert (one_chunk - full).abs().max().item() > 1e-3  # chunking changes what later tokens see


@pytest.mark.numerics
@pytest.mark.parametrize("spec,chunk", [("zoo:melt-tiny", None), ("preset:melt-tiny", 5)])
def test_forward_chunks_a_prompt_as_the_prefill_does(spec, chunk):
    """forward() (log-likelihood scoring, the conformance first-token check) gives the logits the first
    token is sampled from: random prompts whose lengths are not multiples of the chunk, one batch
    left-padded, on the shipped trained MELT (chunk 4) and a random one (chunk 5)."""
    adapter = adapters.load(spec, dtype="fp32", device="cpu", chunk_size=chunk)
    model, cfg = adapter.model, adapter.config
    gen = torch.Generator().manual_seed(6)
    lengths = [n for n in torch.randint(2, 30, (12,), generator=gen).tolist() if n % cfg.chunk_size]
    prompts = [torch.randint(3, 99, (n,), generator=gen).tolist() for n in lengths]
    batch = Prompts.left_padded(prompts, max(lengths), 0, torch.device("cpu"))
    cache = KVCache(cfg, layout_of(cfg), len(prompts), max(lengths), adapter.loops, torch.float32, "cpu")

    def forward_rows() -> torch.Tensor:
        return torch.stack([adapter.forward_logits(torch.tensor([p]))[0, -1] for p in prompts])

    with torch.inference_mode():
        prefill, _ = Decoder(model, batch, cache, adapter.loops, ExitPolicy()).prefill()
        forward = forward_rows()
    assert len(prompts) >= 8
    assert (forward - prefill).abs().max().item() < rounding_bound(model, forward_rows)
    assert forward.argmax(-1).tolist() == prefill.argmax(-1).tolist()


@pytest.mark.numerics
def test_gated_with_kv_mix_zero_is_the_looplm():
    looplm = tiny("ouro-tiny")
    melt = to_melt(looplm, chunk_size=4)
    ids = torch.randint(3, 99, (2, 14), generator=torch.Generator().manual_seed(5))
    ref = looplm(ids, return_loop_logits=True, return_attn_outputs=True)
    out = melt(ids, kv_mix=0.0, return_loop_logits=True, return_attn_outputs=True)
    loop_logits = rounding_bound(looplm, lambda: torch.stack(looplm(ids, return_loop_logits=True).loop_logits))
    assert (out.logits - ref.logits).abs().max().item() < loop_logits
    assert all((a - b).abs().max().item() < loop_logits for a, b in zip(out.loop_logits, ref.loop_logits))
    assert (out.exit_probs - ref.exit_probs).abs().max().item() < rounding_bound(looplm, lambda: looplm(ids).exit_probs)
    assert len(out.attn_outputs) == 4 and len(out.attn_outputs[0]) == 2 and out.attn_outputs[3][1].shape == (2, 14, 128)
    mixed = melt(ids, kv_mix=0.5).logits
    assert (mixed - ref.logits).abs().max().item() > 1e-4
    # gradients reach the gates when MELT rows are used, and the exit distribution sums to one per token
    melt.train()
    with torch.enable_grad():  # importing LightEval turns autograd off process-wide
        melt(ids, kv_mix=0.5).logits.logsumexp(-1).mean().backward()
    assert melt.shared[0].melt_gate.w_z.weight.grad.abs().sum() > 0
    torch.testing.assert_close(ref.exit_probs.sum(0), torch.ones(2, 14))


@pytest.mark.numerics
def test_last_loop_logits_are_the_output():
    model = tiny("ouro-tiny")
    ids = torch.randint(3, 99, (1, 9), generator=torch.Generator().manual_seed(6))
    out = model(ids, loops=3, return_loop_logits=True)
    assert len(out.loop_logits) == 3
    torch.testing.assert_close(out.loop_logits[-1], out.logits)


@pytest.mark.numerics
@pytest.mark.parametrize("variant", ["elementwise", "scalar", "last", "mean", "ema"])
def test_gate_variants_decode_like_recompute(variant):
    model = tiny("melt-tiny", gate_variant=variant, chunk_size=1)
    ids = torch.randint(3, 99, (1, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(ids).logits
    cached = _decode_logits(model, ids, prefill=1, loops=4)
    assert (cached - full).abs().max().item() < rounding_bound(model, lambda: model(ids).logits)


# ------------------------------------------------------------------------- the cache's entries
def test_coreloop_fills_one_entry_per_executed_layer():
    """Prelude and coda layers run once around the loop: the per_loop cache holds p + s * r + c
    entries (1 + 2 * 3 + 1 here), every one written by the prefill; the exit fill `read`, which reads a
    loop's state as the output, is refused on a model whose coda runs after the loop."""
    adapter = load_preset("coreloop-tiny", dtype="fp32", device="cpu", loops=3)
    caches: list[KVCache | None] = []
    generate(adapter.model, [[1, 5, 6]], GREEDY, loops=3, eos_ids=set(), on_cache=caches.append)
    assert caches[0].k.shape[0] == 8
    assert all(caches[0].k[e, :, :, :3].abs().sum() > 0 for e in range(8))
    read_at_2 = dict(loops=3, exit_policy="fixed", exit_loop=2, exit_fill="read")
    with pytest.raises(AdapterError, match="coda"):
        load_preset("coreloop-tiny", dtype="fp32", device="cpu", **read_at_2)
    with pytest.raises(AdapterError, match="coda"):  # a sweep's plan, before anything is stored
        adapters.inspect("preset:coreloop-tiny", **read_at_2)


@pytest.mark.numerics
def test_fused_projections_are_the_parameters_and_follow_training():
    """q/k/v and gate/up are each one parameter (one matmul, no second copy of the weights) whose row
    blocks are HF's tensors in state dicts; inference and training run the same forward, so it stays
    current through optimizer steps and dtype moves."""
    model = tiny("ouro-tiny")
    ids = torch.randint(3, 99, (2, 10), generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        before = model(ids).logits
    state, layer = model.state_dict(), model.shared[0]
    qkv = [state[f"model.layers.0.self_attn.{name}_proj.weight"] for name in "qkv"]
    gate_up = [state[f"model.layers.0.mlp.{name}_proj.weight"] for name in ("gate", "up")]
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight.detach(), torch.cat(qkv), rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight.detach(), torch.cat(gate_up), rtol=0, atol=0)
    assert not any(name.endswith(("q_proj.weight", "gate_proj.weight")) for name, _ in model.named_parameters())
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    assert sum(storages.values()) == sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.enable_grad():  # importing LightEval turns autograd off process-wide
        model(ids).logits.logsumexp(-1).mean().backward()
        opt.step()
        grad_path = model(ids).logits.detach()
    with torch.no_grad():
        no_grad_path = model(ids).logits
    torch.testing.assert_close(no_grad_path, grad_path)
    assert (no_grad_path - before).abs().max() > 1e-3
    bound = rounding_bound(model, lambda: model(ids).logits)  # float32 against float64 (whose norms run in float32)
    model.to(torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model.float()(ids).logits.double(), atol=bound, rtol=0)


@pytest.mark.numerics
def test_forward_follows_replaced_parameters():
    """Replacing parameters between calls (load_state_dict(assign=True), as checkpoint loading does,
    which also stacks HF's q/k/v and gate/up tensors) leaves nothing stale: the next forward uses
    the new weights exactly."""
    model = tiny("ouro-tiny")
    other = random_model(preset("ouro-tiny"), seed=5, dtype=torch.float32, device="cpu")
    ids = torch.randint(3, 99, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model(ids)
        model.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=True)
        replaced = model(ids).logits
        expected = other(ids).logits
    torch.testing.assert_close(replaced, expected, rtol=0, atol=0)
