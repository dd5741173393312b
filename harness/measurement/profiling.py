"""`loopeval profile`: memory and speed against context length, measured beside the analytic KV size.

For each loop count and each context length L, a batch of L-token prompts is prefilled and decoded
for a few greedy steps while the memory sampler runs; each point records the same measures as an
evaluation run, plus prefill time, decode throughput and the KV bytes the analytic model
(`measures.analytic_kv_bytes` on the terms engine adapters describe) predicts for L + steps tokens.
The MELT paper's "memory at 32k tokens" is the point L = 32768.

Only torch, psutil and nvidia-ml-py are imported here (no lighteval, no sqlalchemy), so profiling
runs on a GPU machine whose Python lacks the evaluation stack.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import adapters
from adapters.base import Sampling, checked_context, checked_description, checked_generation, hook
from harness.errors import UserError
from harness.measurement.capacity import check_context, check_fits
from harness.measurement.sampler import DEFAULT_INTERVAL, MemorySampler
from harness.planning.spec import at_loops, check_int, checked_kv_dtype, checked_kv_policy, is_looped
from measures import PEAK_MEASURES, PROFILE_MEASURES, analytic_kv_bytes, merged_peak

DECODE_STEPS = 8


@dataclass
class ProfileResult:
    model: str
    description: dict[str, Any]  # Adapter.describe() of the first loop count
    points: list[dict[str, Any]]  # one per (loops, length): the columns of `profile_points`
    peaks: dict[str, int | None] = field(default_factory=dict)  # over all points, by `measures` name


def analytic_kv(description: dict[str, Any], tokens: int, batch: int) -> int | None:
    """The KV bytes the analytic model predicts, for engine models (those that describe its terms); None for others."""
    terms = description.get("analytic")
    return analytic_kv_bytes(terms, tokens, batch) if isinstance(terms, dict) else None


def _prompt(vocab_size: int, length: int, seed: int) -> list[int]:
    """Token ids from the upper half of the vocabulary: never the special ids (pad, bos, eos) at the bottom."""
    rng = random.Random(seed)
    return [rng.randrange(vocab_size // 2, vocab_size) for _ in range(length)]


def _free_device_memory() -> None:
    """Release cached blocks so NVML's per-process figure reflects this point, not the previous one."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class ProfilePlan:
    """Every point of a profile, checked before the first is measured (`plan_profile`)."""

    spec: str  # the full spec (a bare name resolved)
    lengths: list[int]
    loop_counts: list[int | None]  # [None]: the model's own loops (a plain model, or --loops not given)
    batch: int
    seed: int
    decode_steps: int
    adapter: Any = None  # loaded here only when the adapter could not describe itself from its config
    params: int | None = None  # the model's parameters (None: unknown)
    kv: dict[str, str] = field(default_factory=dict)  # the KV policy and dtype given (`--kv-policy`, `--kv-dtype`)

    @property
    def overrides(self) -> dict[str, Any]:
        """What the model is loaded with: the seed, and the KV policy and dtype where given."""
        return {"seed": self.seed, **self.kv}


def plan_profile(
    spec: str,
    lengths: Sequence[int],
    loops: Sequence[int] | None = None,
    batch: int = 1,
    *,
    seed: int = 0,
    decode_steps: int = DECODE_STEPS,
    kv_policy: str | None = None,
    kv_dtype: str | None = None,
) -> ProfilePlan:
    """Check every option and every point (context, memory) before anything is measured or stored; the KV policy and
    dtype (None: the model's own) by name here, and whether the model's family takes them by its inspector."""
    for option, values in (
        ("--lengths", lengths),
        ("--loops", loops or ()),
        ("--batch", [batch]),
        ("--decode-steps", [decode_steps]),
        ("--seed", [seed]),
    ):  # the seed is stored in a 64-bit column
        for value in values:
            check_int(option, value)
    if not lengths:
        raise UserError("--lengths needs at least one context length")
    kv = {
        key: check(value)
        for key, check, value in (("kv_policy", checked_kv_policy, kv_policy), ("kv_dtype", checked_kv_dtype, kv_dtype))
        if value is not None
    }
    spec = adapters.resolve(spec)
    adapter, facts = None, adapters.inspect(spec, seed=seed, **kv)
    if facts is None:
        adapter = adapters.load(spec, seed=seed, **kv)
        facts = checked_description(spec, hook(spec, "describe()", adapter.describe))
        facts |= {"max_context": checked_context(spec, hook(spec, "max_context", getattr, adapter, "max_context"))}
    check_context(spec, facts, "--lengths", max(lengths), generated=decode_steps)
    longest = max(lengths) + decode_steps
    counts: list[int | None] = list(loops) if loops and is_looped(facts) else [None]
    for r in counts:
        at_r = adapters.inspect(spec, seed=seed, **kv, **({} if r is None else {"loops": r}))
        if at_r is not None:
            check_fits(
                spec + ("" if r is None else f" at loops={r}"), at_r, longest, batch, "--lengths, --batch or --loops"
            )
    return ProfilePlan(spec, list(lengths), counts, batch, seed, decode_steps, adapter, facts.get("params"), kv)


def decode_sampling(decode_steps: int) -> Sampling:
    """How a profile point decodes: greedily, `decode_steps` tokens (it measures memory and speed, not answers)."""
    return Sampling(temperature=0.0, max_new_tokens=decode_steps)


def profile_model(
    plan: ProfilePlan,
    *,
    interval: float = DEFAULT_INTERVAL,
    on_point: Callable[[dict[str, Any]], None] = lambda point: None,
) -> ProfileResult:
    """Measure every (loops, length) point of a checked plan; the model is loaded once (loops changed
    in place where the adapter allows)."""
    spec, seed, batch, decode_steps, adapter = plan.spec, plan.seed, plan.batch, plan.decode_steps, plan.adapter
    description: dict[str, Any] = {}
    points: list[dict[str, Any]] = []
    peaks: dict[str, int | None] = dict.fromkeys(PEAK_MEASURES)
    for r in plan.loop_counts:
        # static batches: one cache of exactly the point's size, so its KV is the paper's single-sequence
        # memory at that context, not a pool's blocks (`adapters.engine.adapter`)
        adapter = at_loops(adapter, spec, r, plan.overrides, batching="static")
        info = checked_description(spec, hook(spec, "describe()", adapter.describe))
        vocab = (info.get("config") or {}).get("vocab_size") or len(adapter.tokenizer)
        for length in plan.lengths:
            _free_device_memory()
            sampler = MemorySampler(adapter, interval=interval, spec=spec)
            with sampler:
                prompts = [_prompt(vocab, length, seed)] * batch
                generations = [
                    checked_generation(spec, g)
                    for g in hook(spec, "generate()", adapter.generate, prompts, decode_sampling(decode_steps))
                ]
            if sampler.failure is not None:
                raise sampler.failure
            point_peaks = sampler.peaks()
            decode_seconds = max(g.decode_seconds for g in generations)
            generated = sum(g.generated_tokens for g in generations)
            point = {
                "context_tokens": length,
                "batch": batch,
                "loops": info.get("loops") if r is not None else None,
                "weights_bytes": point_peaks["weights_bytes"],
                "kv_bytes_analytic": analytic_kv(info, length + decode_steps, batch),
                # kv_bytes_allocated: the adapter's exact peak, since one cache may live shorter than a sampler tick
                **{name: point_peaks[name] for name in PROFILE_MEASURES},
                "prefill_seconds": max(g.prefill_seconds for g in generations),
                "decode_tokens_per_second": generated / decode_seconds if decode_seconds > 0 else None,
            }
            points.append(point)
            peaks = {name: merged_peak(name, peaks[name], value) for name, value in point_peaks.items()}
            on_point(point)
        description = description or info
    return ProfileResult(spec, description, points, peaks)
