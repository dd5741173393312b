"""Model adapters: the engine (MELT, Ouro, Qwen3 from one config) and anything else that generates.

Public API: `load(spec, **overrides) -> Adapter`, `Sampling`, `Generation`, `Adapter`.
Importing this package stays light: torch is imported only when an adapter is loaded.
"""

from adapters.base import MEMORY_KEYS, Adapter, AdapterError, Generation, Sampling
from adapters.registry import available, load, register

__all__ = ["MEMORY_KEYS", "Adapter", "AdapterError", "Generation", "Sampling", "available", "load", "register"]
