"""The plain decoder stack (Qwen3, and any config with the `standard` KV): the base every family extends.

A family is what the backbone (`adapters.engine.model.Backbone`) asks of a model besides the shared shape: the
block of each layer, the parts around the loops (embedding scale, a recurrent state, the exit gate, the norms
between loops), how a full-sequence forward is cut and blended (and the KV layout it blends with), and the parameters it adds. The
backbone builds itself from these hooks and never reads a family flag; adding a family is a module here that
overrides the hooks it changes, and `family_of` (the package's `__init__`) the one line that picks it.

Where a model's K/V live is not a family hook: it is the config's (`adapters.engine.kv.layouts.layout_of`, its KV
strategy's layout or its `kv_policy`'s); a family names only the layout a blended forward mixes with (`kv_reference`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import nn

from adapters.engine.config import LoopConfig
from adapters.engine.kv.layouts import KVLayout
from adapters.engine.layers import Block

if TYPE_CHECKING:
    from adapters.engine.families.recurrence import Recurrence


class Family:
    """The plain stack's hooks. `cfg` is the model's config; subclasses override what their family changes."""

    kv_reference: KVLayout | None = None  # the layout a blended forward mixes its K/V with (MELT's LoopLM), or none
    norm_after_loops = False  # the final norm once after the last loop, before any coda (Huginn)

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg = cfg

    def block(self, layer: int) -> Block:
        """Physical layer `layer`'s block."""
        return Block(self.cfg)

    @property
    def embed_scale(self) -> float | None:
        """The factor the embeddings are scaled by (None: unscaled)."""
        return None

    def state(self) -> Recurrence | None:
        """The recurrent state the loops start from and inject (`families.recurrence.Recurrence`); None: loop 1 reads e."""
        return None

    @property
    def has_exit_gate(self) -> bool:
        """Whether the model reads Ouro's early-exit gate (the config's `exit_gate`): the gate criterion needs one."""
        return self.cfg.exit_gate

    def exit_gate(self) -> nn.Linear | None:
        """Ouro's early-exit gate on each loop's normed state, where the config asks for one."""
        return nn.Linear(self.cfg.hidden_size, 1) if self.has_exit_gate else None

    @property
    def gate_variant(self) -> str | None:
        """The gate that writes the model's K/V (MELT's `gate_variant`), which a run's description names; None: none."""
        return None

    @property
    def first_skippable_loop(self) -> int:
        """The first loop (0-based) that can be skipped and the model still run (the probes' interactions)."""
        return 0

    @property
    def norm_each_loop(self) -> bool:
        """Whether the final norm follows every loop, its output feeding the next (Ouro's sandwich layout)."""
        return self.cfg.sandwich

    @property
    def prefill_chunk(self) -> int | None:
        """Tokens of a prompt one prefill step runs (MELT's chunk: its latent holds that many); None: all of it."""
        return None

    def forward_chunks(self, n: int, chunk_size: int | Sequence[int] | None) -> list[tuple[int, int]]:
        """(start, end) of each chunk a full-sequence forward over n tokens runs: one, unless the family prefills
        in chunks."""
        return [(0, n)]

    def extra_params(self) -> int:
        """Parameters beyond the shared shape (`adapters.engine.memory.count_params`): here the exit gate's."""
        return self.cfg.hidden_size + 1 if self.has_exit_gate else 0


class Standard(Family):
    """Qwen3 and any plain stack: every hook at its base value, one K/V entry per layer."""


def prefill_chunks(length: int, chunk: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk of a `length`-token prompt, counted back from its last token: only the
    first chunk may be shorter (10 tokens, chunk 4: 2 + 4 + 4). Generation's prefill and `LoopedLM.forward`
    both use it, so a forward's last position gives the logits the first token is sampled from, and left
    padding never moves a row's chunks."""
    return [(max(0, end - chunk), end) for end in range(length, 0, -chunk)][::-1]
