"""KV layouts and policies (`kv_policy`): each layout's entries, the one table from a name to its layout, the write
rules on real tensors, the pool's and the static cache's bytes against the analytic model for every family, policy
and dtype, and their composition with exits, continuous batching, seeded sampling and preemption (the static path as
the reference)."""

from __future__ import annotations

import pytest
import torch

import adapters
from adapters.base import AdapterError, Sampling
from adapters.engine.adapter import load_preset
from adapters.engine.kv.layouts import GATED, LAYOUTS, PER_LOOP, STANDARD, SharedEMA, layout_of, policy_layout
from adapters.engine.kv.cache import KVCache
from adapters.engine.kv.policies import KV_DTYPES, admitted
from adapters.engine.io.presets import preset
from adapters.engine.memory import analytic_terms, kv_bytes
from adapters.engine.serving.paged import BlockPool
from adapters.testing import save_tiny_huginn

PROMPTS = ["1+2=", "x", "17*3=51; 4*4=", "abcdefghijklmnopqrstu"]
GREEDY = Sampling(temperature=0.0, max_new_tokens=20)
SAMPLED = Sampling(temperature=1.0, top_p=0.7, max_new_tokens=16, n=2, seed=5)
SHARED = ["shared-last", "shared-mean", "shared-ema", "shared-ema:0.25"]


def engine(name: str, **overrides):
    adapter = load_preset(name, dtype="fp32", device="cpu", seed=3, **overrides)
    adapter.config.eos_token_id = None  # every sample runs max_new_tokens: several blocks
    return adapter


def outputs(adapter, sampling: Sampling) -> list[tuple[list[int], list[int]]]:
    return [(g.token_ids, g.loops_used) for g in adapter.generate(PROMPTS, sampling)]


def policies(cfg) -> list[str]:
    return admitted(cfg.kv_strategy, cfg.recurrent)


# ------------------------------------------------------------------------------ the layouts and their table
def test_the_standard_layout_is_one_entry_per_layer_at_every_loop():
    cfg = preset("coreloop-tiny")  # 1 + 2 + 1 layers
    assert STANDARD.entries(cfg, 4) == cfg.num_layers == 4
    assert STANDARD.table(cfg, 3) == [[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]]
    assert not STANDARD.grows_with_loops and not STANDARD.has_latent(cfg) and not STANDARD.reads_latest
    old, new = torch.ones(2), torch.zeros(2)
    assert STANDARD.fold(old, new, 1) is new  # a loop's K/V replace the entry's


def test_the_gated_layout_is_one_entry_per_layer_and_a_latent_per_shared_layer():
    cfg = preset("melt-tiny")
    assert GATED.entries(cfg, 8) == cfg.num_layers and GATED.table(cfg, 3)[0] == [0, 0, 0]
    assert GATED.latent_width(cfg) == cfg.shared_layers * cfg.hidden_size and GATED.latent_tokens(cfg) == cfg.chunk_size


def test_a_config_runs_its_strategy_s_layout_unless_a_policy_names_another():
    """`layout_of` is the one lookup: the natives by KV strategy, a policy's by name (shared-ema's with its ALPHA)."""
    ouro, melt, qwen = preset("ouro-tiny"), preset("melt-tiny"), preset("qwen3-tiny")
    assert (layout_of(ouro), layout_of(melt), layout_of(qwen)) == (PER_LOOP, GATED, STANDARD)
    assert layout_of(ouro.replace(kv_policy="shared-last")) is LAYOUTS["shared-last"]
    ema = layout_of(ouro.replace(kv_policy="shared-ema:0.3"))
    assert isinstance(ema, SharedEMA) and ema.alpha == 0.3 and ema.policy == "shared-ema:0.3"
    assert policy_layout("shared-ema").policy == "shared-ema"  # the default ALPHA is not written out


# ------------------------------------------------------------------------------ write rules
def test_each_policy_leaves_its_fold_of_a_tokens_loops():
    """Three loops of one token written into a static cache: shared-last keeps the last, shared-mean their mean,
    shared-ema (ALPHA 0.25) 0.25 * new + 0.75 * old in turn, per-loop each loop's own."""
    loops = [torch.randn(1, 2, 1, 32, generator=torch.Generator().manual_seed(t)) for t in range(3)]
    ema = loops[0]
    for new in loops[1:]:
        ema = 0.25 * new + 0.75 * ema
    expected = {"shared-last": loops[2], "shared-mean": sum(loops) / 3, "shared-ema:0.25": ema}
    for policy, want in expected.items():
        cfg = preset("ouro-tiny").replace(kv_policy=policy, loops=3)
        cache = KVCache(cfg, layout_of(cfg), 1, 4, 3, torch.float32, "cpu")
        for t, k in enumerate(loops):
            read, _ = cache.update(0, t, k, k, slot=0)
            assert torch.equal(read, k)  # the token's own loop t reads its loop-t K/V
        later, _ = cache.update(0, 0, loops[0], loops[0], slot=1)  # a later token reads the entry
        torch.testing.assert_close(later[:, :, :1], want, rtol=1e-6, atol=1e-6)  # float32 sums: a few ulps
    per_loop_cfg = preset("ouro-tiny").replace(loops=3)
    per_loop = KVCache(per_loop_cfg, layout_of(per_loop_cfg), 1, 4, 3, torch.float32, "cpu")
    for t, k in enumerate(loops):
        assert torch.equal(per_loop.update(0, t, k, k, slot=0)[0][:, :, :1], k)


def test_a_frozen_row_keeps_the_fold_of_the_loops_it_ran():
    """The static path's exits (`FrozenCache`): row 1 exits after loop 2 of 4; under shared-mean its entry stays the
    mean of its first two loops while row 0's takes all four (float32: the fold of old with itself is exact)."""
    from adapters.engine.exits import FrozenCache

    loops = [torch.randn(2, 2, 1, 32, generator=torch.Generator().manual_seed(t)) for t in range(4)]
    cfg = preset("ouro-tiny").replace(kv_policy="shared-mean")
    active = torch.ones(2, dtype=torch.bool)
    cache = FrozenCache(KVCache(cfg, layout_of(cfg), 2, 4, 4, torch.float32, "cpu"), active)
    for t, k in enumerate(loops):
        cache.update(0, t, k, k, slot=0)
        if t == 1:
            active[1] = False
    held, _ = cache.cache.stored(0, 3, 0, 1)
    assert torch.equal(held[1], (loops[0] + (loops[1] - loops[0]) / 2)[1])
    torch.testing.assert_close(held[0], (sum(loops) / 4)[0], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ exact bytes
FAMILIES = [
    "qwen3-tiny",
    "ouro-tiny",
    "coreloop-tiny",
    "melt-tiny",
    "ouro-1.4b",
    "huginn-0125",
    "retrofit-llama-3.2-1b",
    "melt-1.6b",
]


@pytest.mark.parametrize("name", FAMILIES)
def test_caches_hold_the_analytic_bytes_for_every_policy_and_dtype(name):
    """The static cache's tensors and the pool's blocks, at several lengths and loop counts, hold exactly the analytic
    bytes of every policy the family takes in every dtype (scales included): counted from the tensors themselves."""
    base = preset(name)
    loop_counts = [1] if base.kv_strategy == "standard" else [1, 4, 32]
    for policy in policies(base):
        for kv_dtype in KV_DTYPES:
            cfg = base.replace(kv_policy=policy, kv_dtype=kv_dtype)
            for r in loop_counts:
                per_token = analytic_terms(cfg, r, "bf16")["kv_bytes_per_token"]
                for batch, tokens in [(1, 5), (3, 17), (2, 100)]:
                    cache = KVCache(cfg, layout_of(cfg), batch, tokens, r, torch.bfloat16, "meta")
                    assert cache.k.numel() * cache.k.element_size() * 2 == per_token * tokens * batch
                    assert cache.kv_bytes_allocated == kv_bytes(cfg, tokens, batch, r, "bf16")  # with MELT's latent
                    pool = BlockPool(
                        cfg,
                        layout_of(cfg),
                        r,
                        num_blocks=-(-tokens // 4) * batch,
                        block_size=4,
                        latent_tokens=0,
                        dtype=torch.bfloat16,
                        device="meta",
                    )
                    assert 2 * pool.k.numel() * pool.k.element_size() == pool.manager.num_blocks * 4 * per_token


def test_sharing_holds_one_entry_per_layer_and_int8_under_three_tenths_on_the_zoo():
    """shared-* hold 1/r of per-loop's entries on a p = c = 0 model; on every zoo model (float32 on the CPU) int8 and fp8
    hold (head_dim + 4) / (4 head_dim) of auto's bytes per token, at most 0.30."""
    from adapters.engine.config import LoopConfig
    from adapters.zoo import zoo_info, zoo_names

    ouro = preset("ouro-tiny")
    for policy in SHARED:
        assert (
            analytic_terms(ouro.replace(kv_policy=policy), 4, "fp32")["kv_bytes_per_token"] * 4
            == analytic_terms(ouro, 4, "fp32")["kv_bytes_per_token"]
        )
    for name in zoo_names():
        cfg = LoopConfig.from_dict(zoo_info(name)["config"])
        auto = analytic_terms(cfg, None, "fp32")["kv_bytes_per_token"]
        for kv_dtype in ("int8", "fp8"):
            quantized = analytic_terms(cfg.replace(kv_dtype=kv_dtype), None, "fp32")["kv_bytes_per_token"]
            assert quantized * 4 * cfg.head_dim == auto * (cfg.head_dim + 4) and quantized <= 0.30 * auto, name


@pytest.mark.parametrize("policy", ["shared-last", "shared-mean"])
def test_a_run_reports_the_pool_it_held(policy):
    """After a continuous run the adapter's peak is whole blocks of the analytic bytes per token."""
    adapter = engine("ouro-tiny", kv_policy=policy, kv_dtype="int8", block_size=4)
    adapter.generate(["abc"], Sampling(temperature=0.0, max_new_tokens=9))
    per_token = adapter.describe()["kv_bytes_per_token"]
    assert per_token == 2 * 2 * 2 * (32 + 4)  # K and V x 2 layers x 2 KV heads x (32 int8 values + a float32 scale)
    assert adapter.memory()["kv_bytes_peak"] == 3 * 4 * per_token  # 3 + 9 = 12 tokens: three blocks of 4


# ------------------------------------------------------------------------------ semantics
@pytest.mark.parametrize("policy", SHARED)
def test_sharing_prefills_as_per_loop_and_shares_at_decoding(policy):
    """A prompt prefilled in one step is per-loop's exactly (the first token, the scored logits): the step's tokens
    read one another's current loop; decoding then reads earlier tokens' shared entry, so the outputs part; at
    r = 1 every policy is per-loop."""
    per_loop, shared = engine("ouro-tiny"), engine("ouro-tiny", kv_policy=policy)
    ids = torch.tensor([[5, 9, 12, 7, 30, 2]])
    assert torch.equal(per_loop.forward_logits(ids), shared.forward_logits(ids))
    a, b = outputs(per_loop, GREEDY), outputs(shared, GREEDY)
    assert [x[0][0] for x in a] == [x[0][0] for x in b] and a != b
    assert outputs(engine("ouro-tiny", loops=1, kv_policy=policy), GREEDY) == outputs(
        engine("ouro-tiny", loops=1), GREEDY
    )


# ------------------------------------------------------------------------------ composition
@pytest.mark.parametrize("policy", ["per-loop", *SHARED])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_continuous_equals_static_under_every_policy_and_dtype(policy, kv_dtype):
    """Greedy on blocks of 4 (prompts across block edges) on ouro-tiny and coreloop-tiny (prelude and coda): the
    continuous engine's tokens are the static path's."""
    for name in ("ouro-tiny", "coreloop-tiny"):
        adapter = engine(name, kv_policy=policy, kv_dtype=kv_dtype, block_size=4)
        continuous = outputs(adapter, GREEDY)
        adapter.batching = "static"
        assert outputs(adapter, GREEDY) == continuous, name


@pytest.mark.parametrize("policy", SHARED)
@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_exits_under_sharing_match_static_and_leave_the_exit_loops_entry(policy, kv_dtype):
    """Threshold exits (copy fill): the same tokens and exit loops as the static path. An exited token's entry is
    what its loops up to the exit left (the fill copies nothing: every loop maps to the one entry; the static path's
    frozen rows write back what their entry holds, which the fold keeps)."""
    adapter = engine("ouro-tiny", kv_policy=policy, kv_dtype=kv_dtype, exit_policy="threshold", exit_threshold=0.3)
    continuous = outputs(adapter, GREEDY)
    adapter.batching = "static"
    assert outputs(adapter, GREEDY) == continuous
    assert {loop for _, loops in continuous for loop in loops} != {4}  # some tokens exited early


@pytest.mark.parametrize("policy", ["shared-last", "shared-ema"])
def test_seeded_samples_do_not_depend_on_cap_or_batching(policy):
    adapter = engine("ouro-tiny", kv_policy=policy, kv_dtype="fp8")
    by_cap = {}
    for cap in (1, 3, 32):
        adapter.max_batch = cap
        by_cap[cap] = outputs(adapter, SAMPLED)
    adapter.batching = "static"
    assert by_cap[1] == by_cap[3] == by_cap[32] == outputs(adapter, SAMPLED)


def test_preemption_changes_nothing_under_sharing_and_int8():
    adapter = engine("ouro-tiny", kv_policy="shared-mean", kv_dtype="int8", block_size=4)
    expected = outputs(adapter, SAMPLED)
    per_token = analytic_terms(adapter.config, 4, "fp32")["kv_bytes_per_token"]
    adapter.kv_budget = 2 * 10 * 4 * per_token / 1e9  # two sequences' blocks (22 + 16 tokens: 10 blocks) of eight
    assert outputs(adapter, SAMPLED) == expected and adapter.preemptions > 0


def test_huginn_latest_m4_is_per_loop_without_exits_and_matches_static_with_them(tmp_path):
    spec = f"huginn:{save_tiny_huginn(tmp_path / 'h')}"
    plain = adapters.load(spec, dtype="fp32", device="cpu")
    latest = adapters.load(spec, dtype="fp32", device="cpu", kv_policy="latest-m4")
    assert latest.describe()["kv_policy"] == "latest-m4" and plain.describe()["kv_policy"] == "per-loop"
    assert outputs(latest, GREEDY) == outputs(plain, GREEDY)
    exits = adapters.load(
        spec, dtype="fp32", device="cpu", kv_policy="latest-m4", exit_criterion="kl", exit_threshold=1e-3
    )
    continuous = outputs(exits, GREEDY)
    exits.batching = "static"
    assert outputs(exits, GREEDY) == continuous
    for policy, kv_dtype in (
        ("shared-last", "int8"),
        ("shared-ema", "fp8"),
    ):  # the recurrent state's draws beside sharing
        shared = adapters.load(spec, dtype="fp32", device="cpu", kv_policy=policy, kv_dtype=kv_dtype, block_size=4)
        continuous = outputs(shared, SAMPLED)
        shared.batching = "static"
        assert outputs(shared, SAMPLED) == continuous


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "name, overrides, message",
    [
        (
            "qwen3-tiny",
            {"kv_policy": "shared-last"},
            (
                "kv_policy shared-last applies to looped per-loop families (ouro, huginn, retrofit, ifm); "
                "this model (qwen3, standard KV) takes standard"
            ),
        ),
        ("melt-tiny", {"kv_policy": "shared-mean"}, "takes gated"),
        ("ouro-tiny", {"kv_policy": "gated"}, "kv_policy gated applies to gated (MELT) models"),
        ("ouro-tiny", {"kv_policy": "latest-m4"}, "applies to the recurrent-depth families (huginn, retrofit)"),
        ("ouro-tiny", {"kv_policy": "shared-ema:1"}, "needs ALPHA in (0, 1)"),
        ("ouro-tiny", {"kv_policy": "shared-first"}, "kv_policy must be one of"),
        ("ouro-tiny", {"kv_dtype": "int4"}, "kv_dtype='int4' is not one of auto, int8, fp8"),
        (
            "ouro-tiny",
            {"kv_policy": "shared-last", "exit_policy": "threshold", "exit_threshold": 0.5, "exit_fill": "masked"},
            "exit_fill 'masked' needs per-loop K/V",
        ),
    ],
)
def test_a_policy_the_family_cannot_run_is_refused_at_inspect_and_load(name, overrides, message):
    for call in (adapters.inspect, adapters.load):
        with pytest.raises(AdapterError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
            call(f"preset:{name}", device="cpu", **overrides)
        assert "\n" not in str(err.value)


def test_a_checkpoint_is_saved_without_the_runs_kv_policy_and_dtype(tmp_path):
    from adapters.engine.io.checkpoint import save_checkpoint

    adapter = load_preset("ouro-tiny", device="cpu", kv_policy="shared-last", kv_dtype="int8")
    save_checkpoint(adapter.model, tmp_path / "ckpt")
    reloaded = adapters.load(f"ouro:{tmp_path / 'ckpt'}", device="cpu")
    assert (reloaded.describe()["kv_policy"], reloaded.describe()["kv_dtype"]) == ("per-loop", "auto")
    assert adapter.describe()["kv_policy"] == "shared-last"  # the running model keeps its own


def test_describe_and_inspect_carry_the_policy_dtype_and_bytes():
    facts = adapters.inspect("preset:ouro-tiny", device="cpu", kv_policy="shared-ema:0.3", kv_dtype="fp8")
    adapter = load_preset("ouro-tiny", device="cpu", kv_policy="shared-ema:0.3", kv_dtype="fp8")
    for d in (facts, adapter.describe()):
        assert (d["kv_policy"], d["kv_dtype"], d["kv_bytes_per_token"]) == ("shared-ema:0.3", "fp8", 2 * 2 * 2 * 36)
        assert d["analytic"]["kv_bytes_per_token"] == d["kv_bytes_per_token"]
    native = {
        name: adapters.inspect(f"preset:{name}", device="cpu")["kv_policy"]
        for name in ("qwen3-tiny", "ouro-tiny", "melt-tiny")
    }
    assert native == {"qwen3-tiny": "standard", "ouro-tiny": "per-loop", "melt-tiny": "gated"}
    assert layout_of(adapter.config).policy == "shared-ema:0.3"
