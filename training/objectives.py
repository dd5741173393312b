"""Training objectives for the tiny zoo and for LoopLM -> MELT conversion (model side).

Everything here is pure tensor math over what the engine's training forward returns (per-loop
logits, exit-gate probabilities, per-(layer, loop) post-attention outputs), so the same functions
train a 0.4M-parameter zoo model on the CPU and convert Ouro-1.4B into MELT-1.6B on GPUs.

The objectives (docs/architecture.md, "MELT conversion"):

- language modelling: cross-entropy on the target tokens, masked (`lm_loss`);
- Ouro's exit gate: the expected loss under the exit distribution minus an entropy bonus
  (`exit_gate_loss`), which trains every loop and the gate together;
- MELT stage 1: per-loop distillation from the frozen LoopLM's logits (`distill_loss`) while the
  K/V attention sees is interpolated `a * KV_melt + (1 - a) * KV_looplm`, `a` ramped 0 -> 1 by
  `kv_mix`;
- Huginn's sampled recurrence: a heavy-tailed loop count drawn per step, backprop through its last
  loops only (`sampled_recurrence`); the loss is `lm_loss` on the final logits;
- MELT stage 2: stage 1 plus `beta * sum_{l,t} ||o_melt(l,t) - stopgrad(o_looplm(l,t))||^2` on the
  post-attention outputs (`alignment_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from adapters.engine.config import MAX_LOOPS


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` [B, L] over positions where `mask` [B, L] is 1 (0 if the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position negative log-likelihood [B, L] of `targets` [B, L] under `logits` [B, L, V]."""
    return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked next-token cross-entropy: the plain objective of the non-looped models."""
    return _masked_mean(token_nll(logits, targets), mask)


def exit_gate_loss(
    loop_logits: Sequence[torch.Tensor],
    exit_probs: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    entropy_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Ouro's entropy-regularised objective: `sum_t p_t * L_t - entropy_weight * H(p)`, per token.

    `exit_probs` [T, B, L] is the exit distribution over loops the engine's forward returns
    (`p_t = lambda_t * prod_{j<t} (1 - lambda_j)`, the last loop taking the rest).

    Every loop's logits get gradient (weighted by how likely the model is to exit there) and the
    gate learns to exit where the loss is low; the entropy term keeps the exit distribution from
    collapsing onto one loop early in training. Returns the loss and, for logging, each loop's
    masked cross-entropy and the mean exit loop.
    """
    per_loop = torch.stack([token_nll(lg, targets) for lg in loop_logits])  # [T, B, L]
    p = exit_probs.float()
    entropy = -(p * p.clamp_min(1e-9).log()).sum(0)
    loss = _masked_mean((p * per_loop).sum(0) - entropy_weight * entropy, mask)
    loops = torch.arange(1, len(loop_logits) + 1, dtype=p.dtype, device=p.device).view(-1, 1, 1)
    info = {f"ce_loop{t + 1}": _masked_mean(per_loop[t], mask).item() for t in range(len(loop_logits))}
    info["mean_exit_loop"] = _masked_mean((p * loops).sum(0), mask).item()
    return loss, info


def distill_loss(
    student_logits: Sequence[torch.Tensor],
    teacher_logits: Sequence[torch.Tensor],
    mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-loop distillation: mean over loops t of KL(teacher_t || student_t), masked per token.

    Matching every loop (not only the last) keeps MELT's accuracy at r < T close to the teacher's,
    which is what the accuracy-against-r figure compares.
    """
    if len(student_logits) != len(teacher_logits):
        raise ValueError(f"student has {len(student_logits)} loops of logits, teacher {len(teacher_logits)}")
    total = student_logits[0].new_zeros((), dtype=torch.float32)
    for s, t in zip(student_logits, teacher_logits):
        log_q = F.log_softmax(s.float() / temperature, dim=-1)
        log_p = F.log_softmax(t.detach().float() / temperature, dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        total = total + _masked_mean(kl, mask)
    return total * (temperature**2) / len(student_logits)


def alignment_loss(
    student_outputs: Sequence[torch.Tensor],
    teacher_outputs: Sequence[torch.Tensor],
    mask: torch.Tensor,
) -> torch.Tensor:
    """Stage-2 layer-wise alignment: `sum_{l,t} ||o_melt(l,t) - stopgrad(o_looplm(l,t))||^2`.

    Each entry is a post-attention output [B, L, d] of one (layer, loop) pair, in the same order
    for student and teacher. The squared norm is averaged over the valid tokens and divided by d,
    so beta does not have to change with the hidden size; the sum over (layer, loop) pairs is kept.
    """
    if len(student_outputs) != len(teacher_outputs):
        raise ValueError(f"student has {len(student_outputs)} (layer, loop) outputs, teacher {len(teacher_outputs)}")
    total = student_outputs[0].new_zeros((), dtype=torch.float32)
    for s, t in zip(student_outputs, teacher_outputs):
        sq = (s.float() - t.detach().float()).pow(2).mean(-1)
        total = total + _masked_mean(sq, mask)
    return total


def kv_mix(step: int, ramp_steps: int) -> float:
    """The interpolation weight `a` of stage 1 at `step`: linear 0 -> 1 over `ramp_steps`, then 1.

    `a = 0` makes attention see exactly the LoopLM's per-loop K/V (the converted model starts as its
    teacher); `a = 1` is pure MELT, which is how the model decodes.
    """
    if ramp_steps <= 0:
        return 1.0
    return min(1.0, step / ramp_steps)


def sampled_recurrence(
    mean_recurrence: int, backprop_depth: int, seed: int, step: int, sigma: float = 0.5
) -> tuple[int, int]:
    """Huginn's recurrence draw for one training step: (loops run without gradient, loops backpropagated).

    As Huginn-0125 was trained (Geiping et al. 2025, "Scaling up Test-Time Compute with Latent
    Reasoning", section 3.3; the "poisson-lognormal-filling" scheme of seal-rg/recurrent-pretraining):
    a rate tau ~ LogNormal(log(mean_recurrence) - sigma^2 / 2, sigma), so E[tau] = mean_recurrence, then
    the step's loop count r = Poisson(tau) + 1 (heavy-tailed, mostly near the mean, now and then far
    deeper). Gradients flow through the last k = min(backprop_depth, r) loops only; the r - k before
    them run without autograd (truncated backprop: the cost of a step does not grow with r).

    The draw is a pure function of (seed, step), like the step's batch, so a resumed run draws the same
    counts it would have drawn. Its tail is unbounded, and the engine runs at most `MAX_LOOPS` loops: a draw
    past them runs `MAX_LOOPS` (it would otherwise fail that step, and every retry of it, the draw being the same);
    the recipes' `mean_recurrence` is bounded (`adapters.zoo.RANGES`) so that this stays rare.
    """
    if mean_recurrence < 1 or backprop_depth < 1:
        raise ValueError(f"mean_recurrence and backprop_depth must be >= 1, got {mean_recurrence}, {backprop_depth}")
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 2 + 1)  # odd seeds: never a batch generator's seed
    mu = math.log(mean_recurrence) - sigma**2 / 2
    rate = torch.empty(1).log_normal_(mu, sigma, generator=gen)
    loops = min(int(torch.poisson(rate, generator=gen).item()) + 1, MAX_LOOPS)
    k = min(backprop_depth, loops)
    return loops - k, k


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.1) -> float:
    """Linear warmup to `peak_lr`, then cosine decay to `min_lr_ratio * peak_lr` at `total_steps`."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
