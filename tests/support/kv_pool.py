"""The continuous engine's KV pool as the tests see it: the pool a workload gets, a budget of a few blocks, and
`Watch`, which checks the pool's accounting against the analytic model after every step."""

from __future__ import annotations

from adapters.base import Sampling
from adapters.engine.adapter import EngineAdapter
from adapters.engine.kv.layouts import layout_of
from adapters.engine.memory import analytic_terms
from adapters.engine.serving.continuous import ContinuousEngine
from adapters.engine.serving.paged import BlockPool

PROMPTS = ["1+2=", "x", "17*3=51; 4*4=", "abcdefghijklmnopqrstu"]
SAMPLED = Sampling(temperature=1.0, top_p=0.7, max_new_tokens=20, n=3, seed=5)


def pool_for(adapter: EngineAdapter, sequences: list, spare: bool = False) -> BlockPool:
    """The pool the adapter's continuous path makes for `sequences`."""
    return BlockPool.for_workload(
        adapter.config,
        layout_of(adapter.config),
        adapter.loops,
        [s.capacity for s in sequences],
        max_seqs=adapter.max_batch,
        kv_budget=adapter.kv_budget,
        block_size=adapter.block_size,
        dtype=adapter.dtype,
        device=adapter.device,
        spare=spare,
    )


def engine_over(adapter: EngineAdapter, pool: BlockPool, finished: list, max_seqs: int = 4) -> ContinuousEngine:
    """The continuous engine of `adapter` over `pool`, without an end token (every sequence runs its budget), whose
    finished sequences are appended to `finished`."""
    return ContinuousEngine(
        adapter.model,
        pool,
        loops=adapter.loops,
        policy=adapter.exit_policy,
        eos_ids=set(),
        tokenizer=adapter.tokenizer,
        max_seqs=max_seqs,
        on_finished=finished.extend,
    )


def tiny_budget(adapter: EngineAdapter, blocks: int) -> float:
    """kv_budget in GB for a pool of `blocks` blocks (and the latent buffer) for PROMPTS x SAMPLED at the adapter's settings."""
    terms = analytic_terms(adapter.config, adapter.loops, "fp32")
    rows = min(adapter.max_batch, len(PROMPTS) * SAMPLED.n)  # the latent buffer holds the largest step's tokens
    latent = max(rows, adapter.config.chunk_size if adapter.config.kv_strategy == "gated" else 1)
    return (blocks * adapter.block_size * terms["kv_bytes_per_token"] + latent * terms["latent_bytes_per_token"]) / 1e9


class Watch:
    """Checks the pool's accounting after every step of an engine, from its sequences' own block tables."""

    def __init__(self, engine: ContinuousEngine, sequences: list, config, loops: int) -> None:
        self.sequences, self.pool, self.steps, self.max_running = sequences, engine.pool, 0, 0
        self.terms = analytic_terms(config, loops, "fp32")
        runner = engine.runner
        step, rows_step = runner.step, runner.rows_step

        def checked(seqs, tokens, **options):  # prefill chunks, and decode steps without decode rows
            out = step(seqs, tokens, **options)
            self.check(seqs, sum(map(len, tokens)))
            return out

        def checked_rows(seqs):  # decode steps on the decode rows: one token per sequence
            out = rows_step(seqs)
            self.check(seqs, len(seqs))
            return out

        runner.step, runner.rows_step = checked, checked_rows

    def check(self, stepped: list, in_flight: int) -> None:
        """After a step: every sequence holding blocks (running, or admitted and being prefilled) accounts for them."""
        pool, running = self.pool.manager, [seq for seq in self.sequences if seq.blocks]
        assert all(seq in running for seq in stepped)
        self.steps += 1
        self.max_running = max(self.max_running, len(running))
        block_bytes = pool.block_size * self.terms["kv_bytes_per_token"]
        latent = self.terms["latent_bytes_per_token"] * in_flight
        distinct = {b for seq in running for b in seq.blocks}
        assert pool.held_blocks == len(distinct)
        assert pool.kv_bytes_used == pool.tokens_held * self.terms["kv_bytes_per_token"] + latent
        assert pool.kv_bytes_allocated == pool.held_blocks * block_bytes + latent
        assert pool.kv_bytes_used <= pool.kv_bytes_allocated <= pool.kv_bytes_used + len(running) * block_bytes
        assert pool.kv_bytes_allocated <= pool.peak_allocated <= self.pool.kv_bytes_reserved
