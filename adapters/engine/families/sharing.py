"""KV policies a per-loop model runs without training: one entry per layer and token, or Huginn's lookup.

A per-loop model (Ouro, Huginn, a retrofit) is trained with an entry per loop of each shared layer. The sharing
policies keep one entry per layer and token instead (the plain stack's count, a 1/r share of the shared layers'
bytes), and every loop of a later token reads it:

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

from adapters.engine.config import DEFAULT_EMA_ALPHA, parse_kv_policy
from adapters.engine.families.melt import GATED
from adapters.engine.families.ouro import PER_LOOP, PerLoop
from adapters.engine.families.standard import STANDARD, KVLayout


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
        self.policy = "shared-ema" if alpha == DEFAULT_EMA_ALPHA else f"shared-ema:{alpha!r}"  # ALPHA as given

    def fold(self, old: Tensor, new: Tensor, loop: int) -> Tensor:
        return old + (new - old) * self.alpha


class LatestM4(PerLoop):
    """`latest-m4`: per-loop entries, a skipped loop read from the token's latest loop of the same layer."""

    policy = "latest-m4"
    reads_latest = True


SHARED_LAST, SHARED_MEAN, LATEST_M4 = SharedLast(), SharedMean(), LatestM4()


def policy_layout(policy: str) -> KVLayout:
    """The layout of a `kv_policy` the config has checked (`LoopConfig`), per-loop's and the natives' included."""
    name, alpha = parse_kv_policy(policy)
    if alpha is not None:  # shared-ema's
        return SharedEMA(alpha)
    layouts = (STANDARD, PER_LOOP, GATED, SHARED_LAST, SHARED_MEAN, LATEST_M4)
    return {layout.policy: layout for layout in layouts}[name]
