"""`kernels.norm.add_rms_norm`, a block's residual add fused with the RMSNorm after it, against torch's ops through
Triton's interpreter on the CPU (`tests.support.triton_interpreter`), and the blocks' choice of it: only outside
autograd.

The tolerance is a bound on float32 rounding in the two computations, derived from their arithmetic
(`norm_bound`), never fitted.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from adapters.engine.adapter import load_preset
from adapters.engine.layers import rms
from tests.support.triton_interpreter import Counted, add_rms_norm, gamma, with_kernels

pytestmark = pytest.mark.numerics  # parity with the torch path: .ci/run checks the bounds under a second CPU capability


def norm_bound(h: Tensor, weight: Tensor) -> Tensor:
    """[rows, 1]: two float32 evaluations of rms(x + r) * w, x + r rounded alike (one addition, exact on both
    sides), differ by at most twice gamma(d + 4) relative to max |(x + r) w| / rms: the sum of d squares, the mean,
    the epsilon, the square root, the division and the weight's product, each within u."""
    d = h.shape[-1]
    scale = (h * weight).abs().amax(-1, keepdim=True) / h.pow(2).mean(-1, keepdim=True).sqrt()
    return 2 * gamma(d + 4) * scale


def test_blocks_use_torch_norms_where_autograd_runs():
    """The fused kernel has no backward: with gradients enabled a block adds and norms with torch (the kernel is not
    called; the loss and every gradient are those without it); under inference mode it runs."""
    model = load_preset("ouro-tiny", dtype="fp32", device="cpu", seed=3).model
    tokens = torch.tensor([[1, 5, 9, 12, 7]])
    counted = Counted(add_rms_norm)
    runs = []
    for add_norm in (None, counted):
        with_kernels(model, add_norm)
        model.zero_grad()
        loss = model(tokens).logits.sum()
        loss.backward()
        runs.append((loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}))
    (plain, grads), (loss, fused_grads) = runs
    assert counted.calls == 0 and torch.equal(loss, plain) and grads.keys() == fused_grads.keys() and len(grads) > 10
    assert all(torch.equal(grads[name], fused_grads[name]) for name in grads)
    with torch.inference_mode():
        model(tokens)
    assert counted.calls == 2 * 4  # ouro-tiny: 2 shared layers x 4 loops


def test_add_rms_norm_matches_the_residual_then_the_norm():
    """Rows of a spread of magnitudes, a width that is not a power of two: the sum h = x + r exactly as torch adds
    it, and rms(h) * w within the rounding bound of the engine's own `rms`."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 96, generator=gen) * torch.rand(5, 3, 1, generator=gen).mul(6).exp()
    residual = torch.randn(5, 3, 96, generator=gen)
    weight = torch.rand(96, generator=gen) + 0.5
    eps = torch.tensor(1e-6)
    h, normed = add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(h, residual + x)
    expected = rms(residual + x, eps, weight)
    assert bool(((normed - expected).abs() <= norm_bound(residual + x, weight)).all())
