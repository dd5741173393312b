"""Ouro (LoopLM) and any looped model with per-loop K/V (the recurrence study's CoreLoop shapes).

Each loop of each shared layer writes its own K/V entry (the `per_loop` layout); at loop t a layer attends to the loop-t
entries of earlier tokens, so KV grows as layers x tokens x r. The exit gate (`Family.exit_gate`, read from the
config) turns each loop's normed state into an exit distribution (`exit_probabilities`), as the official code does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from adapters.engine.families.standard import Family


class Ouro(Family):
    """A LoopLM: the plain stack's blocks (Ouro's sandwich norms where the config says), looped, with per-loop K/V."""


def exit_probabilities(gate_logits: Tensor) -> Tensor:
    """[r, ...] gate logits -> [r, ...] exit probabilities: p_t = l_t * prod_{j<t}(1 - l_j), the last loop
    takes the rest."""
    lam = torch.sigmoid(gate_logits.float())
    survive = torch.cumprod(1 - lam, dim=0)
    before = torch.cat((torch.ones_like(survive[:1]), survive[:-1]), dim=0)
    probs = lam * before
    probs[-1] = before[-1]
    return probs
