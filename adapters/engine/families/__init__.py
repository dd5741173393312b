"""The families the engine runs, one module each, and the one place a config picks its family (`family_of`).

`standard` (Qwen3, the plain stack and the base of the hooks), `ouro` (LoopLM: per-loop K/V, the exit gate),
`melt` (gated K/V, a latent per shared layer, chunk-wise prefill), `huginn` (recurrent depth: Huginn-0125 and
the retrofitted models), `ifm` (the IFM Part II looped rows: hashed initial state, diagonal injection, terminal KV).
`standard.py`'s docstring says what a family's hooks are; where a family's K/V live (its layout, the KV policy a
per-loop model may run instead) is `adapters.engine.kv`'s.
"""

from __future__ import annotations

from adapters.engine.config import LoopConfig
from adapters.engine.families.huginn import Huginn, Retrofit
from adapters.engine.families.ifm import Ifm
from adapters.engine.families.melt import Melt
from adapters.engine.families.ouro import Ouro
from adapters.engine.families.standard import Family, Standard

__all__ = ["Family", "Huginn", "Ifm", "Melt", "Ouro", "Retrofit", "Standard", "family_of"]


def family_of(cfg: LoopConfig) -> Family:
    """The family whose hooks build and run `cfg`'s model: by its `family` where that implies the blocks (the recurrent
    ones), else by its KV strategy (a `custom` config runs as the family whose KV it has)."""
    if cfg.family == "huginn":
        return Huginn(cfg)
    if cfg.family == "retrofit":
        return Retrofit(cfg)
    if cfg.family == "ifm":
        return Ifm(cfg)
    return {"gated": Melt, "per_loop": Ouro}.get(cfg.kv_strategy, Standard)(cfg)
