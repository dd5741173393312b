"""What both generation paths share: the token drawn from a step's logits, the logits it is drawn from, and stops.

The continuous engine (`adapters.engine.serving`) and the static baseline (`adapters.engine.generate`) take
these from here, so a sample's tokens are drawn, read and stopped the same way on either path. Every random
draw comes from the sample's own stream (`adapters.engine.streams`): sampling's noise is a pure function of
the stream's key, the step and the token id, so a sample's tokens do not depend on the batch it runs in.
"""

from __future__ import annotations

import array
from typing import Any
from collections.abc import Sequence

import torch
from torch import Tensor

from adapters.base import AdapterError, FinishReason, Sampling
from adapters.engine.exits import ExitPolicy, pick_loop
from adapters.engine.model import LoopedLM, StepOutput
from adapters.engine.streams import uniform


def int_tensor(values: list[int], device: torch.device) -> Tensor:
    """Host ints as an int64 tensor on `device`, through a buffer: `torch.tensor` on a list costs several times
    more, a measurable part of a tiny model's decode step (docs/benchmarks.md, "Figures behind choices in the
    code"). On a GPU the copy goes through pinned memory without
    waiting (a step's one host sync is reading the sampled ids)."""
    tensor = (
        torch.frombuffer(array.array("q", values), dtype=torch.int64) if values else torch.empty(0, dtype=torch.int64)
    )
    if device.type != "cuda":
        return tensor if device.type == "cpu" else tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def exponential_noise(rows: Tensor, vocab: int) -> Tensor:
    """Exp(1) draws [B, vocab] for rows whose stream and token index hash to `rows` [B] (int64, `stream_rows`):
    -log(u) of the stream's uniform draw for (key, step, token id) (`adapters.engine.streams`)."""
    return -torch.log(uniform(rows, vocab))


def sample(logits: Tensor, sampling: Sampling, rows: Tensor) -> Tensor:
    """[B, V] logits -> [B] token ids: greedy at temperature 0, else temperature, top-k, then top-p (nucleus).

    Row b draws from the stream and token index that `rows[b]` hashes (`stream_rows`, `exponential_noise`).
    The nucleus keeps the most probable tokens up to and including the first one at which the
    cumulative probability reaches top_p.
    """
    if sampling.greedy:
        return logits.argmax(dim=-1)
    if logits.dtype != torch.float32:
        logits = logits.float()
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    noise = exponential_noise(rows, logits.shape[-1])
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:  # outside the nucleus a token's probability is 0: it never wins the race
        ranked, order = torch.sort(probs, dim=-1, descending=True)
        cut = ranked.masked_fill(ranked.cumsum(dim=-1) - ranked >= sampling.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, cut)
    return draw(probs, noise)


def draw(probs: Tensor, noise: Tensor) -> Tensor:
    """One index per row with probability proportional to `probs` [B, V] (rows need not sum to 1).

    The exponential race, as gpt-fast samples: argmax of probs / E with E ~ Exp(1) i.i.d. (`noise`)
    picks index i with probability probs_i / sum(probs). Two cheap kernels instead of
    `torch.multinomial`, which costs more than a whole layer of a tiny model on the CPU and
    synchronises the host on a GPU.
    """
    return (probs / noise).argmax(dim=-1)


def read_logits(model: LoopedLM, out: StepOutput, policy: ExitPolicy) -> tuple[Tensor, Tensor | None]:
    """The logits to sample from [B, V] and the loop they come from (1-based; None for `none`): the loop each row
    stopped at when the step skipped loops, else the loop the policy picks among the step's (`pick_loop`)."""
    if out.loops_run is not None:
        return model.logits(out.states[-1]), out.loops_run
    state, exit_loop = pick_loop(out.states, policy, model.model.early_exit_gate, model.logits)
    return model.logits(state), exit_loop


def stop_reason(
    tokens: Sequence[int], eos_ids: set[int], sampling: Sampling, tokenizer: Any | None, start: int = 0
) -> FinishReason | None:
    """Why a sequence whose last token is `tokens[-1]` stops there: "eos", "stop", or None (it goes on).

    Stop strings are looked for in the decoded tail of the generated tokens (`tokens[start:]`), a few
    tokens longer than the longest stop.
    """
    if tokens[-1] in eos_ids:
        return "eos"
    if sampling.stop and tokenizer is not None:  # `check_request` refuses stops without a tokenizer
        window = max(len(s) for s in sampling.stop) + 2
        tail = tokenizer.decode(tokens[max(start, len(tokens) - window) :], skip_special_tokens=True)
        if any(s in tail for s in sampling.stop):
            return "stop"
    return None


def output_text(tokens: Sequence[int], finish: str, sampling: Sampling, tokenizer: Any | None) -> str | None:
    """A sequence's text, cut before the first stop string when one ended it (None without a tokenizer)."""
    if tokenizer is None:
        return None
    text: str = tokenizer.decode(tokens, skip_special_tokens=True)
    if finish == "stop":
        text = text[: min(text.find(s) for s in sampling.stop if s in text)]
    return text


def is_looped(model: LoopedLM, loops: int) -> bool:
    """Whether generations record the loops each token used (models whose shared layers loop)."""
    return model.config.shared_layers > 0 and (loops > 1 or model.config.loops > 1)


def check_request(model: LoopedLM, prompt: Sequence[int], sampling: Sampling, tokenizer: Any | None) -> int:
    """Slots one sequence needs (its prompt plus the new tokens, within the context), after checking the request."""
    if len(prompt) < 1:
        raise AdapterError("empty prompt: every prompt needs at least one token")
    if len(prompt) >= model.config.max_position:
        raise AdapterError(
            f"prompt of {len(prompt)} tokens does not fit the model's context of {model.config.max_position} tokens"
        )
    if sampling.stop and tokenizer is None:
        raise AdapterError("stop strings need a tokenizer; this model has none (use eos or max_new_tokens)")
    return min(len(prompt) + sampling.max_new_tokens, model.config.max_position)
