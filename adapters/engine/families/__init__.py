"""The families the engine runs, one module each, and the one place a config picks its family (`family_of`).

`standard` (Qwen3, the plain stack and the base of the hooks), `ouro` (LoopLM: per-loop K/V, the exit gate),
`melt` (gated K/V, a latent per shared layer, chunk-wise prefill), `huginn` (recurrent depth: Huginn-0125 and
the retrofitted models), `ifm` (the IFM Part II looped rows: hashed initial state, diagonal injection, terminal KV). `standard.py`'s docstring says what a family's hooks are; `sharing` holds the KV
policies a per-loop model runs instead of its own (`LoopConfig.kv_policy`).
"""

from __future__ import annotations

from adapters.engine.config import LoopConfig
from adapters.engine.families.huginn import Huginn, Retrofit
from adapters.engine.families.ifm import Ifm
from adapters.engine.families.melt import GATED, Melt
from adapters.engine.families.ouro import PER_LOOP, Ouro
from adapters.engine.families.sharing import policy_layout
from adapters.engine.families.standard import STANDARD, Family, KVLayout, Standard

__all__ = [
    "GATED",
    "KV_LAYOUTS",
    "PER_LOOP",
    "STANDARD",
    "Family",
    "Huginn",
    "Ifm",
    "KVLayout",
    "Melt",
    "Ouro",
    "Retrofit",
    "Standard",
    "family_of",
]

KV_LAYOUTS: dict[str, KVLayout] = {layout.name: layout for layout in (STANDARD, PER_LOOP, GATED)}


def family_of(cfg: LoopConfig) -> Family:
    """The family whose hooks build and run `cfg`'s model: by its `family` where that implies the blocks (the recurrent
    ones), else by its KV strategy (a `custom` config runs as the family whose KV it has). Its `kv` is the layout of the
    config's `kv_policy` where one is set."""
    if cfg.family == "huginn":
        family: Family = Huginn(cfg)
    elif cfg.family == "retrofit":
        family = Retrofit(cfg)
    elif cfg.family == "ifm":
        family = Ifm(cfg)
    else:
        family = {"gated": Melt, "per_loop": Ouro}.get(cfg.kv_strategy, Standard)(cfg)
    if cfg.kv_policy is not None:
        family.kv = policy_layout(cfg.kv_policy)
    return family
