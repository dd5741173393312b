"""Adapter registry: a spec `PREFIX:ARG` picks a factory by prefix (`preset:qwen3-tiny`, `ouro:/ckpt`).

A bare name stands for the one spec that has it (`ouro-1.4b` is `preset:ouro-1.4b`): prefixes that
know names (presets, the zoo) list them through `register(..., names=...)`, and `resolve` turns a
name into its full spec, so `run`, `profile`, `estimate` and the Python API accept the same
specs. A name two prefixes share (`ouro-tiny` is a preset and a zoo model) is refused with both
candidates rather than guessed.

Built-in adapters register themselves when their module is imported; `BUILTIN_MODULES` lists
those modules so that `load` and `available` can import them on demand, keeping `import adapters`
light.

Plugins add prefixes the same way, from two places, discovered once on first use:

- the entry-point group `loopeval.adapters` of any installed distribution: the entry point's name
  is the prefix and its value is either a module whose import calls `register` (`pkg.adapter`) or
  a factory `pkg.adapter:make` registered under that name;
- Python modules (`name.py`) and packages (`name/__init__.py`) in the folders listed in the
  `LOOPEVAL_ADAPTERS` environment variable (os.pathsep-separated) or passed to `load_plugins`
  (the CLI's `--adapters-dir`).

A plugin that fails (raises on import, registers nothing, or claims a built-in prefix) is reported
on stderr by name, recorded in `plugin_failures()`, and skipped: whatever it half-registered is
rolled back, and every other adapter still loads.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect as inspect_module
import os
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from inspect import Parameter, signature
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Iterator

from adapters.base import Adapter, AdapterError, hook, signals_seen

Factory = Callable[..., Adapter]
Inspector = Callable[..., dict[str, Any]]  # (arg, **overrides) -> describe()-like facts, no weights loaded
Names = Callable[[], Iterable[str]]  # the bare names a prefix knows: preset and zoo model names

# Modules whose import registers built-in prefixes.
BUILTIN_MODULES: tuple[str, ...] = (
    "adapters.engine.adapter",
    "adapters.hf_backend",
    "adapters.vllm_backend",
    "adapters.zoo",
)

ENTRY_POINT_GROUP = "loopeval.adapters"
ENV_VAR = "LOOPEVAL_ADAPTERS"
PLUGIN_NAMESPACE = "loopeval_plugins"  # folder plugins are imported as loopeval_plugins.<name>
BUILTIN = "builtin"  # the source of the prefixes BUILTIN_MODULES register


@dataclass(frozen=True)
class AdapterEntry:
    prefix: str
    factory: Factory
    description: str
    source: str  # "builtin", or where the plugin came from: "entry point DIST (VALUE)", "folder PATH"
    inspect: Inspector | None = None
    names: Names | None = None


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that was skipped: its name (entry-point name or module file) and why."""

    name: str
    source: str
    error: str


_REGISTRY: dict[str, AdapterEntry] = {}
_FAILURES: list[PluginFailure] = []
_loaded_builtins = False
_loaded_plugins = False
_scanned_dirs: set[Path] = set()
_current_source: str | None = None  # set while a plugin is being imported, so its `register` calls are attributed
_BROKEN_NAMES: set[str] = set()  # prefixes whose names() failed: reported once, then taken to know no names


def register(
    prefix: str,
    description: str,
    source: str | None = None,
    inspect: Inspector | None = None,
    names: Names | None = None,
) -> Callable[[Factory], Factory]:
    """Decorator: `@register("preset", "random-init engine preset")` on `factory(arg, **overrides)`.

    The source is the plugin being loaded whatever `source` says, else "builtin" for the modules in
    BUILTIN_MODULES, else `source` or the factory's module name. "builtin" cannot be claimed through
    `source`, and nobody may take over a prefix someone else registered.
    `inspect(arg, **overrides)`, when given, validates a spec and returns what `describe()` would
    say about loops and KV (at least `kv_strategy` and `loops`) from config files alone, so a sweep
    can plan its runs without loading weights. `names()`, when given, lists the arguments a user may
    give without the prefix (see `resolve`).
    """

    def wrap(factory: Factory) -> Factory:
        if source == BUILTIN:
            raise AdapterError(
                f"adapter prefix {prefix!r}: source {BUILTIN!r} is loopeval's own; a plugin's source is where it comes from"
            )
        builtin = _current_source is None and factory.__module__ in BUILTIN_MODULES
        origin = _current_source or (BUILTIN if builtin else source or f"module {factory.__module__}")
        existing = _REGISTRY.get(prefix)
        if existing is not None and existing.source != origin:
            raise AdapterError(f"adapter prefix {prefix!r} is already registered by {existing.source}")
        _REGISTRY[prefix] = AdapterEntry(prefix, factory, description, origin, inspect, names)
        return factory

    return wrap


def _ensure_builtins() -> None:
    """The built-in modules imported, then the plugins discovered (each once per process)."""
    global _loaded_builtins
    if not _loaded_builtins:
        _loaded_builtins = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
    _ensure_plugins()


def _ensure_plugins() -> None:
    """Discover entry points and LOOPEVAL_ADAPTERS folders once per process."""
    global _loaded_plugins
    if _loaded_plugins:
        return
    _loaded_plugins = True
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else "unknown distribution"
        _load_one(ep.name, f"entry point {dist} ({ep.value})", functools.partial(_register_entry_point, ep))
    env_dirs = [d for d in os.environ.get(ENV_VAR, "").split(os.pathsep) if d]
    _scan_dirs(env_dirs)


def load_plugins(dirs: Iterable[str | os.PathLike[str]] = ()) -> list[PluginFailure]:
    """Discover plugins (entry points, LOOPEVAL_ADAPTERS, and `dirs`) and return every failure so far.

    The CLI's `--adapters-dir DIR` calls this with its folders before resolving `--model`.
    A folder that does not exist is an AdapterError (the user named it); a broken module in it is not.
    """
    _ensure_builtins()
    _scan_dirs(dirs)
    return plugin_failures()


def plugin_failures() -> list[PluginFailure]:
    """Plugins skipped so far, in discovery order (for `loopeval models`)."""
    return list(_FAILURES)


def _scan_dirs(dirs: Iterable[str | os.PathLike[str]]) -> None:
    for raw in dirs:
        folder = Path(raw).expanduser().resolve()
        if not folder.is_dir():
            raise AdapterError(
                f"adapters folder {str(raw)!r} does not exist or is not a folder ({ENV_VAR} / --adapters-dir)"
            )
        if folder in _scanned_dirs:
            continue
        _scanned_dirs.add(folder)
        for path in sorted(folder.iterdir()):
            if path.name.startswith(("_", ".")):
                continue
            if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").is_file()):
                _load_one(path.stem, f"folder {folder}", functools.partial(_import_path, path))


def _import_path(path: Path) -> None:
    """Import a plugin file or package under a private module name, so it cannot shadow installed modules."""
    # the parent package must exist for a plugin package's relative imports to resolve
    sys.modules.setdefault(PLUGIN_NAMESPACE, types.ModuleType(PLUGIN_NAMESPACE, "adapter plugins loaded from folders"))
    name = f"{PLUGIN_NAMESPACE}.{path.stem}"
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            name, path / "__init__.py", submodule_search_locations=[str(path)]
        )
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _register_entry_point(ep: importlib.metadata.EntryPoint) -> None:
    """A module entry point registers on import; a callable one is registered as the factory for `ep.name`."""
    obj = ep.load()
    if isinstance(obj, types.ModuleType):
        if ep.name not in _REGISTRY:
            raise AdapterError(f"module {ep.value} was imported but registered no adapter named {ep.name!r}")
    elif callable(obj):
        doc = (obj.__doc__ or "").strip().splitlines()
        register(ep.name, doc[0] if doc else f"plugin adapter {ep.value}")(obj)
    else:
        raise AdapterError(
            f"entry point {ep.value} must name a module that registers {ep.name!r} or a factory, got {type(obj).__name__}"
        )


@contextmanager
def _attributed(source: str) -> Iterator[None]:
    global _current_source
    previous, _current_source = _current_source, source
    try:
        yield
    finally:
        _current_source = previous


def _load_one(name: str, source: str, action: Callable[[], None]) -> None:
    """Run one plugin's import; on any failure roll its registrations back, warn by name, and go on."""
    snapshot, signals = dict(_REGISTRY), signals_seen()
    try:
        with _attributed(source):
            action()
    except BaseException as exc:  # a plugin may fail in any way, sys.exit() and its own KeyboardInterrupt included
        _REGISTRY.clear()
        _REGISTRY.update(snapshot)
        if isinstance(exc, KeyboardInterrupt) and signals_seen() != signals:
            raise  # the user's Ctrl-C while a plugin was imported stops the command
        _skipped(name, source, exc)


def _skipped(name: str, source: str, exc: BaseException) -> None:
    """Record a plugin failure and warn about it by name, once."""
    error = (f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__])[0]
    _FAILURES.append(PluginFailure(name, source, error))
    print(f"loopeval: warning: adapter plugin {name!r} from {source} skipped: {error}", file=sys.stderr)


def _names(entry: AdapterEntry) -> list[str]:
    """The bare names `entry` knows. A plugin whose `names()` fails (or lists non-strings) is warned about once and
    knows none, so other names still resolve."""
    listed = entry.names
    if listed is None or entry.prefix in _BROKEN_NAMES:
        return []
    try:
        names = hook(entry.prefix, "names()", lambda: list(listed()))
        if not all(isinstance(name, str) for name in names):
            raise TypeError("names() must return strings")
    except (AdapterError, TypeError) as exc:
        _BROKEN_NAMES.add(entry.prefix)
        _skipped(f"{entry.prefix}: names()", entry.source, exc.__cause__ or exc)
        return []
    return names


def available() -> list[AdapterEntry]:
    """Every registered adapter prefix (built-ins and plugins), sorted; each entry names its source."""
    _ensure_builtins()
    return sorted(_REGISTRY.values(), key=lambda e: e.prefix)


def named_models() -> dict[str, list[str]]:
    """Every bare name a prefix knows, with the full specs it may stand for (two or more: ambiguous)."""
    _ensure_builtins()
    specs: dict[str, list[str]] = {}
    for entry in sorted(_REGISTRY.values(), key=lambda e: e.prefix):
        for name in _names(entry):
            specs.setdefault(name, []).append(f"{entry.prefix}:{name}")
    return specs


def resolve(spec: str) -> str:
    """The full spec a model name stands for: `PREFIX:ARG` as given, a bare name as the one spec that has it.

    AdapterError (one line) for an unknown prefix, an unknown name, or a name two prefixes share,
    listing the candidates, so every command that takes a model refuses it the same way.
    """
    _ensure_builtins()
    prefix, sep, arg = spec.partition(":")
    if sep and prefix in _REGISTRY and arg:
        return spec
    if sep:
        known = ", ".join(sorted(_REGISTRY))
        if not arg or not prefix:
            raise AdapterError(f"model spec {spec!r} must look like PREFIX:NAME_OR_PATH (prefixes: {known})")
        raise AdapterError(f"unknown model prefix {prefix!r} in {spec!r} (known: {known})")
    candidates = named_models().get(spec, [])
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise AdapterError(f"model name {spec!r} is ambiguous: give one of {', '.join(candidates)}")
    if os.path.exists(spec):
        raise AdapterError(
            f"model {spec!r} is a path: give it with its adapter's prefix, e.g. ouro:{spec} "
            f"(prefixes: {', '.join(sorted(_REGISTRY))})"
        )
    close = difflib.get_close_matches(spec, named_models(), n=3)
    hint = f"; close: {', '.join(close)}" if close else ""
    raise AdapterError(
        f"unknown model {spec!r}: give PREFIX:NAME_OR_PATH (prefixes: {', '.join(sorted(_REGISTRY))}) "
        f"or a name `loopeval models` lists{hint}"
    )


def _entry(spec: str) -> tuple[AdapterEntry, str]:
    """The registry entry of a spec (or bare name, see `resolve`) and the spec's argument."""
    prefix, _, arg = resolve(spec).partition(":")
    return _REGISTRY[prefix], arg


def load(spec: str, **overrides: Any) -> Adapter:
    """Build the adapter a spec (or bare name) names. Overrides include `loops`, `dtype`, `device`, `seed`.

    A plugin's adapter comes back `Guarded`: every hook of it, wherever the harness calls it, fails in one line."""
    entry, arg = _entry(spec)
    if entry.source == "builtin":
        _check_takes(spec, entry.factory, overrides)
        return entry.factory(arg, **overrides)
    return Guarded(spec, hook(spec, "its loader", entry.factory, arg, **overrides))


_ABSENT = object()


class Guarded:
    """A plugin's adapter as the harness holds it: the same attributes, each read, method call and attribute set
    going through `adapters.base.hook`. A plugin is someone else's code, and `run`, `profile`, `adapter check` and the
    bridge call its hooks in many places; here every one of them, present and future, is guarded once: whatever a
    hook raises, `sys.exit()` and BaseException included, is one AdapterError naming the plugin and the hook.
    An attribute the plugin lacks is still an AttributeError, so `hasattr` and the protocols' checks work as before."""

    def __init__(self, spec: str, adapter: Any) -> None:
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_adapter", adapter)

    def __getattr__(self, name: str) -> Any:
        value = hook(self._spec, name, getattr, self._adapter, name, _ABSENT)
        if value is _ABSENT:
            raise AttributeError(f"{self._spec}: its adapter has no attribute {name!r}")
        if not inspect_module.isroutine(value):  # data, and objects such as its tokenizer, are handed over as they are
            return value
        return functools.partial(hook, self._spec, f"{name}()", value)

    def __setattr__(self, name: str, value: Any) -> None:
        hook(self._spec, f"its {name} setter", setattr, self._adapter, name, value)

    def __repr__(self) -> str:
        return f"Guarded({self._spec!r})"


def _check_takes(spec: str, factory: Factory, overrides: dict[str, Any]) -> None:
    """AdapterError naming the overrides a built-in loader has no parameter for (an engine override such as
    `triton_kernels` on a `transformers:` model): one line before the call, not a TypeError from inside it. A
    loader taking `**overrides` checks them itself."""
    parameters = signature(factory).parameters
    if any(p.kind is Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(overrides) - set(parameters))
    if unknown:
        taken = ", ".join(name for name, p in parameters.items() if p.kind is Parameter.KEYWORD_ONLY)
        raise AdapterError(f"{spec}: no override {', '.join(unknown)} for this adapter (it takes {taken})")


def inspect(spec: str, **overrides: Any) -> dict[str, Any] | None:
    """Validate a spec from its config alone: describe()-like facts, or None where the adapter can only tell once loaded."""
    entry, arg = _entry(spec)
    if entry.inspect is None or entry.source == "builtin":
        return None if entry.inspect is None else entry.inspect(arg, **overrides)
    return hook(spec, "its inspector", entry.inspect, arg, **overrides)
