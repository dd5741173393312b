"""Per-token exits that skip work (`adapters.engine.exits`): the continuous engine's active set against the
static path's masked full step, the loops each token runs, what a skipped loop leaves in the KV, and the
pool's accounting with exits on."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tests.support.kv_pool import Watch, engine_over, pool_for, tiny_budget

import adapters
from adapters.base import AdapterError, Request, Sampling, check_exit_threshold
from adapters.engine.adapter import EngineAdapter, sequences_of
from adapters.engine.kv.layouts import PER_LOOP
from adapters.engine.exits import ExitPolicy
from adapters.engine.generate import generate
from adapters.engine.io.presets import PRESETS
from adapters.zoo import zoo_names

pytestmark = pytest.mark.numerics  # batching paths agree: run again under a second ATen CPU capability by .ci/run

PROMPTS = ["1+2=", "x", "17*3=51; 4*4=", "abcdefghijklmnopqrstu"]
GREEDY = Sampling(temperature=0.0, max_new_tokens=16)
SAMPLED = Sampling(temperature=1.0, top_p=0.9, max_new_tokens=16, n=2, seed=5)


def load(spec: str, **overrides) -> EngineAdapter:
    """A tiny model whose exits vary from token to token: Ouro's random gate scaled up (it sits near 0.5
    otherwise). Huginn's initial state is drawn, per sample, so the two paths draw the same states."""
    adapter = adapters.load(spec, dtype="fp32", device="cpu", **overrides)
    adapter.config.eos_token_id = None  # lengths set by max_new_tokens
    gate = adapter.model.model.early_exit_gate
    if gate is not None:
        with torch.no_grad():
            gate.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    return adapter


def run(adapter: EngineAdapter, sampling: Sampling, batching: str) -> list[tuple[list[int], list[int] | None]]:
    adapter.batching = batching
    return [(g.token_ids, g.loops_used) for g in adapter.generate(PROMPTS, sampling)]


# (model, overrides): every criterion and fill on Ouro, MELT and the Huginn-style model. The two paths run the same
# arithmetic on batches of other sizes, whose float rounding may differ in the last place: a kl or entropy value
# within ~1e-6 of its threshold could exit at another loop, so the thresholds sit where no value of this workload is.
CASES = [
    *[("preset:ouro-tiny", dict(exit_threshold=0.6, exit_fill=fill)) for fill in ("copy", "masked", "read")],
    ("preset:ouro-tiny", dict(exit_criterion="entropy", exit_threshold=0.001, exit_fill="masked")),
    ("preset:ouro-tiny", dict(exit_criterion="kl", exit_threshold=0.01)),
    ("preset:ouro-tiny", dict(exit_criterion="entropy", exit_threshold=0.001)),
    ("preset:ouro-tiny", dict(exit_policy="fixed", exit_loop=2)),
    *[("preset:melt-tiny", dict(exit_threshold=0.6, exit_fill=fill)) for fill in ("copy", "read")],
    ("preset:melt-tiny", dict(exit_criterion="entropy", exit_threshold=0.0015)),
    ("zoo:lab-huginn", dict(exit_criterion="kl", exit_threshold=0.01)),
    ("zoo:lab-huginn", dict(exit_criterion="entropy", exit_threshold=0.01)),
    ("zoo:lab-huginn", dict(exit_policy="fixed", exit_loop=3)),
    ("zoo:lab-huginn", dict(exit_criterion="kl", exit_threshold=0.01, exit_fill="masked")),
    (
        "zoo:lab-history-loopgate",
        dict(exit_criterion="kl", exit_threshold=0.2),
    ),  # loop conditioning's history follows the rows
]


@pytest.mark.parametrize("spec,overrides", CASES, ids=[f"{s}-{'-'.join(map(str, o.values()))}" for s, o in CASES])
def test_active_set_gives_the_static_masked_steps_tokens(spec, overrides):
    """Two implementations of one thing: rows leaving the continuous step, and every row computing every loop with
    the exited ones frozen. Greedy and sampled, on blocks of 4 so that rows write back blocks mid-run."""
    adapter = load(spec, block_size=4, **overrides)
    for sampling in (GREEDY, SAMPLED):
        continuous = run(adapter, sampling, "continuous")
        assert run(adapter, sampling, "static") == continuous
        loops = {loop for _, used in continuous for loop in used[1:]}
        assert len(loops) > 1 or overrides.get("exit_policy") == "fixed"  # the exits differ from token to token


@pytest.mark.parametrize(
    "spec", [f"preset:{name}" for name in PRESETS if name.endswith("-tiny")] + [f"zoo:{name}" for name in zoo_names()]
)
def test_threshold_one_is_no_exit(spec):
    """`exit_threshold=1.0` is the released Ouro setting: the same tokens as no override on every model; with the gate
    criterion on, a model with an exit gate runs the skipping step, every token through every loop, unchanged."""
    base = adapters.load(spec, dtype="fp32", device="cpu")
    base.config.eos_token_id = None
    expected = [(g.token_ids, g.loops_used) for g in base.generate(PROMPTS[:2], GREEDY)]
    same = adapters.load(spec, dtype="fp32", device="cpu", exit_threshold=1.0)
    same.config.eos_token_id = None
    assert same.exit_policy.kind == "none"
    assert [(g.token_ids, g.loops_used) for g in same.generate(PROMPTS[:2], GREEDY)] == expected
    if base.config.exit_gate:
        gated = adapters.load(spec, dtype="fp32", device="cpu", exit_criterion="gate", exit_threshold=1.0)
        gated.config.eos_token_id = None
        assert gated.exit_policy.skips
        assert [(g.token_ids, g.loops_used) for g in gated.generate(PROMPTS[:2], GREEDY)] == expected


@pytest.mark.parametrize("spec", ["preset:ouro-tiny", "preset:melt-tiny"])
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_threshold_zero_runs_one_loop_per_decoded_token(spec, batching):
    adapter = load(spec, exit_threshold=0.0, batching=batching)
    gens = adapter.generate(PROMPTS, GREEDY)
    assert all(g.loops_used == [1] * GREEDY.max_new_tokens for g in gens)


@pytest.mark.parametrize("spec", ["preset:ouro-tiny", "zoo:lab-huginn"])
def test_loops_used_are_the_loops_each_decode_step_ran(spec):
    """Every row each loop of a decode step runs on, counted: token i > 1 of a sample records the loops of the
    step that drew it (token 1 is drawn from the prefill, which runs every loop)."""
    adapter = load(spec, exit_criterion="kl", exit_threshold=0.02)
    backbone, rows_run = adapter.model.model, [0]
    loop = backbone.loop

    def counted(h, *args):
        if h.shape[1] == 1:  # a decode step (no prompt here is one token long)
            rows_run[0] += h.shape[0]
        return loop(h, *args)

    backbone.loop = counted
    gens = adapter.generate(PROMPTS[2:], GREEDY)
    assert rows_run[0] == sum(sum(g.loops_used[1:]) for g in gens)
    assert rows_run[0] < len(gens) * (GREEDY.max_new_tokens - 1) * adapter.loops  # work was skipped


def test_a_coda_models_first_token_is_the_prefills_final_output():
    """Huginn's output is its coda's: a prompt runs every loop and the coda, so with exits on the first token is the
    one drawn without them (every loop run), and the decoded ones run fewer loops."""
    plain = [g.token_ids[0] for g in load("zoo:lab-huginn").generate(PROMPTS, GREEDY)]
    gens = load("zoo:lab-huginn", exit_criterion="kl", exit_threshold=0.01).generate(PROMPTS, GREEDY)
    assert [g.token_ids[0] for g in gens] == plain and all(g.loops_used[0] == 4 for g in gens)
    assert min(loop for g in gens for loop in g.loops_used[1:]) < 4


@pytest.mark.parametrize(
    "spec,overrides",
    [("preset:ouro-tiny", dict(exit_threshold=0.0)), ("zoo:lab-huginn", dict(exit_policy="fixed", exit_loop=1))],
)
def test_copy_fill_leaves_the_exit_loops_kv_in_the_skipped_loops(spec, overrides):
    """On the static cache: a token that stops at loop 1 holds loop 1's K/V in loops 2..r of every shared layer (for
    Huginn, its official "latest-m4" lookup: the latest step it ran at the same core layer), and the prompt's
    tokens, which ran every loop, K/V of each loop."""
    adapter = load(spec, **overrides)
    cfg, caches = adapter.config, []
    gen = generate(
        adapter.model,
        [[1, 11, 12, 13]],
        GREEDY,
        loops=cfg.loops,
        eos_ids=set(),
        exit_policy=adapter.exit_policy,
        on_cache=lambda cache: caches.append(cache) if cache is not None else None,
    )[0]
    cache, table = caches[0], PER_LOOP.table(cfg, cfg.loops)
    decoded = slice(4, 4 + gen.generated_tokens - 1)  # the slots of the tokens that went through a decode step
    assert gen.loops_used[1:] == [1] * (gen.generated_tokens - 1)
    for layer in range(cfg.prelude_layers, cfg.prelude_layers + cfg.shared_layers):
        first = table[layer][0]
        assert cache.k[first, :, :, decoded].abs().sum() > 0
        for t in range(1, cfg.loops):
            for store in (cache.k, cache.v):
                assert torch.equal(store[table[layer][t], :, :, decoded], store[first, :, :, decoded])
        assert not torch.equal(cache.k[table[layer][1], :, :, :4], cache.k[first, :, :, :4])


@pytest.mark.parametrize(
    "spec,fill", [("preset:ouro-tiny", "copy"), ("preset:ouro-tiny", "masked"), ("preset:melt-tiny", "copy")]
)
def test_kv_accounting_stays_exact_with_exits_on(spec, fill):
    """Preemption-free but with rows joining and leaving the running set (cap 4 of 12 samples): the pool's books
    and the analytic figures agree after every step (`Watch`), whatever the loops each token ran."""
    adapter = load(spec, exit_threshold=0.6, block_size=8, max_batch=4, exit_fill=fill)
    sampling = dataclasses.replace(SAMPLED, n=3, max_new_tokens=20)
    sequences = sequences_of([Request(p, sampling) for p in PROMPTS], adapter.model, adapter.tokenizer, adapter.spec)
    pool, finished = pool_for(adapter, sequences), []
    engine = engine_over(adapter, pool, finished)
    watch = Watch(engine, sequences, adapter.config, adapter.loops)
    engine.run(sequences)
    assert len(finished) == 12 and watch.steps > 20
    assert len({loop for seq in sequences for loop in seq.loops[1:]}) > 1
    assert pool.manager.held_blocks == pool.manager.tokens_held == 0


@pytest.mark.parametrize(
    "spec,overrides,message",
    [
        ("preset:ouro-tiny", dict(exit_criterion="median"), "exit_criterion"),
        ("preset:ouro-tiny", dict(exit_threshold=1.5), r"\[0, 1\]"),
        ("preset:ouro-tiny", dict(exit_criterion="kl", exit_threshold=-0.1), ">= 0"),
        ("preset:ouro-tiny", dict(exit_criterion="entropy", exit_threshold=float("nan")), ">= 0"),
        ("preset:ouro-tiny", dict(exit_criterion="kl"), "needs an exit_threshold"),
        ("preset:ouro-tiny", dict(exit_threshold=0.5, exit_fill="skip"), "exit_fill"),
        ("zoo:lab-huginn", dict(exit_threshold=0.5), "exit gate"),
        ("preset:melt-tiny", dict(exit_threshold=0.5, exit_fill="masked"), "per-loop K/V"),
        (
            "zoo:lab-huginn",
            dict(kv_policy="latest-m4", exit_criterion="kl", exit_threshold=0.01, exit_fill="masked"),
            "kv_policy latest-m4 reads a skipped loop",
        ),
        ("zoo:lab-huginn", dict(exit_criterion="kl", exit_threshold=0.01, exit_fill="read"), "without coda layers"),
    ],
)
def test_bad_exit_overrides_are_one_line_errors(spec, overrides, message):
    with pytest.raises(AdapterError, match=message) as error:
        adapters.load(spec, dtype="fp32", device="cpu", **overrides)
    assert "\n" not in str(error.value)
    with pytest.raises(AdapterError, match=message):  # a sweep's plan refuses it before any weights load
        adapters.inspect(spec, **overrides)


def test_describe_names_the_fill():
    policy = load("preset:ouro-tiny", exit_threshold=0.6).describe()["exit_policy"]
    assert (policy["kind"], policy["criterion"], policy["fill"], policy["threshold"]) == (
        "threshold",
        "gate",
        "copy",
        0.6,
    )
    read = load("preset:ouro-tiny", exit_threshold=0.6, exit_fill="read").describe()["exit_policy"]
    assert read["fill"] == "read"
    assert load("preset:ouro-tiny").describe()["exit_policy"]["kind"] == "none"


def test_masked_fill_hides_the_skipped_loops_where_copy_shows_the_exit_loops_kv():
    """The two skipping fills differ only in what later tokens read at a loop an earlier token skipped: the same
    exits with copies of the exit loop's K/V there, or with those tokens masked out, give other outputs."""
    copy, masked = (
        run(load("preset:ouro-tiny", exit_threshold=0.6, exit_fill=fill), GREEDY, "continuous")
        for fill in ("copy", "masked")
    )
    assert copy != masked
    assert copy[0][1][:2] == masked[0][1][:2]  # the first decode step reads only prompt tokens, which ran every loop


@pytest.mark.parametrize("fill", ["copy", "masked"])
def test_preemption_with_exits_on_changes_nothing(fill):
    """A preempted sample prefills its prompt again and replays its tokens through decode steps, whose exits
    (and, masked, the loops its earlier tokens ran) are those of the first time: the same tokens and loops."""
    adapter = load("preset:ouro-tiny", exit_threshold=0.6, exit_fill=fill, block_size=4)
    expected = run(adapter, SAMPLED, "continuous")
    longest = max(
        seq.capacity
        for seq in sequences_of([Request(p, SAMPLED) for p in PROMPTS], adapter.model, adapter.tokenizer, adapter.spec)
    )
    adapter.kv_budget = tiny_budget(adapter, blocks=2 * -(-longest // 4))  # room for about two of the eight sequences
    assert run(adapter, SAMPLED, "continuous") == expected
    assert adapter.preemptions > 0


POOL_CASES = [
    ("preset:ouro-tiny", dict(exit_threshold=0.6)),
    ("preset:ouro-tiny", dict(exit_threshold=0.6, exit_fill="masked")),
    ("preset:melt-tiny", dict(exit_threshold=0.6)),
    ("zoo:lab-huginn", dict(exit_criterion="kl", exit_threshold=0.01)),
    ("zoo:lab-huginn", dict(exit_criterion="kl", exit_threshold=0.01, exit_fill="masked")),
]


@pytest.mark.parametrize(
    "spec,overrides", POOL_CASES, ids=["ouro-copy", "ouro-masked", "melt-copy", "huginn-kl", "huginn-kl-masked"]
)
def test_the_pools_step_narrows_as_the_decode_rows_do(spec, overrides, monkeypatch):
    """Decode steps that gather from the pool (`PagedStep`, the path a GPU runs eagerly; here forced by leaving the
    decode rows no room) narrow to the looping rows too, and give the static masked step's tokens."""
    import adapters.engine.serving.rows as rows

    adapter = load(spec, block_size=4, **overrides)
    static = run(adapter, SAMPLED, "static")
    monkeypatch.setattr(rows, "LIMIT_BYTES", 0)
    assert run(adapter, SAMPLED, "continuous") == static


@pytest.mark.parametrize(
    ("threshold", "criterion"), [(1.5, "gate"), (-0.1, "gate"), (math.nan, "gate"), (-1, "kl"), (math.inf, "entropy")]
)
def test_a_threshold_s_range_is_one_rule_for_the_policy_and_the_flag(threshold, criterion):
    """The policy refuses a threshold outside its criterion's range with `check_exit_threshold`'s words, which the
    harness's `--exit-threshold` check repeats with the flag's name."""
    with pytest.raises(AdapterError) as policy:
        ExitPolicy(kind="threshold", threshold=threshold, criterion=criterion)
    with pytest.raises(AdapterError) as flag:
        check_exit_threshold(threshold, criterion, "--exit-threshold")
    assert str(flag.value) == "--" + str(policy.value).replace("exit_threshold", "exit-threshold", 1)
    check_exit_threshold(0.0, criterion)  # the range's floor is in it
