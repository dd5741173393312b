"""Per-token exits: which loop a decoded token stops at, and what its skipped loops leave in the KV.

A policy (`ExitPolicy`) names when a token stops looping: at a fixed loop (`fixed`), or at the first
loop where its criterion fires (`threshold`, criteria `adapters.base.EXIT_CRITERIA`):

- `gate`: Ouro's learned exit gate. With lambda_t = sigmoid(gate(normed state of loop t)), the exit
  probability of loop t is p_t = lambda_t * prod_{j<t}(1 - lambda_j) and the last loop takes the rest
  (`adapters.engine.families.ouro.exit_probabilities`, the official code's distribution); a token exits at the
  first loop whose cumulative probability reaches the threshold, computed here loop by loop.
- `kl`, `entropy`: Huginn's model-free tests between consecutive loops' next-token distributions, as
  the official `KLExitEvaluator` and `EntropyDiffExitEvaluator` define them (seal-rg/recurrent-pretraining,
  `recpre/raven_modeling_minimal.py` at 59e0b69b): `kl` is KL(previous || current), the previous loop
  of loop 1 being the uniform distribution; `entropy` is |H(current) - H(previous)| with
  H = -sum p log(p + 1e-10) and a previous entropy of 100 before loop 1. A token exits when the value is
  below the threshold. The distribution is the loop's state through what follows the loops (the final
  norm and any coda layers, whose K/V the final pass rewrites) and the LM head, in float32.

What happens to the loops after the exit is the fill (`ExitPolicy.fill`):

- `read`: every token still runs all r loops, as the released Ouro code does; the policy only picks the
  loop whose output is sampled from (`pick_loop`). No work is skipped.
- `copy` (default when a policy is set): the token's remaining loops are skipped, and its K/V entries of
  those loops hold its exit loop's K/V, layer by layer (vllm-rlt's "last exited"). For the recurrent-depth
  family this is Huginn's official cache lookup "latest-m4": at core layer j of step t a later token reads
  a skipped token's entry of the latest step it ran at the same layer j (the same phase of the four-layer
  block), which for a token that ran loops 1..e is loop e. (The official lookup hard-codes Huginn-0125's
  four core layers, `step % 4`; the engine matches by core layer, the same thing there, for any core
  depth.) A gated (MELT) layer keeps one K/V row per token, which after the exit already holds the state
  at exit: `copy` writes nothing there.
- `masked`: the remaining loops are skipped and their entries left unwritten; at loop t later tokens attend
  only to the tokens that ran loop t (each key's loops run, `ran`, masks it per loop: Huginn's official lookup
  strategy "skip"). Refused on gated layers, whose one row per token every loop reads.

Exits apply to decoded tokens only: a prompt's tokens (prefill) run every loop; the first generated token
is sampled from the prompt's last position at the loop the policy picks from those outputs (so its
`loops_used` is that loop, the loop it was read from), except on a model with coda layers under a skipping
fill, where it is drawn from the prefill's final output (`ExitPolicy.reads_loops`). The decode step runs
exits two ways that must give the same tokens: the continuous engine's active set (`ActiveRows`: a row that exits leaves the step, later
loops run on the still-looping rows only, their cache step narrowed to them) and the static path's masked
full step (`MaskedRows`: every row computes every loop; an exited row's state is frozen and its K/V writes
are replaced by the fill). Either way the rows' states at exit are gathered and any coda layers run once
on all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from adapters.base import EXIT_CRITERIA, AdapterError, check_exit_threshold

if TYPE_CHECKING:
    from adapters.engine.layers import Span

EXIT_KINDS: tuple[str, ...] = ("none", "fixed", "threshold")
EXIT_FILLS: tuple[str, ...] = ("read", "copy", "masked")
SKIPPING_FILL = "copy"  # the default fill of a policy that is set


@dataclass(frozen=True)
class ExitPolicy:
    """`none`: read the last loop. `fixed`: stop at loop `loop` (1-based). `threshold`: stop where `criterion` fires
    at `threshold`. `fill`: what a token leaves in its skipped loops' K/V (`read`: nothing is skipped)."""

    kind: str = "none"
    loop: int | None = None
    threshold: float = 1.0
    criterion: str = "gate"
    fill: str = "read"

    def __post_init__(self) -> None:
        if self.kind not in EXIT_KINDS:
            raise AdapterError(f"exit policy {self.kind!r} is not one of {', '.join(EXIT_KINDS)}")
        if self.kind == "fixed" and (type(self.loop) is not int or self.loop < 1):
            raise AdapterError(f"exit policy 'fixed' needs exit_loop >= 1, got {self.loop!r}")
        if self.criterion not in EXIT_CRITERIA:
            raise AdapterError(f"exit_criterion {self.criterion!r} is not one of {', '.join(EXIT_CRITERIA)}")
        if self.fill not in EXIT_FILLS:
            raise AdapterError(f"exit_fill {self.fill!r} is not one of {', '.join(EXIT_FILLS)}")
        check_exit_threshold(self.threshold, self.criterion)

    @property
    def skips(self) -> bool:
        """Whether decoded tokens skip the loops after their exit (any fill but `read`)."""
        return self.kind != "none" and self.fill != "read"

    def reads_loops(self, coda: bool) -> bool:
        """Whether a step that runs every loop (a prefill; any step under `read`) keeps each loop's state to read the
        exit loop's: under any policy but a skipping one on a model with coda layers, whose output is the coda's, so
        its first token is drawn from the prefill's final output, every loop run (`loops_used` r)."""
        return self.kind != "none" and not (self.skips and coda)


class ExitCheck:
    """A policy's criterion over the loops of one step, row by row, its running values kept between loops."""

    def __init__(self, policy: ExitPolicy, loops: int, gate: Callable[[Tensor], Tensor] | None) -> None:
        self.policy, self.loops, self.gate = policy, loops, gate
        self.before: Tensor | None = None  # gate: prod_{j<t}(1 - lambda_j)
        self.cum: Tensor | None = None  # gate: cumulative exit probability
        self.prev: Tensor | None = None  # kl: previous log-probabilities; entropy: previous entropy

    def fires(self, t: int, normed: Tensor, logits: Callable[[], Tensor]) -> Tensor:
        """Bool [B]: the rows that stop after loop t (0-based); `normed` [B, d] the loop's normed state,
        `logits()` [B, V] its next-token logits (called only by kl and entropy)."""
        policy, b = self.policy, normed.shape[0]
        if t == self.loops - 1:
            return torch.ones(b, dtype=torch.bool, device=normed.device)
        if policy.kind == "fixed" and policy.loop is not None:  # a fixed policy always has its loop
            return torch.full((b,), t + 1 >= policy.loop, dtype=torch.bool, device=normed.device)
        if policy.criterion == "gate":
            return self._gate(normed) >= policy.threshold
        return self._change(logits().float()) < policy.threshold

    def _gate(self, normed: Tensor) -> Tensor:
        if self.gate is None:
            raise AdapterError("the exit criterion 'gate' needs a model with an exit gate")
        lam = torch.sigmoid(self.gate(normed).squeeze(-1).float())
        before = torch.ones_like(lam) if self.before is None else self.before
        p = lam * before
        self.cum = p if self.cum is None else self.cum + p
        self.before = before * (1 - lam)
        return self.cum

    def _change(self, logits: Tensor) -> Tensor:
        if self.policy.criterion == "kl":
            logp = F.log_softmax(logits, dim=-1)
            prev = torch.full_like(logp, -math.log(logp.shape[-1])) if self.prev is None else self.prev
            self.prev = logp
            return F.kl_div(logp, prev, reduction="none", log_target=True).sum(dim=-1)
        probs = F.softmax(logits, dim=-1)
        entropy = -torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        prev = torch.full_like(entropy, 100.0) if self.prev is None else self.prev
        self.prev = entropy
        return (entropy - prev).abs()

    def keep(self, rows: Tensor) -> None:
        """Only `rows` (an index into the current rows) go on looping: the running values follow them."""
        for name in ("before", "cum", "prev"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[rows])


def pick_loop(
    states: list[Tensor],
    policy: ExitPolicy,
    gate: Callable[[Tensor], Tensor] | None,
    logits: Callable[[Tensor], Tensor],
) -> tuple[Tensor, Tensor | None]:
    """Read policy over a step that ran every loop: the final states [B, d] of the loop each row exits at,
    and that loop (1-based; None when the policy is `none`). `states` are the loops' normed states."""
    if policy.kind == "none" or len(states) == 1:
        return states[-1], None
    check, loops = ExitCheck(policy, len(states), gate), []
    for t, state in enumerate(states):
        fired = check.fires(t, state, functools.partial(logits, state))
        loops.append(torch.where(fired, t + 1, len(states)))
    exit_loop = functools.reduce(torch.minimum, loops)  # the first loop that fired, else the last
    stacked = torch.stack(states)
    return stacked[exit_loop - 1, torch.arange(stacked.shape[1], device=stacked.device)], exit_loop


# ------------------------------------------------------------------------- the decode step's rows
def exit_rows(
    policy: ExitPolicy,
    loops: int,
    gate: Callable[[Tensor], Tensor] | None,
    span: Span,
    cache: Any,
    h: Tensor,
    active_set: bool,
    ran: Tensor | None,
) -> ExitRows:
    """The rows of a decode step of states h [B, 1, d]: an active set on a cache step that can `narrow`, or the
    masked full step on any cache. `ran` [B, L] (fill `masked`): the loops each key the step attends to ran."""
    check = ExitCheck(policy, loops, gate)
    return (ActiveRows if active_set else MaskedRows)(check, span, cache, h, ran)


class ExitRows:
    """The rows of one decode step under a skipping policy: the criterion, each row's state at exit and loops run.

    `model.run_exits` runs the loops and hands each loop's output to `after_loop`; `span` and `cache`
    are what the next loop runs on. Subclasses say what becomes of a row that exits.
    """

    def __init__(self, check: ExitCheck, span: Span, cache: Any, h: Tensor, ran: Tensor | None) -> None:
        self.check, self.span, self.cache, self.full_cache, self.full_span = check, span, cache, cache, span
        self.final = torch.zeros_like(h)  # [B, n, d]: each row's state at its exit
        self.loops_run = torch.zeros(h.shape[0], dtype=torch.long, device=h.device)
        self.done = False
        self.ran = ran  # [B, L] under the fill `masked`: the loops each key ran

    def loop_span(self, t: int) -> Span:
        """The span loop t (0-based) runs on: under the fill `masked`, only the keys that ran loop t are seen."""
        if self.ran is None:
            return self.span
        ran = (self.ran > t)[:, None, None, :]
        return dataclasses.replace(self.span, mask=ran if self.span.mask is None else self.span.mask & ran)

    def fires(self, t: int, h: Tensor, normed: Tensor, head: Callable[[Tensor, Span, Any], Tensor]) -> Tensor:
        return self.check.fires(t, normed[:, -1], lambda: head(h, self.span, self.cache)[:, -1])

    def after_loop(
        self,
        t: int,
        h: Tensor,
        y: Tensor,
        normed: Tensor,
        carried: list[Tensor],
        head: Callable[[Tensor, Span, Any], Tensor],
    ) -> tuple[Tensor, list[Tensor]]:
        """Loop t's output y -> (the state the next loop reads, `carried` for the rows going on)."""
        raise NotImplementedError


class ActiveRows(ExitRows):
    """The continuous engine's active set: a row that exits leaves the step (under `copy` its skipped loops' K/V
    filled with its exit loop's), and later loops run on the still-looping rows only."""

    def __init__(self, check: ExitCheck, span: Span, cache: Any, h: Tensor, ran: Tensor | None) -> None:
        super().__init__(check, span, cache, h, ran)
        self.index = torch.arange(h.shape[0], device=h.device)  # the looping rows, as rows of the step
        self.loops = check.loops

    def after_loop(
        self,
        t: int,
        h: Tensor,
        y: Tensor,
        normed: Tensor,
        carried: list[Tensor],
        head: Callable[[Tensor, Span, Any], Tensor],
    ) -> tuple[Tensor, list[Tensor]]:
        """Loop t's output y for the looping rows -> (the state the next loop reads, `carried` for the rows going on)."""
        fired = self.fires(t, y, normed, head)
        if not bool(fired.any()):
            return y, carried
        leaving = self.index[fired]
        self.final[leaving] = y[fired]
        self.loops_run[leaving] = t + 1
        if t + 1 < self.loops and self.check.policy.fill == "copy":  # `masked` leaves them unwritten, unread
            self.full_cache.fill_skipped(leaving, t, self.loops)
        stay = (~fired).nonzero().flatten()
        self.index = self.index[stay]
        self.done = self.index.numel() == 0
        if not self.done:
            self.check.keep(stay)
            self.ran = None if self.ran is None else self.ran[stay]
            self.span = narrow_span(self.full_span, self.index)
            self.cache = self.full_cache.narrow(self.index)
        return y[stay], [c[stay] for c in carried]


class MaskedRows(ExitRows):
    """The static path's reference: every row computes every loop; an exited row's state is frozen and its
    K/V writes replaced by its exit loop's (`FrozenCache`; under the fill `masked` no later token reads them)."""

    def __init__(self, check: ExitCheck, span: Span, cache: Any, h: Tensor, ran: Tensor | None) -> None:
        self.active = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
        super().__init__(check, span, FrozenCache(cache, self.active), h, ran)

    def after_loop(
        self,
        t: int,
        h: Tensor,
        y: Tensor,
        normed: Tensor,
        carried: list[Tensor],
        head: Callable[[Tensor, Span, Any], Tensor],
    ) -> tuple[Tensor, list[Tensor]]:
        fired = self.fires(t, y, normed, head) & self.active
        self.final = torch.where(fired[:, None, None], y, self.final)
        self.loops_run = torch.where(fired, t + 1, self.loops_run)
        state = torch.where(self.active[:, None, None], y, h)
        self.active &= ~fired  # in place: the cache reads it
        return state, carried


class FrozenCache:
    """A cache whose rows outside `active` (bool [B], read at every call) neither change their latent (MELT's h)
    nor write new K/V in the loops after the first: their writes are the K/V they last wrote at that layer. (Rows
    exit after a loop, so every row runs loop 1; prelude and coda layers run as loop 0 and write as they are.)
    Under a layout that folds loops into one entry (shared mean, EMA) a frozen row writes what its entry holds
    (`KVCache.stored`), which the fold leaves as it is (old + (old - old) x w), as the active set leaves it
    unwritten; a quantized entry is then packed again from its dequantized values (the same values, its scale
    to float32 rounding)."""

    in_place = False  # its writes replace rows before the wrapped cache sees them: attention reads `update`'s

    def __init__(self, cache: Any, active: Tensor) -> None:
        self.cache, self.active = cache, active
        self.last: dict[int, tuple[Tensor, Tensor]] = {}
        self.folds = cache.layout.folds

    def kv_source(
        self, layer: int, loop: int, x: Tensor, gate: Callable[[Tensor, Tensor, int], Tensor]
    ) -> Tensor | None:
        active = self.active[:, None, None]
        source: Tensor | None = self.cache.kv_source(
            layer, loop, x, lambda x, h, t: torch.where(active, gate(x, h, t), h)
        )
        return source

    def update(self, layer: int, loop: int, k: Tensor, v: Tensor, slot: int) -> tuple[Tensor, Tensor]:
        if loop > 0:
            active = self.active[:, None, None, None]
            last = self.cache.stored(layer, loop, slot, slot + k.shape[2]) if self.folds else self.last[layer]
            k, v = torch.where(active, k, last[0]), torch.where(active, v, last[1])
        self.last[layer] = (k, v)
        read: tuple[Tensor, Tensor] = self.cache.update(layer, loop, k, v, slot)
        return read


def narrow_span(span: Span, rows: Tensor) -> Span:
    """The span of `rows` (an index) of a step: their RoPE tables and mask."""
    cos, sin = span.rope
    return dataclasses.replace(span, rope=(cos[rows], sin[rows]), mask=None if span.mask is None else span.mask[rows])
