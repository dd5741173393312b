"""What the Huginn and retrofit fidelity tests share (`test_huginn.py`, `test_retrofit.py`).

Each compares the engine on a tiny checkpoint with a fixture the official modelling code wrote
(`scripts/huginn_reference.py`, `scripts/retrofit_reference.py`, one record layout): logits per prompt and loop
count, greedy continuations, and the paged pool's accounting against the analytic terms after every step. The
logits agree within what float32 rounding allows on the checkpoint (`tests/support/rounding.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import adapters
from adapters.base import Request, Sampling
from adapters.engine.adapter import sequences_of
from adapters.engine.serving.continuous import ContinuousEngine
from adapters.engine.model import LoopedLM
from tests.support.rounding import FIXTURE_DIGITS, rounding_bound
from tests.support.kv_pool import Watch, pool_for

DISCRIMINATES = 1e-3  # what a wrong loop count or initial state moves the logits by, at least


def reference_engine(spec: str, seed: int, loops: int, scale: float = 0.0, **overrides: Any) -> Any:
    """The engine adapter on a reference checkpoint, its initial state drawn from `seed` scaled by `scale` (0: the
    official `init_scale=0`), with no end token: the reference decodes all its new tokens."""
    adapter = adapters.load(spec, loops=loops, dtype="fp32", device="cpu", **overrides)
    adapter.model.seed_state(seed, scale)
    adapter.config.eos_token_id = None
    adapter.config.extra["eos_token_ids"] = []
    return adapter


def max_diff(model: LoopedLM, prompt: list[int], loops: int, expected: list) -> float:
    """The largest |logit difference| of `model` on `prompt` at `loops` against the reference's logits."""
    with torch.no_grad():
        return (
            (model.forward(torch.tensor([prompt]), loops=loops).logits[0] - torch.tensor(expected)).abs().max().item()
        )


def assert_logits_are_the_reference(
    model: LoopedLM, prompt: list[int], loops: int, expected: list, before: Callable[[], None] = lambda: None
) -> tuple[float, float]:
    """The logits of `model` on `prompt` at `loops` (after `before`, which seeds the state) are the reference's up to
    two float32 evaluations' rounding on this checkpoint and the fixture's 7 decimals; that bound stays below what a
    wrong loop count or state moves, so the comparison still tests the model. Returns (difference, bound)."""

    def run() -> torch.Tensor:
        before()
        return model.forward(torch.tensor([prompt]), loops=loops).logits[0]

    bound = rounding_bound(model, run) + FIXTURE_DIGITS
    before()
    diff = max_diff(model, prompt, loops, expected)
    assert diff < bound < DISCRIMINATES, (diff, bound)
    return diff, bound


def assert_greedy_is_the_reference(adapter: Any, reference: dict, loops: int) -> None:
    """The continuous engine (paged KV, every prompt batched) and then the static path decode the official tokens."""
    greedy = Sampling(temperature=0.0, max_new_tokens=reference["new_tokens"])
    expected = reference["zero_state"][str(loops)]["greedy"]
    assert [g.token_ids for g in adapter.generate(reference["prompts"], greedy)] == expected
    adapter.batching = "static"
    assert [g.token_ids for g in adapter.generate(reference["prompts"], greedy)] == expected


def assert_paged_accounting(adapter: Any, prompts: list[list[int]], loops: int) -> None:
    """Three prompts through the continuous engine at cap 3 on blocks of 4: `Watch` checks the pool's exact accounting
    against the analytic terms after every step, and every block comes back."""
    sequences = sequences_of(
        [Request(p, Sampling(temperature=0.0, max_new_tokens=6)) for p in prompts],
        adapter.model,
        adapter.tokenizer,
        adapter.spec,
    )
    pool = pool_for(adapter, sequences)
    finished: list = []
    batcher = ContinuousEngine(
        adapter.model,
        pool,
        loops=loops,
        policy=adapter.exit_policy,
        eos_ids=set(),
        tokenizer=adapter.tokenizer,
        max_seqs=3,
        on_finished=finished.extend,
    )
    watch = Watch(batcher, sequences, adapter.config, loops)
    batcher.run(sequences)
    assert len(finished) == 3 and watch.steps > 5
    assert pool.manager.held_blocks == pool.manager.tokens_held == 0
