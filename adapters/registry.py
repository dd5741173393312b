"""Adapter registry: a spec `PREFIX:ARG` picks a factory by prefix (`preset:qwen3-tiny`, `ouro:/ckpt`).

Built-in adapters register themselves when their module is imported; `BUILTIN_MODULES` lists
those modules so that `load` and `available` can import them on demand, keeping `import adapters`
light.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from adapters.base import Adapter, AdapterError

Factory = Callable[..., Adapter]

# Modules whose import registers built-in prefixes.
BUILTIN_MODULES: tuple[str, ...] = ("adapters.engine_adapter",)


@dataclass(frozen=True)
class AdapterEntry:
    prefix: str
    factory: Factory
    description: str
    source: str  # "builtin" or the plugin's name


_REGISTRY: dict[str, AdapterEntry] = {}
_loaded_builtins = False


def register(prefix: str, description: str, source: str = "builtin") -> Callable[[Factory], Factory]:
    """Decorator: `@register("preset", "random-init engine preset")` on `factory(arg, **overrides)`."""

    def wrap(factory: Factory) -> Factory:
        _REGISTRY[prefix] = AdapterEntry(prefix, factory, description, source)
        return factory

    return wrap


def _ensure_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded_builtins = True


def available() -> list[AdapterEntry]:
    """Every registered adapter prefix, sorted."""
    _ensure_builtins()
    return sorted(_REGISTRY.values(), key=lambda e: e.prefix)


def load(spec: str, **overrides: Any) -> Adapter:
    """Build the adapter a spec names. Overrides include `loops`, `dtype`, `device`, `seed`."""
    _ensure_builtins()
    prefix, sep, arg = spec.partition(":")
    if not sep or not arg:
        raise AdapterError(f"model spec {spec!r} must look like PREFIX:NAME_OR_PATH (prefixes: {', '.join(sorted(_REGISTRY))})")
    entry = _REGISTRY.get(prefix)
    if entry is None:
        raise AdapterError(f"unknown model prefix {prefix!r} in {spec!r} (known: {', '.join(sorted(_REGISTRY))})")
    return entry.factory(arg, **overrides)
