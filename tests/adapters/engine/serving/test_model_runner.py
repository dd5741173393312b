"""`ModelRunner`: a prompt prefilled through the pool, then decoded on the decode rows or by gathering from the pool,
gives the model's own full-forward logits at every step; the block manager learns what each step wrote."""

from __future__ import annotations

import pytest
import torch

from adapters.base import Sampling
from adapters.engine.exits import ExitPolicy
from adapters.engine.kv.layouts import layout_of
from adapters.engine.io.checkpoint import random_model
from adapters.engine.serving.model_runner import ModelRunner, sample_next
from adapters.engine.serving.paged import BlockPool
from adapters.engine.serving.sequence import Sequence
from tests.support.rounding import rounding_bound

PROMPT = [1, 14, 15, 16, 17, 18]


def decoded_logits(name: str, rows: bool, steps: int = 5) -> tuple[torch.Tensor, torch.Tensor, float, ModelRunner]:
    """The runner's logits for the prompt's last token and `steps` greedy tokens after it, the full forward's
    logits at those positions, the rounding bound between the two, and the runner."""
    model = random_model(name, 4, torch.float32, "cpu")
    loops = model.config.loops
    pool = BlockPool(
        model.config,
        layout_of(model.config),
        loops,
        num_blocks=8,
        block_size=4,
        latent_tokens=8,
        dtype=torch.float32,
        device="cpu",
    )
    runner = ModelRunner(model, pool, loops=loops, policy=ExitPolicy(), graphs=None)
    seq = Sequence(
        request=0,
        sample=0,
        key=0,
        prompt_len=len(PROMPT),
        tokens=list(PROMPT),
        capacity=16,
        sampling=Sampling(temperature=0.0, max_new_tokens=10),
    )
    pool.manager.hold(seq, len(PROMPT))
    if rows:
        runner.use_rows(1, seq.capacity)
        assert runner.rows is not None
    with torch.no_grad():
        got = [runner.logits(runner.step([seq], [PROMPT]))[0][0]]
        runner.start(0, seq)
        for _ in range(steps):
            seq.tokens.append(int(got[-1].argmax()))
            runner.advance(got[-1].argmax()[None])  # what the engine does with the ids it samples
            pool.manager.hold(seq, seq.written + 1)
            got.append(runner.logits(runner.decode([seq]))[0][0])
        ids = torch.tensor([seq.tokens])
        chunks = [len(PROMPT)] + [1] * steps  # the steps' tokens, as a chunked (MELT) forward must cut them
        full = model(ids, chunk_size=chunks).logits[0, len(PROMPT) - 1 :]
    assert seq.written == len(seq.tokens) and pool.manager.tokens_held == seq.written
    return torch.stack(got), full, rounding_bound(model, lambda: model(ids, chunk_size=chunks).logits), runner


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["qwen3-tiny", "ouro-tiny", "melt-tiny"])
@pytest.mark.parametrize("rows", [True, False])
def test_prefill_then_decode_gives_the_full_forward_s_logits(name, rows):
    got, full, bound, _ = decoded_logits(name, rows)
    assert (got - full).abs().max().item() <= bound


def test_the_rows_hand_a_filled_block_back_to_the_pool():
    """Decoding on rows from 6 to 11 tokens fills the second block (slots 4..7): the pool then holds it as the
    rows do; the third block, partly filled, is in the rows only."""
    _, _, _, runner = decoded_logits("qwen3-tiny", rows=True)
    pool, rows = runner.pool, runner.rows
    assert rows is not None
    torch.testing.assert_close(pool.k[:, 4:8], rows.k[:, 0, 4:8], rtol=0, atol=0)
    assert pool.manager.tokens_held == 11


def test_sequences_of_different_settings_draw_in_calls_of_their_own():
    vocab, cpu = 99, torch.device("cpu")
    greedy, hot = Sampling(temperature=0.0, max_new_tokens=4), Sampling(temperature=1.0, max_new_tokens=4, seed=3)
    seqs = [
        Sequence(request=i, sample=0, key=i, prompt_len=1, tokens=[1], capacity=5, sampling=s)
        for i, s in enumerate((greedy, hot))
    ]
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0))
    ids = sample_next(seqs, logits, False, cpu)
    assert ids[0] == logits[0].argmax()
    # the same stream, alone or beside another
    assert ids[1] == sample_next(seqs[1:], logits[1:], True, cpu)[0]
