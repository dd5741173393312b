"""Where a token's K/V live: one `KVLayout` per KV policy, and the one table from a policy's name to its layout.

A layout says how many entries a token holds, which entry layer `layer` reads and writes at loop `loop`, and the
latent kept per token in flight. The caches (`adapters.engine.kv.cache`, the paged pool) and the analytic memory
model (`adapters.engine.kv.accounting`) read nothing else, so a new KV policy is one layout here and its name in
`adapters.engine.kv.policies`: a config runs its strategy's native layout unless its `kv_policy` names another
(`layout_of`), and a policy that folds a token's loops into one entry (shared mean, EMA) adds its write rule,
`fold`, beside `entry`.

The natives: `standard` (the plain stack), `per_loop` (Ouro, Huginn: an entry per loop of each shared layer),
`gated` (MELT: one entry per layer and a latent h). A per-loop model (Ouro, Huginn, a retrofit) is trained with an
entry per loop of each shared layer; the sharing policies run it without training, keeping one entry per layer and
token instead (the plain stack's count, a 1/r share of the shared layers' bytes), and every loop of a later token
reads it:

- `shared-last` (the Ouro paper's decode-time sharing): each loop writes over the entry, so a finished token
  leaves its last loop's K/V. A token's own loop t reads its own loop-t K/V; the tokens of the same step (a
  prompt prefilled in one step) read one another at loop t too, so a one-step prefill is exactly per-loop's:
  sharing acts at decoding, where the paper applies it (its 4x saving is decode-time sharing after a full prefill).
- `shared-mean`, `shared-ema[:ALPHA]` (the MELT paper's static baselines, without its trained gate): loop t
  folds its K/V into the entry (`fold`): the running mean of the loops so far, or `ALPHA * new + (1 - ALPHA) * old`.
  As under shared-last, the step's own tokens attend at loop t to their loop-t K/V (a one-step prefill is
  per-loop's); earlier steps' tokens are read as the fold of all their loops. So the three sharing policies
  differ only in what a finished token leaves.
- `latest-m4` (Huginn-0125's official `HuginnDynamicCache` lookup): per-loop entries; a token that skipped
  its later loops (an exit) is read at each of them from the latest loop of the same core layer it ran. The
  exit fill `copy` writes exactly those rows (`adapters.engine.exits`), so the layout is per-loop's and the
  bytes are per-loop's bound (the official cache stores only the steps a token ran, in a dict per step; the
  engine's blocks hold every loop's slot).
"""

from __future__ import annotations

from torch import Tensor

from adapters.engine.config import LoopConfig
from adapters.engine.kv.policies import DEFAULT_EMA_ALPHA, EMA, parse_kv_policy


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


class PerLoop(KVLayout):
    """`per_loop`: prelude entries, then loop t of shared layer i at `p + t * s + i` (HF Ouro's own
    `t * num_hidden_layers + i` when p = 0), then coda entries, which follow every loop's."""

    name = "per_loop"
    policy = "per-loop"
    grows_with_loops = True

    def entries(self, cfg: LoopConfig, loops: int) -> int:
        return cfg.prelude_layers + cfg.shared_layers * loops + cfg.coda_layers

    def entry(self, cfg: LoopConfig, layer: int, loop: int, loops: int) -> int:
        p, s = cfg.prelude_layers, cfg.shared_layers
        if layer < p:
            return layer
        return layer + s * (loop if layer < p + s else loops - 1)


class Gated(KVLayout):
    """`gated`: one entry per layer, a shared layer's row overwritten at every loop, plus the latent h of each
    shared layer for the tokens in flight (a prefill chunk, or the decoded tokens)."""

    name = "gated"
    policy = "gated"

    def latent_width(self, cfg: LoopConfig) -> int:
        return cfg.shared_layers * cfg.hidden_size

    def latent_tokens(self, cfg: LoopConfig) -> int:
        return cfg.chunk_size


class SharedLast(KVLayout):
    """`shared-last`: the plain stack's entries (one per physical layer, at every loop), each loop writing over the
    token's entry."""

    name = "shared_last"
    policy = "shared-last"


class SharedMean(SharedLast):
    """`shared-mean`: the entry holds the mean of the loops written so far."""

    name = "shared_mean"
    policy = "shared-mean"
    folds = True

    def fold(self, old: Tensor, new: Tensor, loop: int) -> Tensor:
        return old + (new - old) / (loop + 1)


class SharedEMA(SharedLast):
    """`shared-ema[:ALPHA]`: the entry moves toward each loop's K/V by ALPHA."""

    name = "shared_ema"
    folds = True

    def __init__(self, alpha: float = DEFAULT_EMA_ALPHA) -> None:
        self.alpha = alpha
        self.policy = EMA if alpha == DEFAULT_EMA_ALPHA else f"{EMA}:{alpha:g}"

    def fold(self, old: Tensor, new: Tensor, loop: int) -> Tensor:
        return old + (new - old) * self.alpha


class LatestM4(PerLoop):
    """`latest-m4`: per-loop entries, a skipped loop read from the token's latest loop of the same layer."""

    policy = "latest-m4"
    reads_latest = True


STANDARD, PER_LOOP, GATED = KVLayout(), PerLoop(), Gated()
LAYOUTS: dict[str, KVLayout] = {
    layout.policy: layout for layout in (STANDARD, PER_LOOP, GATED, SharedLast(), SharedMean(), LatestM4())
}  # a policy's name -> its layout (shared-ema's, which carries its ALPHA, is made per policy: `policy_layout`)
NATIVE = {layout.name: layout for layout in (STANDARD, PER_LOOP, GATED)}  # a `kv_strategy` -> the layout it trains
# a family trained for a layout other than its KV strategy's: the IFM Part II rows decode with terminal KV (the last
# recurrence's row per layer and token), as the release trains and evaluates them (`db.sets.OWN_KV_POLICY_OF_FAMILY`)
FAMILY_NATIVE = {"ifm": LAYOUTS["shared-last"]}


def policy_layout(policy: str) -> KVLayout:
    """The layout of a `kv_policy` the config has checked (`LoopConfig`), per-loop's and the natives' included."""
    name, alpha = parse_kv_policy(policy)
    return LAYOUTS[name] if alpha is None else SharedEMA(alpha)


def layout_of(cfg: LoopConfig) -> KVLayout:
    """The layout `cfg`'s model runs: its `kv_policy`'s where one is set, else its family's own (`FAMILY_NATIVE`) or its
    KV strategy's."""
    if cfg.kv_policy is not None:
        return policy_layout(cfg.kv_policy)
    return FAMILY_NATIVE.get(cfg.family) or NATIVE[cfg.kv_strategy]
