"""The engine against transformers, against itself (cache vs recompute, batch vs single) and against its memory model.

Two float32 computations of the same logits agree within what rounding allows on the model compared
(`tests/support/rounding.py`: 2 sqrt(n) u times the model's measured sensitivity), a bound that holds on any CPU's
kernels, where the fixed 1e-4 and 1e-5 were fitted to one.
"""

from __future__ import annotations

import threading

import pytest
import torch

import adapters

from adapters.base import AdapterError, Sampling
from adapters.engine.families import family_of
from adapters.engine.cache import KVCache
from adapters.engine.io.checkpoint import random_model
from adapters.engine.config import LoopConfig
from adapters.engine.io.presets import PRESETS, preset
from adapters.engine.adapter import EngineAdapter, load_preset
from adapters.engine.exits import ExitPolicy
from adapters.engine.generate import Decoder, Prompts, generate
from adapters.engine.sampling import sample
from adapters.engine.memory import count_params, estimate, kv_bytes
from adapters.engine.model import LoopedLM
from adapters.engine.streams import stream_rows
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
            vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, max_position_embeddings=256, tie_word_embeddings=False,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, eos_token_id=2, pad_token_id=0,
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
def _decode_logits(model: LoopedLM, ids: torch.Tensor, prefill: int, loops: int, chunk: int | None = None) -> torch.Tensor:
    """Logits for positions prefill-1 .. N-1 from the static cache: one prefill (in chunks), then one token per step."""
    n = ids.shape[1]
    cache = KVCache(model.config, 1, n, loops, torch.float32, "cpu")
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
    [("qwen3-tiny", 1), ("ouro-tiny", 4), ("ouro-tiny", 2), ("melt-tiny", 4), ("melt-tiny", 3), ("coreloop-tiny", 4), ("coreloop-tiny", 2)],
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
    cache = KVCache(cfg, len(prompts), max(lengths), adapter.loops, torch.float32, "cpu")
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
    melt = looplm.to_melt(chunk_size=4)
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


# ---------------------------------------------------------------------------- memory model
def test_params_match_the_model_for_every_preset():
    for name in PRESETS:
        with torch.device("meta"):
            model = LoopedLM(preset(name))
        assert count_params(preset(name)) == sum(p.numel() for p in model.parameters()), name
    assert count_params(preset("qwen3-1.7b")) == 1_720_574_976


@pytest.mark.parametrize("name", ["qwen3-tiny", "ouro-tiny", "melt-tiny", "coreloop-tiny", "qwen3-1.7b", "ouro-1.4b", "ouro-2.6b", "melt-1.6b", "huginn-0125",
                                  "retrofit-llama-3.2-1b", "retrofit-tinyllama-1.1b"])
def test_analytic_kv_equals_allocated(name):
    cfg = preset(name)
    loop_counts = [1] if cfg.kv_strategy == "standard" else [1, 2, 4, 8]
    for batch, tokens in [(1, 5), (3, 17), (2, 100)]:
        for dtype, torch_dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
            for r in loop_counts:
                cache = KVCache(cfg, batch, tokens, r, torch_dtype, "meta")
                assert cache.kv_bytes_allocated == kv_bytes(cfg, tokens, batch, r, dtype) == estimate(cfg, tokens, batch, r, dtype).kv_bytes
            by_r = [kv_bytes(cfg, tokens, batch, r, "bf16") for r in loop_counts]
            if cfg.kv_strategy == "gated":
                assert len(set(by_r)) == 1
            if cfg.kv_strategy == "per_loop":  # one entry per executed layer, p + s * r + c (for p = c = 0 proportional to r)
                per_entry = by_r[0] // family_of(cfg).kv.entries(cfg, 1)
                assert by_r == [per_entry * (cfg.prelude_layers + cfg.shared_layers * r + cfg.coda_layers) for r in loop_counts]


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


# ------------------------------------------------------------------------------ generation
@pytest.mark.numerics
@pytest.mark.parametrize("name", ["qwen3-tiny", "ouro-tiny", "melt-tiny", "coreloop-tiny"])
def test_batched_greedy_equals_one_by_one(name):
    adapter = load_preset(name, dtype="fp32", device="cpu", seed=3)
    adapter.config.eos_token_id = None
    prompts = ["1+2=", "a much longer prompt, padded less", "x", "17*3=51; 4*4="]
    batched = adapter.generate(prompts, GREEDY)
    single = [adapter.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    assert [g.prompt_tokens for g in batched] == [len(adapter.tokenizer(p)["input_ids"]) for p in prompts]
    assert len({tuple(g.token_ids) for g in batched}) > 1


@pytest.mark.numerics
def test_greedy_generation_follows_the_full_forward():
    """Each greedy MELT token is the argmax of the cache-free chunk-wise forward with the same chunks:
    the prefill's (counted back from the prompt's end: 2 + 3 + 3) then one per decoded token."""
    adapter = load_preset("melt-tiny", dtype="fp32", device="cpu", seed=5, chunk_size=3)
    adapter.config.eos_token_id, adapter.tokenizer = None, None
    prompt = [1, 10, 20, 30, 40, 50, 60, 70]
    gen = adapter.generate([prompt], GREEDY)[0]
    ids = torch.tensor([prompt + gen.token_ids[:-1]])
    with torch.no_grad():
        logits = adapter.model(ids, chunk_size=[2, 3, 3] + [1] * (len(gen.token_ids) - 1)).logits
    assert logits[0, len(prompt) - 1 :].argmax(-1).tolist() == gen.token_ids


def test_seed_reproduces_samples_and_n_is_prompt_major():
    adapter = load_preset("qwen3-tiny", dtype="fp32", device="cpu")
    adapter.config.eos_token_id = None
    s = Sampling(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=16, n=3, seed=11)
    a, b = adapter.generate(["abc", "de"], s), adapter.generate(["abc", "de"], s)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] and len(a) == 6
    assert len({tuple(g.token_ids) for g in a[:3]}) > 1  # three different samples of prompt 0
    assert [g.prompt_tokens for g in a] == [4, 4, 4, 3, 3, 3]
    c = adapter.generate(["abc", "de"], Sampling(temperature=1.0, top_p=0.9, max_new_tokens=16, n=3, seed=12))
    assert [g.token_ids for g in c] != [g.token_ids for g in a]


def test_top_p_never_samples_outside_the_nucleus():
    probs = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])  # nucleus at 0.7: 0.4 + 0.25 + 0.15 (0.65 < 0.7)
    logits = probs.log().expand(4000, -1).contiguous()
    keys = list(range(4000))  # 4000 streams, one draw each
    rows, later = torch.tensor(stream_rows(keys, [0] * 4000)), torch.tensor(stream_rows(keys, [1] * 4000))
    drawn = sample(logits, Sampling(temperature=1.0, top_p=0.7), rows)
    assert set(drawn.tolist()) == {1, 3, 4}
    frac = torch.bincount(drawn, minlength=6).float() / 4000  # renormalised: 0.4/0.8, 0.25/0.8, 0.15/0.8
    assert abs(frac[1] - 0.5) < 0.04 and abs(frac[3] - 0.3125) < 0.04
    top_k = sample(logits, Sampling(temperature=1.0, top_p=1.0, top_k=2), later)
    assert set(top_k.tolist()) == {1, 3}
    assert sample(logits[:3], Sampling(temperature=0.0), rows[:3]).tolist() == [1, 1, 1]


def test_stop_strings_eos_and_length():
    adapter = load_preset("qwen3-tiny", dtype="fp32", device="cpu", seed=2)
    free = adapter.generate(["hello"], Sampling(temperature=0, max_new_tokens=20))[0]
    assert free.finish_reason == "length" and free.generated_tokens == 20 and free.text == adapter.tokenizer.decode(free.token_ids)
    stop = free.text[5:7]
    cut = adapter.generate(["hello"], Sampling(temperature=0, max_new_tokens=20, stop=(stop,)))[0]
    first = free.text.find(stop)
    assert cut.finish_reason == "stop" and cut.text == free.text[:first]
    assert cut.token_ids == free.token_ids[: first + len(stop)]
    adapter.config.eos_token_id = free.token_ids[3]  # make the 4th greedy token the end of sequence
    ended = adapter.generate(["hello"], Sampling(temperature=0, max_new_tokens=20))[0]
    assert ended.finish_reason == "eos" and ended.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[3]) + 1]
    assert ended.prefill_seconds > 0 and ended.decode_seconds > 0


def test_context_limit_and_prompt_errors():
    adapter = load_preset("qwen3-tiny", dtype="fp32", device="cpu")
    adapter.config.eos_token_id = None
    gen = adapter.generate([[1] * 500], Sampling(temperature=0, max_new_tokens=100))[0]
    assert gen.finish_reason == "length" and gen.prompt_tokens + gen.generated_tokens == adapter.max_context
    with pytest.raises(AdapterError, match="context"):
        adapter.generate([[1] * 600], GREEDY)
    with pytest.raises(AdapterError, match="vocabulary"):
        adapter.generate([[1, 500]], GREEDY)


@pytest.mark.parametrize("fill", ["read", "copy"])
def test_exit_policies_record_loops_and_read_that_loop(fill):
    """Read semantics: every loop runs, the policy's loop is read. A fixed loop reads the same under `copy`, which
    skips the later loops: loop 2 attends only to loops 1 and 2's K/V, which `copy` leaves as they are."""
    adapter = load_preset("ouro-tiny", dtype="fp32", device="cpu", exit_policy="fixed", exit_loop=2, exit_fill=fill)
    adapter.config.eos_token_id = None
    prompt = [1, 11, 12, 13]
    gen = adapter.generate([prompt], Sampling(temperature=0, max_new_tokens=6))[0]
    assert gen.loops_used == [2] * 6
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        loop2 = adapter.model(ids, return_loop_logits=True).loop_logits[1]
    assert loop2[0, len(prompt) - 1 : -1].argmax(-1).tolist() == gen.token_ids
    thr = load_preset("ouro-tiny", dtype="fp32", device="cpu", exit_policy="threshold", exit_threshold=0.5, exit_fill="read")
    with torch.no_grad():  # a gate that exits early for some tokens and late for others
        thr.model.model.early_exit_gate.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    gen = thr.generate([prompt], Sampling(temperature=0, max_new_tokens=30))[0]
    probs = thr.model(torch.tensor([prompt + gen.token_ids])).exit_probs[:, 0, len(prompt) - 1 : -1]
    expected = ((probs.cumsum(0) < 0.5).sum(0) + 1).clamp(max=4).tolist()
    assert gen.loops_used == expected[: len(gen.loops_used)] and len(set(expected)) > 1
    alone = load_preset("ouro-tiny", exit_threshold=0.5).describe()["exit_policy"]  # a threshold below 1 is the policy
    assert (alone["kind"], alone["threshold"]) == ("threshold", 0.5)


def test_loop_override_changes_output_and_cache():
    adapter = load_preset("ouro-tiny", dtype="fp32", device="cpu", loops=8)
    assert adapter.describe()["kv_bytes_per_token"] == 2 * 2 * 8 * 2 * 32 * 4
    ids = torch.tensor([[1, 4, 5, 6]])
    eight = adapter.forward_logits(ids)
    adapter.loops = 2
    assert (adapter.forward_logits(ids) - eight).abs().max() > 1e-4
    with pytest.raises(AdapterError, match="loops"):
        adapter.loops = 0
    with pytest.raises(AdapterError, match="standard"):
        load_preset("qwen3-tiny", loops=2)
    d = load_preset("melt-tiny", loops=8).describe()
    assert d["kv_strategy"] == "gated" and d["gate"] == "elementwise" and d["trained_loops"] == 4 and d["loops"] == 8
    assert d["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4 and d["config"]["shared_layers"] == 2


# ------------------------------------------------------------------------------- configs
@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads"),
        (dict(loops=0), "loops"),
        (dict(loops=-2), "loops"),
        (dict(kv_strategy="paged"), "kv_strategy"),
        (dict(kv_strategy="gated", shared_layers=0, prelude_layers=2), "gated"),
        (dict(gate_variant="max"), "gate_variant"),
        (dict(norm_layout="post"), "norm_layout"),
        (dict(kv_strategy="standard", loops=4), "standard"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(exit_threshold=1.5), "early_exit_threshold"),
        (dict(exit_threshold="0.5"), "early_exit_threshold"),
        (dict(exit_threshold=0.5, exit_gate=False), "exit gate"),
    ],
)
def test_invalid_configs_name_the_field(changes, field):
    with pytest.raises(AdapterError, match=field):
        LoopConfig(**{**preset("melt-tiny").to_dict(), **changes})


def test_unknown_preset_override_and_spec():
    import adapters

    with pytest.raises(AdapterError, match="qwen3-tiny"):
        load_preset("qwen9")
    with pytest.raises(AdapterError, match="max_batch"):
        load_preset("qwen3-tiny", beam=4)
    with pytest.raises(AdapterError, match="fp32"):
        load_preset("qwen3-tiny", dtype="int3")
    assert isinstance(adapters.load("preset:melt-tiny"), EngineAdapter)


def test_token_id_prompts_without_tokenizer():
    model = random_model("ouro-tiny", 0, torch.float32, "cpu")
    adapter = EngineAdapter("test", model, None)
    gen = adapter.generate([[1, 2, 3]], GREEDY)[0]
    assert gen.text is None and gen.generated_tokens >= 1
    with pytest.raises(AdapterError, match="token ids"):
        adapter.generate(["text"], GREEDY)


def test_generate_function_pads_left_and_reports_counts():
    model = tiny("qwen3-tiny")
    gens = generate(model, [[1, 5], [1, 5, 6, 7, 8]], GREEDY, loops=1, eos_ids=set(), exit_policy=ExitPolicy())
    assert [g.prompt_tokens for g in gens] == [2, 5] and all(g.generated_tokens == 12 for g in gens)


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
