"""Batched generation on a static cache: left-padded prefill, then one decode loop on one page.

Prompts of different lengths are left-padded to a common length; each row keeps its own positions
(0 at its first real token) and a key mask hides the padding, so a row's tokens are the same as if
it ran alone. Gated (MELT) models prefill chunk by chunk (the config's chunk size); the chunks are
counted back from the prompt's last token, so that left padding does not move a row's chunk
boundaries (a 10-token prompt with chunk 4 runs as 2 + 4 + 4).

Ouro exit policies: every token still runs all r loops, because later tokens attend to its K/V
entries of every loop; the policy only picks which loop's output is sampled from (the fixed loop,
or the first loop whose cumulative exit probability reaches the threshold) and records it in
`loops_used`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from adapters.base import AdapterError, Generation, Sampling, dtype_short
from adapters.engine.cache import KVCache
from adapters.engine.memory import kv_bytes
from adapters.engine.model import LoopedLM, exit_probabilities


@dataclass(frozen=True)
class ExitPolicy:
    """`none`: read the last loop. `fixed`: read loop `loop` (1-based). `threshold`: first loop whose cumulative exit probability >= threshold."""

    kind: str = "none"
    loop: int | None = None
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("none", "fixed", "threshold"):
            raise AdapterError(f"exit policy {self.kind!r} is not one of none, fixed, threshold")
        if self.kind == "fixed" and (self.loop is None or self.loop < 1):
            raise AdapterError(f"exit policy 'fixed' needs exit_loop >= 1, got {self.loop!r}")
        if self.kind == "threshold" and not 0 < self.threshold <= 1:
            raise AdapterError(f"exit policy 'threshold' needs exit_threshold in (0, 1], got {self.threshold}")


def sample(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> Tensor:
    """[B, V] logits -> [B] token ids: greedy at temperature 0, else temperature, top-k, then top-p (nucleus).

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
    if sampling.top_p < 1.0:  # draw in sorted order, then map back: no scatter
        probs, order = torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True)
        probs = probs.masked_fill(probs.cumsum(dim=-1) - probs >= sampling.top_p, 0.0)
        return order.gather(-1, draw(probs, generator)[:, None]).squeeze(-1)
    return draw(torch.softmax(logits, dim=-1), generator)


def draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row with probability proportional to `probs` [B, V] (rows need not sum to 1).

    The exponential race, as gpt-fast samples: argmax of probs / E with E ~ Exp(1) i.i.d. picks index
    i with probability probs_i / sum(probs). Two cheap kernels instead of `torch.multinomial`, which
    costs more than a whole layer of a tiny model on the CPU and synchronises the host on a GPU.
    """
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(dim=-1)


def prefill_chunks(width: int, chunk: int) -> list[tuple[int, int]]:
    """Slot ranges of the prefill, aligned to the prompt's end: every row (left-padded) then sees the
    same chunks of its own tokens as when it runs alone. Only the first chunk may be shorter."""
    return [(max(0, end - chunk), end) for end in range(width, 0, -chunk)][::-1]


def _pick_loop(out: Any, model: LoopedLM, policy: ExitPolicy) -> tuple[Tensor, Tensor | None]:
    """Final states [B, d] and the 1-based loop each row exits at (None when the policy is `none`)."""
    if policy.kind == "none" or len(out.states) == 1:
        return out.states[-1], None
    states = torch.stack(out.states)  # [r, B, d]
    r, b = states.shape[:2]
    if policy.kind == "fixed":
        exit_idx = torch.full((b,), min(policy.loop, r) - 1, device=states.device)
    else:
        cum = exit_probabilities(out.gate_logits).cumsum(dim=0)
        exit_idx = (cum < policy.threshold).sum(dim=0).clamp(max=r - 1)
    final = states[exit_idx, torch.arange(b, device=states.device)]
    if model.coda:
        raise AdapterError("exit policies need a model without coda layers")
    return final, exit_idx + 1


def generate(
    model: LoopedLM,
    prompts: Sequence[Sequence[int]],
    sampling: Sampling,
    *,
    loops: int,
    eos_ids: set[int],
    tokenizer: Any | None = None,
    exit_policy: ExitPolicy = ExitPolicy(),
    generator: torch.Generator | None = None,
    on_cache: Callable[[KVCache | None], None] = lambda cache: None,
    pad_id: int = 0,
) -> list[Generation]:
    """Generate one continuation per prompt (token ids) in one batch. `on_cache` sees the live cache."""
    cfg = model.config
    device = model.model.embed_tokens.weight.device
    dtype = model.model.embed_tokens.weight.dtype
    b = len(prompts)
    lengths = [len(p) for p in prompts]
    if min(lengths) < 1:
        raise AdapterError("empty prompt: every prompt needs at least one token")
    width = max(lengths)
    if width >= cfg.max_position:
        raise AdapterError(f"prompt of {width} tokens does not fit the model's context of {cfg.max_position} tokens")
    capacity = min(width + sampling.max_new_tokens, cfg.max_position)
    if sampling.stop and tokenizer is None:
        raise AdapterError("stop strings need a tokenizer; this model has none (use eos or max_new_tokens)")

    tokens = torch.full((b, width), pad_id, dtype=torch.long)
    valid = torch.zeros((b, capacity), dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        valid[i, width - len(p) :] = True
    valid[:, width:] = True  # generated slots are never padding
    offsets = torch.tensor([width - n for n in lengths])
    positions = (torch.arange(width)[None, :] - offsets[:, None]).clamp(min=0)
    tokens, valid, positions, offsets = tokens.to(device), valid.to(device), positions.to(device), offsets.to(device)
    padded = bool((offsets > 0).any())
    keep_loops = exit_policy.kind != "none"
    looped = cfg.shared_layers > 0 and (loops > 1 or cfg.loops > 1)

    if device.type == "cuda":  # a clear error instead of an allocator OOM for a cache that cannot fit
        need = kv_bytes(cfg, capacity, b, loops, dtype_short(dtype))
        free = torch.cuda.mem_get_info(device)[0]
        if need > free:
            raise AdapterError(
                f"the KV cache for {b} sequences x {capacity} tokens needs {need / 1e9:.2f} GB but {free / 1e9:.2f} GB is free: "
                "lower max_new_tokens or the batch (max_batch)"
            )
    cache = KVCache(cfg, b, capacity, loops, dtype, device)
    on_cache(cache)
    model.prepare_inference()
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            for s0, s1 in prefill_chunks(width, cache.chunk):
                mask = None
                if padded or s0 > 0:
                    causal = torch.arange(s1, device=device)[None, :] <= torch.arange(s0, s1, device=device)[:, None]
                    own = torch.arange(s1, device=device)[None, :] == torch.arange(s0, s1, device=device)[:, None]
                    mask = ((valid[:, None, None, :s1] & causal) | own)  # padded queries see themselves (no NaN)
                out = model.step(tokens[:, s0:s1], positions[:, s0:s1], cache, s0, mask, loops, keep_loops)
                cache.length = s1
            state, exit_loop = _pick_loop(out, model, exit_policy)
            logits = model.logits(state)
            prefill_seconds = time.perf_counter() - t0

            # Decode: one step per token; the only host sync is reading the sampled ids back.
            t0 = time.perf_counter()
            budget = capacity - width
            new_tokens: list[list[int]] = [[] for _ in range(b)]
            exit_loops: list[list[int]] = [[] for _ in range(b)]
            finish: list[str | None] = [None] * b
            stop_window = max((len(s) for s in sampling.stop), default=0) + 2
            pos = positions[:, -1:] + 1
            for i in range(budget):
                nxt = sample(logits, sampling, generator)
                ids = nxt.tolist()
                chosen = exit_loop.tolist() if exit_loop is not None else [loops] * b
                for row in range(b):
                    if finish[row] is not None:
                        continue  # finished rows keep decoding with the batch; their tokens are dropped
                    new_tokens[row].append(ids[row])
                    exit_loops[row].append(chosen[row])
                    if ids[row] in eos_ids:
                        finish[row] = "eos"
                    elif sampling.stop:
                        tail = tokenizer.decode(new_tokens[row][-stop_window:], skip_special_tokens=True)
                        if any(s in tail for s in sampling.stop):
                            finish[row] = "stop"
                if i + 1 == budget or all(f is not None for f in finish):
                    break
                slot = width + i
                mask = valid[:, None, None, : slot + 1] if padded else None
                out = model.step(nxt[:, None], pos, cache, slot, mask, loops, keep_loops)
                cache.length = slot + 1
                pos = pos + 1
                state, exit_loop = _pick_loop(out, model, exit_policy)
                logits = model.logits(state)
            decode_seconds = time.perf_counter() - t0
    finally:
        on_cache(None)

    results = []
    for row in range(b):
        ids = new_tokens[row]
        text = None
        if tokenizer is not None:
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if finish[row] == "stop":
                text = text[: min(text.find(s) for s in sampling.stop if s in text)]
        results.append(
            Generation(
                token_ids=ids,
                text=text,
                finish_reason=finish[row] or "length",
                prompt_tokens=lengths[row],
                generated_tokens=len(ids),
                loops_used=exit_loops[row] if looped else None,
                prefill_seconds=prefill_seconds,
                decode_seconds=decode_seconds,
            )
        )
    return results
