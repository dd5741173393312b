"""Loop probes: what each loop does to the state, measured on a model's forward pass.

For token states h_0 (entering loop 1: the prelude's output, or the embeddings when p = 0) and h_l
(loop l's output, as loop l + 1 reads it), over every probed position:

- `angular_distance`: arccos(cos(h_l, h_{l-1})) / pi, mean over positions (0: same direction, 1: opposite).
- `relative_update`: ||h_l - h_{l-1}|| / ||h_{l-1}||, mean over positions.
- `state_variance`: the variance of h_l across positions over its mean squared norm,
  (mean ||h||^2 - ||mean h||^2) / mean ||h||^2: 0 when every position holds the same state.
- `interaction` at lag k: how much loop l's update u_l = h_l - h_{l-1} changes when loop l - k is
  skipped (its input handed on unchanged), as a ratio of mean norms: mean ||u_l' - u_l|| / mean ||u_l||.
  0 means loop l does the same whatever loop l - k did; it needs one extra forward per skipped loop.
  Without injection or Loop Gating the core is the same function at every loop, so skipping any
  earlier loop only delays the trajectory: the interaction then depends on l alone, not on k.
  A gated (MELT) model's loop 1 is never skipped (`first_skip`).

Values are per loop l = 1..r (1-based, as in the figures), accumulated over all texts; `lag` is None
except for `interaction`. Everything runs through `LoopedLM.forward` with a `LoopTrace`, so gated
(MELT) models are probed chunk-wise exactly as they evaluate.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from adapters.engine.families import family_of
from adapters.engine.model import LoopedLM, LoopTrace

METRICS = ("angular_distance", "relative_update", "state_variance", "interaction")
ROUNDING = 1e-6  # an update smaller than this times the state's norm is float32 rounding, not an update


@dataclass(frozen=True)
class ProbeValue:
    loop: int  # 1-based loop index l
    metric: str  # one of METRICS
    lag: int | None  # k for `interaction`, else None
    value: float  # NaN where undefined (an interaction with a loop whose update is below ROUNDING)


def _states(
    model: LoopedLM,
    ids: Tensor,
    loops: int,
    skip: frozenset[int] = frozenset(),
    on_loop: Callable[[], None] | None = None,
) -> Tensor:
    """[r + 1, n, d] float32: h_0 .. h_r of one text (batch 1)."""
    trace = LoopTrace(skip=skip, on_loop=on_loop)
    model(ids, loops=loops, trace=trace)
    return torch.stack(trace.joined())[:, 0].float()


class _Sums:
    """Running sums per (loop, metric, lag) -> (numerator, denominator): means of per-position values
    (denominator = positions), ratios of mean norms (denominator = the norms' sum)."""

    def __init__(self) -> None:
        self.sums: dict[tuple[int, str, int | None], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.variance: dict[int, tuple[Tensor, float, int]] = {}  # loop -> (sum h, sum ||h||^2, positions)

    def add(self, key: tuple[int, str, int | None], numerator: float, denominator: float) -> None:
        self.sums[key][0] += numerator
        self.sums[key][1] += denominator

    def add_states(self, loop: int, h: Tensor) -> None:
        """Accumulate sum h, sum ||h||^2 and the count for the state variance across all positions."""
        total, squares, count = self.variance.get(loop, (torch.zeros(h.shape[-1]), 0.0, 0))
        self.variance[loop] = (total + h.sum(0), squares + float(h.pow(2).sum()), count + h.shape[0])

    def values(self) -> list[ProbeValue]:
        out = [ProbeValue(l, m, k, n / d if d else math.nan) for (l, m, k), (n, d) in self.sums.items()]
        for loop, (total, squares, count) in self.variance.items():
            mean_sq = squares / count
            out.append(
                ProbeValue(
                    loop,
                    "state_variance",
                    None,
                    (mean_sq - float((total / count).pow(2).sum())) / mean_sq if mean_sq else math.nan,
                )
            )
        return sorted(out, key=lambda v: (METRICS.index(v.metric), v.loop, v.lag or 0))


def first_skip(model: LoopedLM) -> int:
    """The first loop (0-based) a probe may skip, the family's (a gated MELT model's loop 1 sets its latent h = x, so
    it always runs, and interactions with loop 1 are not measured there)."""
    return family_of(model.config).first_skippable_loop


@torch.no_grad()
def probe(
    model: LoopedLM, texts: Iterable[Tensor], loops: int, on_loop: Callable[[], None] | None = None
) -> list[ProbeValue]:
    """Every metric of every loop 1..`loops` over the token ids of `texts` (each [n], run one at a time);
    `on_loop` is called after each loop that runs (r per text, then r - 1 per loop skipped)."""
    model.eval()
    sums = _Sums()
    for ids in texts:
        ids = ids[None]
        h = _states(model, ids, loops, on_loop=on_loop)
        updates = h[1:] - h[:-1]  # u_1 .. u_r
        for l in range(1, loops + 1):
            before, after = h[l - 1], h[l]
            cos = torch.nn.functional.cosine_similarity(after, before, dim=-1).clamp(-1, 1)
            sums.add((l, "angular_distance", None), float(torch.arccos(cos).sum() / math.pi), after.shape[0])
            ratio = updates[l - 1].norm(dim=-1) / before.norm(dim=-1).clamp_min(1e-12)
            sums.add((l, "relative_update", None), float(ratio.sum()), after.shape[0])
            sums.add_states(l, after)
        for skipped in range(first_skip(model), loops - 1):  # 0-based; the last loop has no later loop to affect
            h_skip = _states(model, ids, loops, frozenset({skipped}), on_loop)
            for l in range(skipped + 2, loops + 1):
                change = (h_skip[l] - h_skip[l - 1]) - updates[l - 1]
                size = float(updates[l - 1].norm(dim=-1).sum())
                if size <= ROUNDING * float(h[l - 1].norm(dim=-1).sum()):
                    size = 0.0  # rounding, not an update: nothing to interact with (NaN unless other texts have one)
                sums.add((l, "interaction", l - skipped - 1), float(change.norm(dim=-1).sum()) if size else 0.0, size)
    return sums.values()
