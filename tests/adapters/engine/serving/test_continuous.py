"""The continuous-batching engine against the static path, against itself at other caps and pool
sizes, and its paged KV accounting against the analytic model, step by step."""

from __future__ import annotations

import pytest
import torch

from adapters.base import AdapterError, Request, Sampling
from adapters.engine.adapter import EngineAdapter, load_preset, sequences_of
from adapters.engine.exits import ExitPolicy
from adapters.engine.serving.continuous import ContinuousEngine, continuous_engine
from adapters.engine.serving.graphs import DecodeGraphs
from tests.support.kv_pool import PROMPTS, SAMPLED, Watch, engine_over, pool_for, tiny_budget

PRESETS = ["qwen3-tiny", "ouro-tiny", "melt-tiny", "coreloop-tiny"]


def engine(name: str, **overrides) -> EngineAdapter:
    adapter = load_preset(name, dtype="fp32", device="cpu", seed=3, **overrides)
    adapter.config.eos_token_id = None  # lengths set by max_new_tokens: long enough to need several blocks
    return adapter


def outputs(adapter: EngineAdapter, sampling: Sampling, prompts: list[str] = PROMPTS) -> list[list[int]]:
    return [g.token_ids for g in adapter.generate(prompts, sampling)]


@pytest.mark.parametrize("name", PRESETS)
def test_greedy_equals_the_static_path(name):
    """Every preset, prompts of 1 to 21 characters across block edges: the same tokens as static batches."""
    adapter = engine(name, block_size=4)
    greedy = Sampling(temperature=0.0, max_new_tokens=24)
    continuous = outputs(adapter, greedy)
    adapter.batching = "static"
    assert outputs(adapter, greedy) == continuous
    assert len({tuple(ids) for ids in continuous}) > 1


def test_ouro_exit_policy_records_the_same_loops_as_static():
    adapter = engine("ouro-tiny", exit_policy="threshold", exit_threshold=0.3)
    greedy = Sampling(temperature=0.0, max_new_tokens=16)
    continuous = adapter.generate(PROMPTS, greedy)
    adapter.batching = "static"
    static = adapter.generate(PROMPTS, greedy)
    assert [(g.token_ids, g.loops_used) for g in continuous] == [(g.token_ids, g.loops_used) for g in static]


@pytest.mark.parametrize("name", ["qwen3-tiny", "ouro-tiny", "melt-tiny"])
def test_sampled_outputs_do_not_depend_on_the_cap_or_batching(name):
    adapter = engine(name)
    by_cap = {}
    for cap in (1, 4, 32):
        adapter.max_batch = cap
        by_cap[cap] = outputs(adapter, SAMPLED)
    adapter.batching, adapter.max_batch = "static", 5
    static = outputs(adapter, SAMPLED)
    assert by_cap[1] == by_cap[4] == by_cap[32] == static
    assert len({tuple(ids) for ids in by_cap[1][:3]}) > 1  # a prompt's three samples differ


def test_a_prompt_admitted_beside_decoding_sequences_leaves_their_kv_alone():
    """MELT prompts of chunk x k + 1 tokens prefill a 1-token chunk first; admitted while others decode (cap 2,
    new-token budgets staggered), that chunk must not go through the running sequences' decode rows."""
    by_cap = {}
    for cap in (1, 2):
        adapter = engine("melt-tiny", max_batch=cap)
        chunk = adapter.config.chunk_size
        requests = [
            Request(
                [5 + i] * (chunk * (1 + i % 2) + 1),
                Sampling(temperature=1.0, top_p=0.7, max_new_tokens=4 + 5 * i, seed=i),
            )
            for i in range(6)
        ]
        got: dict[int, list[int]] = {}
        adapter.generate_requests(
            requests, lambda done, got=got: got.update({request: g.token_ids for request, _, g in done})
        )
        by_cap[cap] = got
    assert by_cap[1] == by_cap[2] and len(by_cap[1]) == 6


@pytest.mark.parametrize("name", ["ouro-tiny", "melt-tiny"])
def test_preemption_under_a_tiny_pool_changes_nothing(name):
    adapter = engine(name, block_size=4)
    expected = outputs(adapter, SAMPLED)
    longest = max(
        sequences_of([Request(p, SAMPLED) for p in PROMPTS], adapter.model, adapter.tokenizer, adapter.spec),
        key=lambda seq: seq.capacity,
    )
    one = -(-longest.capacity // 4)  # blocks of one sequence at its longest (the 22-token prompt plus 20)
    adapter.kv_budget = tiny_budget(adapter, blocks=2 * one)  # room for about two of the twelve sequences
    assert outputs(adapter, SAMPLED) == expected
    assert adapter.preemptions > 0
    adapter.kv_budget = tiny_budget(adapter, blocks=one - 1)
    with pytest.raises(AdapterError, match=f"one sequence needs {one * 4}"):
        adapter.generate(PROMPTS, SAMPLED)


def test_a_resumed_request_draws_only_the_missing_samples_unchanged():
    adapter = engine("melt-tiny")
    request = Request("17*3=51; 4*4=", SAMPLED)
    whole: dict[int, list[int]] = {}
    adapter.generate_requests([request], lambda done: whole.update((j, g.token_ids) for _, j, g in done))
    part: dict[int, list[int]] = {}
    adapter.generate_requests(
        [Request(request.prompt, SAMPLED, samples=(2, 0))],
        lambda done: part.update((j, g.token_ids) for _, j, g in done),
    )
    assert part == {0: whole[0], 2: whole[2]} and whole[0] != whole[2]


@pytest.mark.parametrize("name", ["ouro-tiny", "melt-tiny"])
def test_kv_accounting_is_exact_and_held_is_at_most_one_block_over_used(name):
    adapter = engine(name, block_size=8, max_batch=4)
    sequences = sequences_of([Request(p, SAMPLED) for p in PROMPTS], adapter.model, adapter.tokenizer, adapter.spec)
    pool = pool_for(adapter, sequences)
    finished = []
    batcher = engine_over(adapter, pool, finished)
    watch = Watch(batcher, sequences, adapter.config, adapter.loops)
    batcher.run(sequences)
    assert len(finished) == 12 and watch.steps > 20 and watch.max_running == 4
    blocks = pool.manager
    assert (
        blocks.held_blocks == blocks.tokens_held == 0 and len(blocks.free) == blocks.num_blocks
    )  # everything returned
    assert pool.kv_bytes_reserved == 2 * pool.k.numel() * 4 + (0 if pool.latent is None else pool.latent.numel() * 4)


def test_samples_of_one_prompt_share_its_prefilled_blocks():
    """20 prompt tokens in blocks of 8: two full blocks shared by three samples, each with its own copy of the third."""
    adapter = engine("qwen3-tiny", block_size=8)
    sequences = sequences_of(
        [Request([1] + [5] * 19, Sampling(temperature=1.0, max_new_tokens=2, n=3))],
        adapter.model,
        adapter.tokenizer,
        adapter.spec,
    )
    pool = pool_for(adapter, sequences)
    batcher = ContinuousEngine(
        adapter.model,
        pool,
        loops=1,
        policy=adapter.exit_policy,
        eos_ids=set(),
        tokenizer=None,
        max_seqs=3,
        on_finished=lambda done: None,
    )
    with torch.inference_mode():
        batcher.scheduler.waiting.extend(sequences)
        batcher.admit()
    blocks = [seq.blocks for seq in batcher.scheduler.running]
    assert [b[:2] for b in blocks] == [blocks[0][:2]] * 3 and len({b[2] for b in blocks}) == 3
    assert pool.manager.held_blocks == 5 and pool.manager.tokens_held == 2 * 8 + 3 * 4
    keys = pool.k[:, [b[2] * 8 + i for b in blocks for i in range(4)]].view(pool.k.shape[0], 3, 4, *pool.k.shape[2:])
    assert torch.equal(keys[:, 0], keys[:, 1]) and torch.equal(keys[:, 0], keys[:, 2]) and keys.abs().sum() > 0


def test_memory_reports_the_live_pool_and_its_peak():
    adapter = engine("melt-tiny", max_batch=4)
    seen = []
    adapter.generate_requests([Request(p, SAMPLED) for p in PROMPTS], lambda done: seen.append(adapter.memory()))
    after = adapter.memory()
    assert (
        after["kv_bytes_allocated"] == after["kv_bytes_used"] == after["kv_bytes_reserved"] == 0
    )  # the pool lives only during the call
    pool = {m["kv_bytes_reserved"] for m in seen}
    assert len(pool) == 1 and after["kv_bytes_reserved_peak"] == pool.pop() > after["kv_bytes_peak"]
    assert all(
        m["kv_bytes_used"] <= m["kv_bytes_allocated"] <= m["kv_bytes_peak"] <= m["kv_bytes_reserved"] for m in seen
    )
    assert any(m["kv_bytes_used"] > 0 for m in seen)
    assert after["kv_bytes_peak"] == max(m["kv_bytes_peak"] for m in seen) > 0
    adapter.reset_memory_peak()
    assert adapter.memory()["kv_bytes_peak"] == adapter.memory()["kv_bytes_reserved_peak"] == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batching": "dynamic"}, "batching 'dynamic' is not one of continuous, static"),
        ({"block_size": 0}, "block_size must be a positive integer"),
        ({"kv_budget": -1.0}, "kv_budget must be a positive number of GB"),
        ({"max_batch": "8"}, "max_batch must be a positive integer"),
        ({"cuda_graphs": 3}, "cuda_graphs must be true or false"),
    ],
)
def test_bad_batching_overrides_name_the_override(overrides, message):
    with pytest.raises(AdapterError, match=message):
        load_preset("qwen3-tiny", **overrides)
    with pytest.raises(AdapterError, match=message):
        import adapters

        adapters.inspect("preset:qwen3-tiny", **overrides)


def test_batching_set_on_a_loaded_adapter_is_checked_as_a_load_override_is():
    adapter = engine("qwen3-tiny")
    adapter.batching = "static"  # what a profile does
    assert adapter.batching == "static" and adapter.describe()["batching"]["mode"] == "static"
    with pytest.raises(AdapterError, match="batching 'dynamic' is not one of continuous, static"):
        adapter.batching = "dynamic"
    assert adapter.batching == "static"


@pytest.mark.parametrize("name", PRESETS)
def test_padded_decode_steps_of_the_gpu_path_change_nothing(name):
    """The GPU path's decode steps padded to (batch, width) buckets, run eagerly (no capture on the CPU):
    the same samples as unpadded steps, while the running set shrinks through several buckets, and
    the pool's accounting stays exact (padding rows write only the spare block)."""
    adapter = engine(name, block_size=4, max_batch=12)
    requests = [
        Request(p, Sampling(temperature=1.0, top_p=0.7, max_new_tokens=6 + 5 * i, n=3, seed=i))
        for i, p in enumerate(PROMPTS)
    ]
    runs = {}
    for padded in (False, True):
        sequences = sequences_of(requests, adapter.model, adapter.tokenizer, adapter.spec)
        pool = pool_for(adapter, sequences, spare=padded)
        graphs = (
            DecodeGraphs(
                adapter.model,
                pool,
                loops=adapter.loops,
                keep_loops=False,
                max_seqs=12,
                max_blocks=pool.manager.blocks_for(max(s.capacity for s in sequences)),
                capture=False,
            )
            if padded
            else None
        )
        done: dict = {}
        batcher = ContinuousEngine(
            adapter.model,
            pool,
            loops=adapter.loops,
            policy=adapter.exit_policy,
            eos_ids=set(),
            tokenizer=None,
            max_seqs=12,
            on_finished=lambda f, done=done: done.update(((r, j), g.token_ids) for r, j, g in f),
            graphs=graphs,
        )
        Watch(batcher, sequences, adapter.config, adapter.loops)
        batcher.run(sequences)
        runs[padded] = done
    assert len(runs[True]) == 12 and runs[True] == runs[False]
    assert {b for b, _ in graphs.graphs} == {4, 8, 12} and len({w for _, w in graphs.graphs}) >= 2


def test_the_engine_for_a_workload_holds_it_at_the_cap_and_runs_eagerly_off_a_gpu():
    """`continuous_engine` sizes the pool for `max_seqs` of the longest sequence (no preemption) and asks for CUDA
    graphs only where they run: on the CPU the decode is eager whatever `cuda_graphs` says."""
    adapter = load_preset("ouro-tiny", device="cpu")
    sequences = sequences_of([Request(p, SAMPLED) for p in PROMPTS], adapter.model, adapter.tokenizer, adapter.spec)
    engine = continuous_engine(
        adapter.model,
        sequences,
        lambda done: None,
        loops=adapter.loops,
        policy=ExitPolicy(),
        eos_ids=set(),
        tokenizer=adapter.tokenizer,
        max_seqs=2,
        kv_budget=None,
        block_size=4,
        cuda_graphs=True,
        attention=None,
    )
    longest = max(-(-seq.capacity // 4) for seq in sequences)
    assert engine.runner.graphs is None and engine.pool.spare is None
    assert engine.pool.block_size == 4 and engine.manager.num_blocks == 2 * longest
