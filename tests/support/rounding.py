"""How far two float32 evaluations of one model may differ by rounding alone, measured on the model itself.

A float32 evaluation is, by backward error analysis, the exact model with each weight moved by a relative error of at
most n*u (u = 2^-24, n the longest sum a weight enters), and, for rounding errors of random sign, of order sqrt(n)*u
(Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019).
How far such a move carries the output is the model's own sensitivity s = max |d output| / d for every weight moved
by a relative +-d (random signs; d = 2^-12, far above rounding and small enough that the response is linear). Two
evaluations (the engine and the official code, or two of the engine's paths) then differ by at most about
2 * sqrt(n) * u * s. A chaotic recurrence (many loops on random weights) makes s large, and the bound grows with it;
the CPU's kernels (AVX512, AVX2, scalar) choose which rounding, never how large, so the bound holds on any of them,
where a fixed 1e-5 held on the CPU it was fitted to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

UNIT_ROUNDOFF = 2.0**-24  # float32
PROBE = 2.0**-12  # the relative weight move that measures the sensitivity
FIXTURE_DIGITS = 0.5e-7  # the reference fixtures round each logit to 7 decimals


def longest_sum(model: torch.nn.Module) -> int:
    """The longest inner product of the model's matrix products: the widest input a weight matrix reads."""
    return max(p.shape[-1] for p in model.parameters() if p.dim() >= 2)


@contextmanager
def moved_weights(model: torch.nn.Module, relative: float) -> Iterator[None]:
    """Every parameter moved by `relative` of itself with a fixed random sign, then restored exactly."""
    saved = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            signs = torch.randint(0, 2, p.shape, generator=gen).to(p.device, p.dtype) * 2 - 1
            p.mul_(1 + relative * signs)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, value in zip(model.parameters(), saved):
                p.copy_(value)


def rounding_bound(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> float:
    """The largest difference rounding alone allows between two float32 evaluations of `run` (a forward of `model`):
    2 * sqrt(n) * u * s, with s the sensitivity measured here (module docstring)."""
    with torch.no_grad():
        exact = run()
        with moved_weights(model, PROBE):
            moved = run()
    sensitivity = (moved - exact).abs().max().item() / PROBE
    return 2 * math.sqrt(longest_sum(model)) * UNIT_ROUNDOFF * sensitivity
