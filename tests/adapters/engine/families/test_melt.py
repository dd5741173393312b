"""MELT's family: the gated layout, its blocks and the gate's update `h <- z * h + (1 - z) * x` per variant, with
real tensors."""

from __future__ import annotations

import pytest
import torch

from adapters.engine.families.melt import GatedBlock, Melt, MeltGate, fresh_gate
from adapters.engine.kv.layouts import PER_LOOP
from adapters.engine.io.presets import preset
from adapters.engine.layers import Block

G = torch.Generator().manual_seed(0)


def gate(variant: str) -> MeltGate:
    return MeltGate(preset("melt-tiny").replace(gate_variant=variant))


def test_melt_runs_the_gated_layout_beside_its_looplm_s():
    cfg = preset("melt-tiny")
    family = Melt(cfg)
    assert family.kv_reference is PER_LOOP and family.prefill_chunk == cfg.chunk_size
    assert family.gate_variant == "elementwise" and family.first_skippable_loop == 1  # loop 1 sets h = x


def test_shared_layers_are_gated_blocks_and_the_rest_plain():
    cfg = preset("melt-tiny").replace(prelude_layers=1, coda_layers=1)
    blocks = [Melt(cfg).block(i) for i in range(cfg.num_layers)]
    assert [type(b) for b in blocks] == [Block, GatedBlock, GatedBlock, Block]


@torch.no_grad()
def test_each_variant_updates_the_latent_as_its_formula_says():
    x, h = torch.randn(1, 3, 128, generator=G), torch.randn(1, 3, 128, generator=G)
    torch.testing.assert_close(gate("last")(x, h, 2), x, rtol=0, atol=0)
    torch.testing.assert_close(gate("mean")(x, h, 2), 2 / 3 * h + 1 / 3 * x)  # the running mean after 3 loops
    ema = MeltGate(preset("melt-tiny").replace(gate_variant="ema", ema_decay=0.75))
    torch.testing.assert_close(ema(x, h, 1), 0.75 * h + 0.25 * x)
    scalar = gate("scalar")
    scalar.logit.fill_(0.3)
    z = torch.sigmoid(torch.tensor(0.3))
    torch.testing.assert_close(scalar(x, h, 1), z * h + (1 - z) * x)
    elementwise = gate("elementwise")
    z = torch.sigmoid(elementwise.w_z(x) + elementwise.u_z(h))
    torch.testing.assert_close(elementwise(x, h, 1), z * h + (1 - z) * x, rtol=0, atol=0)


@torch.no_grad()
@pytest.mark.parametrize("variant", ["elementwise", "scalar"])
def test_a_fresh_gate_keeps_the_latent_close_to_x(variant):
    """Bias (or logit) -2 and small weights: z = sigmoid(-2) ~ 0.12 where the weights add nothing."""
    g = gate(variant)
    fresh_gate(g, torch.Generator().manual_seed(1), std=0.0)
    x, h = torch.randn(1, 2, 128, generator=G), torch.randn(1, 2, 128, generator=G)
    z = torch.sigmoid(torch.tensor(-2.0))
    torch.testing.assert_close(g(x, h, 1), z * h + (1 - z) * x)


def test_the_gates_parameters_are_counted():
    cfg = preset("melt-tiny")
    model_gate = sum(p.numel() for p in gate("elementwise").parameters())
    ouro_part = cfg.hidden_size + 1  # the exit gate
    assert Melt(cfg).extra_params() == ouro_part + cfg.shared_layers * model_gate
    assert Melt(cfg.replace(gate_variant="scalar")).extra_params() == ouro_part + cfg.shared_layers
