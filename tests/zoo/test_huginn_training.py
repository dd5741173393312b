"""Huginn's sampled recurrence (`objectives.sampled_recurrence`, the `huginn` recipe kind) on real tensors: the loop
counts are a function of (seed, step), and gradients flow through the last k loops only."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from training import objectives as T
from adapters.engine.model import LoopedLM
from training.data import TaskData
from training.train import make_objective, train
from adapters.engine.io.tokenizer import char_tokenizer
from adapters.base import AdapterError
from adapters.engine.config import MAX_LOOPS
from adapters.zoo import get_recipe
from suites import synthetic

# lab-huginn's recipe at 32 wide (the family needs as many K/V heads as query heads)
TINY = {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 2, "head_dim": 16, "ffn_size": 64}


def tiny_recipe(**changes: object) -> object:
    recipe = get_recipe("lab-huginn")
    return recipe.with_overrides(config={**recipe.config, **TINY}, **changes)


def test_the_recipe_is_huginn_shaped_and_trained_by_sampled_recurrence() -> None:
    recipe = get_recipe("lab-huginn")
    cfg = recipe.model_config()
    assert (
        recipe.kind == "huginn" and cfg.family == "huginn" and (recipe.mean_recurrence, recipe.backprop_depth) == (4, 2)
    )
    assert (cfg.prelude_layers, cfg.shared_layers, cfg.coda_layers, cfg.loops) == (1, 2, 1, 4)
    lab = get_recipe("lab-baseloop").model_config()  # the lab's widths, vocabulary and budget
    for name in (
        "hidden_size",
        "ffn_size",
        "head_dim",
        "num_heads",
        "vocab_size",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
    ):
        assert getattr(cfg, name) == getattr(lab, name), name
    base = get_recipe("lab-baseloop")
    assert (recipe.steps, recipe.batch_size, recipe.lr, recipe.seed, recipe.tasks) == (
        base.steps,
        base.batch_size,
        base.lr,
        base.seed,
        base.tasks,
    )


def test_the_loop_counts_are_a_function_of_seed_and_step() -> None:
    draws = [T.sampled_recurrence(4, 2, seed=0, step=s) for s in range(2000)]
    assert draws == [T.sampled_recurrence(4, 2, seed=0, step=s) for s in range(2000)], (
        "the same (seed, step), the same draw"
    )
    assert draws != [T.sampled_recurrence(4, 2, seed=1, step=s) for s in range(2000)], "another seed, other draws"
    assert draws[:8] == [
        (2, 2),
        (5, 2),
        (1, 2),
        (7, 2),
        (1, 2),
        (4, 2),
        (3, 2),
        (1, 2),
    ]  # pinned: a resumed run draws these
    totals = [n + k for n, k in draws]
    assert all(k == min(2, n + k) and n >= 0 and n + k >= 1 for n, k in draws)  # k = min(backprop depth, r)
    # r = Poisson(tau) + 1 with E[tau] = 4: mean 5, heavy-tailed (Huginn's "poisson-lognormal-filling")
    assert 4.8 < statistics.fmean(totals) < 5.2 and max(totals) >= 15 and min(totals) == 1
    with pytest.raises(ValueError):
        T.sampled_recurrence(0, 2, seed=0, step=0)


def _model() -> LoopedLM:
    model = LoopedLM(tiny_recipe().model_config())
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def _grads(
    model: LoopedLM, tokens: torch.Tensor, loops: int, grad_loops: int | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    model.seed_state(7)  # the same initial state every call
    logits = model(tokens, loops=loops, grad_loops=grad_loops).logits
    logits.square().mean().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.numerics
def test_gradients_flow_through_the_last_k_loops_only() -> None:
    model = _model()
    tokens = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(1))
    calls: list[bool] = []
    layer = model.shared[0]
    plain = layer.forward

    def recording(*args: object, **kwargs: object) -> object:
        out = plain(*args, **kwargs)
        calls.append(out[0].requires_grad)
        return out

    layer.forward = recording  # Backbone.run calls layer.forward directly
    truncated_logits, truncated = _grads(model, tokens, loops=5, grad_loops=2)
    assert calls == [False, False, False, True, True], "loops 1-3 without autograd, 4-5 with"
    del layer.forward
    full_logits, full = _grads(model, tokens, loops=5, grad_loops=None)
    torch.testing.assert_close(
        truncated_logits, full_logits, rtol=0, atol=0
    )  # the values are the same; only autograd differs
    # the prelude still learns (through the injection at the differentiated loops), but not through loops 1-3
    assert truncated["model.embed_tokens.weight"].abs().sum() > 0
    assert not torch.allclose(truncated["model.recurrence.adapter.weight"], full["model.recurrence.adapter.weight"])
    # reference: run loops 1-3 by hand without autograd, then 2 loops with it from that (constant) state
    _, same = _grads(model, tokens, loops=5, grad_loops=5)
    for name in full:
        torch.testing.assert_close(same[name], full[name], rtol=0, atol=0)  # k >= r: plain backprop
    model.zero_grad(set_to_none=True)
    model.seed_state(7)
    reference = _reference_logits(model, tokens, no_grad_loops=3, grad_loops=2)
    torch.testing.assert_close(reference.detach(), truncated_logits)
    reference.square().mean().backward()
    for name, p in model.named_parameters():
        if p.grad is not None or name in truncated:
            torch.testing.assert_close(p.grad, truncated[name], msg=name)


def _reference_logits(model: LoopedLM, tokens: torch.Tensor, no_grad_loops: int, grad_loops: int) -> torch.Tensor:
    """The truncated forward written out: `no_grad_loops` loops under torch.no_grad (from the seeded initial state),
    their last state read from a trace, then a forward with autograd whose `grad_loops` loops start from that state."""
    from adapters.engine.model import LoopTrace

    trace = LoopTrace()
    with torch.no_grad():
        model(tokens, loops=no_grad_loops, trace=trace)  # draws the seeded initial state, records every loop's state
    state = trace.joined()[-1]  # the state after loop no_grad_loops: a constant
    return model(tokens, loops=grad_loops, trace=_StartFrom(state)).logits


class _StartFrom:
    """A trace stand-in that swaps the drawn initial state for `state` (the loops continue from it)."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state, self.skip = state, frozenset()

    def begin(self, h: torch.Tensor) -> None:
        assert not h.requires_grad  # the drawn state: overwritten in place before the first loop reads it
        h.copy_(self.state)

    def record(self, h: torch.Tensor) -> None:
        pass


def test_the_objective_runs_the_steps_draw(tmp_path: Path) -> None:
    recipe = tiny_recipe(tasks=("chain2",), val_items=10)
    items = {"chain2": synthetic.load_split("chain2", "train")[:40]}
    data = TaskData(recipe.tasks, char_tokenizer(), recipe.val_items, items, synthetic.STOP)
    objective = make_objective(recipe, None)
    model = _model()
    for step in (0, 3, 7):
        loss, info = objective(model, data.batch(recipe.seed, step, 4, "cpu"), step)
        n, k = T.sampled_recurrence(recipe.mean_recurrence, recipe.backprop_depth, recipe.seed, step)
        assert (info["loops"], info["grad_loops"]) == (n + k, k) and loss.requires_grad and torch.isfinite(loss)


@pytest.mark.slow
def test_loss_falls_and_the_checkpoint_loads(tmp_path: Path) -> None:
    import adapters

    tasks = ("chain2", "lookup")
    items = {task: synthetic.load_split(task, "train")[:240] for task in tasks}
    recipe = tiny_recipe(
        steps=30, batch_size=12, tasks=tasks, val_items=40, warmup_steps=5, log_every=1, save_every=1000, lr=3e-3
    )
    train(recipe, tmp_path / "h", progress=False, items=items, stop=synthetic.STOP)
    import json

    values = [json.loads(line)["loss"] for line in (tmp_path / "h" / "losses.jsonl").read_text().splitlines()]
    assert sum(values[-7:]) / 7 < 0.8 * sum(values[:7]) / 7, values
    adapter = adapters.load(f"huginn:{tmp_path / 'h'}")
    assert adapter.describe()["family"] == "huginn"


def test_a_draw_past_the_engines_loops_runs_at_the_most_it_can(tmp_path: Path) -> None:
    """The draw's tail is unbounded: at the largest mean a recipe takes, seed 0's step 1139 draws past the engine's
    MAX_LOOPS. It runs MAX_LOOPS (cut there), where it failed that step on every attempt, the draw being the same."""
    recipe = tiny_recipe(tasks=("chain2",), val_items=10, mean_recurrence=MAX_LOOPS // 4)
    draws = {step: sum(T.sampled_recurrence(recipe.mean_recurrence, 2, 0, step)) for step in range(1140)}
    assert max(draws.values()) == MAX_LOOPS and [s for s, r in draws.items() if r == MAX_LOOPS] == [1139]
    items = {"chain2": synthetic.load_split("chain2", "train")[:40]}
    data = TaskData(recipe.tasks, char_tokenizer(), recipe.val_items, items, synthetic.STOP)
    loss, info = make_objective(recipe, None)(_model(), data.batch(recipe.seed, 1139, 1, "cpu"), 1139)
    assert info["loops"] == MAX_LOOPS and torch.isfinite(loss)
    with pytest.raises(AdapterError, match=r"mean_recurrence must be in \[1, 256\], got 257"):
        tiny_recipe(mean_recurrence=MAX_LOOPS // 4 + 1)
