"""The plain decoder stack (Qwen3, and any config with the `standard` KV): the base every family extends.

A family is what the backbone (`adapters.engine.model.Backbone`) asks of a model besides the shared shape: the
block of each layer, the parts around the loops (embedding scale, a recurrent state, the exit gate, the norms
between loops), how a full-sequence forward is cut and blended, the parameters it adds, and its KV layout. The
backbone builds itself from these hooks and never reads a family flag; adding a family is a module here that
overrides the hooks it changes, and `family_of` (the package's `__init__`) the one line that picks it.

A `KVLayout` is where a token's K/V live: entries per token, which entry layer `layer` reads and writes at loop
`loop`, and the latent kept per token in flight. The caches (`adapters.engine.cache`, the paged pool) and the
analytic memory model (`adapters.engine.memory`) read nothing else, so a new KV policy is one layout: a family's
`kv` is its native layout unless the config's `kv_policy` names another (`family_of`, `families.sharing`), and a
policy that folds a token's loops into one entry (shared mean, EMA) adds its write rule, `fold`, beside `entry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import Tensor, nn

from adapters.engine.config import LoopConfig
from adapters.engine.layers import Block

if TYPE_CHECKING:
    from adapters.engine.families.huginn import Recurrence


class KVLayout:
    """`standard`: one entry per physical layer (prelude, shared, coda in order), written once per token."""

    name = "standard"
    policy = "standard"  # the `kv_policy` that names it
    grows_with_loops = False  # whether a token holds an entry per loop (exits may then leave loops unwritten)
    reads_latest = False  # whether a skipped loop is read from the token's latest one (so written: exit_fill copy)
    folds = (
        False  # whether a loop's K/V are folded into the entry its earlier loops wrote (`fold`), not written over it
    )

    def entries(self, cfg: LoopConfig, loops: int) -> int:
        """K/V entries one token holds at `loops` loops."""
        return cfg.num_layers

    def entry(self, cfg: LoopConfig, layer: int, loop: int, loops: int) -> int:
        """The entry that holds physical layer `layer`'s rows at loop `loop` (0-based) of `loops`."""
        return layer

    def table(self, cfg: LoopConfig, loops: int) -> list[list[int]]:
        """`table[layer][loop]`: `entry` for every layer and loop, what the caches index by."""
        return [[self.entry(cfg, layer, loop, loops) for loop in range(loops)] for layer in range(cfg.num_layers)]

    def fold(self, old: Tensor, new: Tensor, loop: int) -> Tensor:
        """What loop `loop` (>= 1) leaves in a token's entry that holds `old` when it computes `new`: `new` here."""
        return new

    def latent_width(self, cfg: LoopConfig) -> int:
        """Values kept per token in flight besides its K/V (MELT's latent h: shared layers x d); 0 for none."""
        return 0

    def latent_tokens(self, cfg: LoopConfig) -> int:
        """Tokens in flight the latent is kept for (MELT: a prefill chunk); 0 without a latent."""
        return 0

    def has_latent(self, cfg: LoopConfig) -> bool:
        return self.latent_width(cfg) > 0


STANDARD = KVLayout()


class Family:
    """The plain stack's hooks. `cfg` is the model's config; subclasses override what their family changes."""

    kv: KVLayout = STANDARD
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
        """The recurrent state the loops start from and inject (`families.huginn.Recurrence`); None: loop 1 reads e."""
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
