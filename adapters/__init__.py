"""Model adapters: the engine (MELT, Ouro, Qwen3 from one config) and anything else that generates.

Public API: `load(spec, **overrides) -> Adapter`, `inspect(spec, **overrides)` (a spec's facts without
loading weights, where the adapter can tell), `resolve(spec)` (the full spec a bare name such as
`ouro-1.4b` stands for), `Sampling`, `Generation`, `Adapter`.
Importing this package stays light: torch is imported only when an adapter is loaded.
"""

from adapters.base import Adapter, AdapterError, Generation, Sampling
from adapters.registry import available, inspect, load, register, resolve
from measures import MEMORY_KEYS

__all__ = [
    "MEMORY_KEYS",
    "Adapter",
    "AdapterError",
    "Generation",
    "Sampling",
    "available",
    "inspect",
    "load",
    "register",
    "resolve",
]
