"""`zoo:NAME`: the trained tiny models shipped with loopeval as package data.

Each model is an engine checkpoint directory under `adapters/zoo_data/NAME/` (model.safetensors in
bf16, config.json, tokenizer.json) plus `train_info.json`, the budget it was trained with (steps,
tokens, CPU minutes, held-out validation accuracy). The recipes that produced them are in
`adapters/zoo_data/recipes.toml` (`Recipe`, read here); `loopeval zoo train NAME` reproduces one from
its seed with `training.train.train`.

Loading goes through the engine's own checkpoint factories (`qwen3:`, `ouro:`, `melt:` by the
checkpoint's family), so a zoo model is exactly what a user would get from the files themselves;
only the adapter's `spec` is rewritten to `zoo:NAME` so that results name the model.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from adapters.base import Adapter, AdapterError
from adapters.files import MIB, plain_name, read_text
from adapters.engine.config import MAX_LOOPS, LoopConfig
from adapters.engine.io.presets import preset
from adapters.registry import inspect, load, register

ZOO_DIR = Path(__file__).resolve().parent / "zoo_data"


def zoo_names() -> list[str]:
    """Names of the shipped models (directories holding a config.json), sorted."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def zoo_path(name: str) -> Path:
    """The checkpoint directory of a shipped model; AdapterError naming the known ones otherwise."""
    path = ZOO_DIR / name
    if "/" in name or not (path / "config.json").is_file():
        raise AdapterError(f"unknown zoo model {name!r} (shipped: {', '.join(zoo_names()) or 'none'})")
    return path


def zoo_info(name: str) -> dict[str, Any]:
    """Facts about a shipped model: its engine config and training budget (train_info.json)."""
    path = zoo_path(name)
    config = json.loads((path / "config.json").read_text())["config"]
    info_path = path / "train_info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    weight_bytes = (path / "model.safetensors").stat().st_size if (path / "model.safetensors").is_file() else 0
    return {"name": name, "path": str(path), "config": config, "train": info, "file_bytes": weight_bytes}


CHECKPOINT_PREFIXES = (
    "qwen3",
    "ouro",
    "melt",
    "huginn",
    "retrofit",
)  # the families with a checkpoint prefix of their own (adapters.engine.adapter)


def checkpoint_spec(path: str | Path) -> str:
    """The engine spec of an engine-format checkpoint folder (a zoo model, `zoo train`'s output): its family's prefix.

    A `custom` model (the CoreLoop shape, as the coreloop-tiny preset) has no prefix of its own and loads
    through `ouro:`, which reads an engine-format checkpoint as its config says, family included.
    """
    family = json.loads((Path(path) / "config.json").read_text())["config"]["family"]
    return f"{family if family in CHECKPOINT_PREFIXES else 'ouro'}:{path}"


def engine_spec(name: str) -> str:
    """The engine spec of a shipped model (`checkpoint_spec` of its folder)."""
    return checkpoint_spec(zoo_path(name))


def inspect_zoo(name: str, **overrides: Any) -> dict[str, Any]:
    facts = inspect(engine_spec(name), **overrides)
    if facts is None:  # every engine spec has an inspector (`adapters.engine.adapter`)
        raise AdapterError(f"zoo model {name!r}: its engine spec has no inspector")
    return facts


@register(
    "zoo",
    "trained tiny models shipped with loopeval (qwen3-tiny-small, qwen3-tiny-deep, ouro-tiny, melt-tiny, ablations, the recurrence lab)",
    inspect=inspect_zoo,
    names=zoo_names,
)
def load_zoo(name: str, **overrides: Any) -> Adapter:
    """Load a shipped model by name with the engine adapter of its family (overrides as for any engine spec)."""
    adapter = load(engine_spec(name), **overrides)
    adapter.spec = f"zoo:{name}"
    return adapter


# ------------------------------------------------------------------------------------ recipes
RECIPES_PATH = ZOO_DIR / "recipes.toml"
KINDS = ("lm", "looplm", "melt", "huginn")


@dataclass(frozen=True)
class Recipe:
    """Everything that decides one zoo model; the fields are documented in recipes.toml."""

    name: str
    kind: str
    preset: str
    config: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    seed: int = 0
    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    min_lr_ratio: float = 0.1
    tasks: tuple[str, ...] = ("addition", "chain2", "chain3", "chain4", "lookup")
    val_items: int = 200
    log_every: int = 25
    save_every: int = 200
    # looplm
    entropy_weight: float = 0.05
    exit_bias_init: float = 0.0
    # huginn (sampled recurrence)
    mean_recurrence: int = 4
    backprop_depth: int = 2
    # melt
    teacher: str = ""
    gate_variant: str = "elementwise"
    chunk_size: int = 4
    chunkwise: bool = True
    ramp_steps: int = 200
    stage2_start: int = 400
    beta: float = 1.0
    distill_temperature: float = 1.0

    def __post_init__(self) -> None:
        plain_name(self.name, "recipe name")  # `zoo train` writes the model to OUT/NAME, inside OUT
        for f in fields(self):
            _check_field(self.name, f, getattr(self, f.name))
        if self.kind not in KINDS:
            raise AdapterError(f"recipe {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "melt" and not self.teacher:
            raise AdapterError(f"recipe {self.name}: a melt recipe needs a teacher")
        if self.kind != "melt":
            self.model_config()  # the preset and its config fields, checked now rather than when training starts

    def with_overrides(self, **changes: Any) -> Recipe:
        """A copy with some fields changed (None values are ignored: CLI options left unset)."""
        known = set(self.__dataclass_fields__)
        unknown = set(changes) - known
        if unknown:
            raise AdapterError(f"unknown recipe field(s) {', '.join(sorted(unknown))}")
        data = asdict(self)
        data.update({k: v for k, v in changes.items() if v is not None})
        data["tasks"] = tuple(data["tasks"])
        return Recipe(**data)

    def model_config(self) -> LoopConfig:
        return preset(self.preset).replace(**self.config)


# Each number's range (low, high; a float's low is excluded where the name is in OPEN_LOW): far beyond any recipe that
# trains, they stop a typo or a hostile file (a learning rate of 1e9, a temperature of 0: NaN, a seed past what
# torch's generators take) before anything is built. Sizes beyond memory are `training.train.training_bytes`' to refuse.
RANGES: dict[str, tuple[int, int | float]] = {
    "seed": (0, 2**32 - 1),
    "steps": (1, 10**9),
    "batch_size": (1, 1 << 20),
    "lr": (0, 1),
    "warmup_steps": (0, 10**9),
    "weight_decay": (0, 1),
    "grad_clip": (0, 10**6),
    "min_lr_ratio": (0, 1),
    "val_items": (0, 10**7),
    "log_every": (1, 10**9),
    "save_every": (1, 10**9),
    "entropy_weight": (0, 100),
    "exit_bias_init": (-100, 100),
    # a huginn step's loop count is drawn around this mean with a heavy tail, cut at the engine's MAX_LOOPS
    # (`training.objectives.sampled_recurrence`): at a mean of MAX_LOOPS / 4 about one step in 800 is cut there; at
    # MAX_LOOPS, half of them, which would train another distribution than the one asked for
    "mean_recurrence": (1, MAX_LOOPS // 4),
    "backprop_depth": (1, MAX_LOOPS),
    "chunk_size": (1, 1 << 16),
    "ramp_steps": (0, 10**9),
    "stage2_start": (0, 10**9),
    "beta": (0, 10**6),
    "distill_temperature": (0, 100),
}
OPEN_LOW = ("lr", "grad_clip", "distill_temperature")  # 0 trains nothing, clips every gradient away, divides by zero


def _check_field(recipe: str, f: Field[Any], value: Any) -> None:
    """AdapterError unless `value` has the type of the field's default (a finite number for floats, >= 0 for ints) and
    lies in its range (`RANGES`)."""
    kind = dict if f.name == "config" else str if f.default is MISSING else type(f.default)
    checks: dict[type, tuple[Callable[[Any], bool], str]] = {
        int: (lambda v: type(v) is int and v >= 0, "an integer >= 0"),
        float: (lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number"),
        bool: (lambda v: type(v) is bool, "true or false"),
        str: (lambda v: isinstance(v, str), "a string"),
        tuple: (lambda v: isinstance(v, tuple) and all(isinstance(t, str) for t in v), "a list of task names"),
        dict: (lambda v: isinstance(v, dict), "a table of engine config fields"),
    }
    check, what = checks[kind]
    if not check(value):
        raise AdapterError(f"recipe {recipe}: {f.name} must be {what}, got {value!r}")
    if f.name in RANGES:
        low, high = RANGES[f.name]
        if not (low < value if f.name in OPEN_LOW else low <= value) or value > high:
            bound = "(" if f.name in OPEN_LOW else "["
            raise AdapterError(f"recipe {recipe}: {f.name} must be in {bound}{low}, {high}], got {value!r}")


def _with_bases(tables: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """Each model's table over its `base` model's (resolved the same way, description dropped), `config` merged
    key by key: a variant names only the fields it changes. Bases are followed in a loop and each model is
    resolved once, so a chain of any length is one pass and a cycle is an error."""
    resolved: dict[str, dict[str, Any]] = {}
    for name in tables:
        chain = [name]  # name, its base, that one's base, ... up to a resolved model or one without a base
        while chain[-1] not in resolved and "base" in tables[chain[-1]]:
            base = tables[chain[-1]]["base"]
            if not isinstance(base, str) or base not in tables or base in chain:
                raise AdapterError(
                    f"recipes file {path}, model {chain[-1]}: base {base!r} is not another model of the file, "
                    "or its bases lead back here"
                )
            chain.append(base)
        merged = resolved.get(chain[-1])
        for step in reversed(chain[:-1] if merged is not None else chain):
            table = {k: v for k, v in tables[step].items() if k != "base"}
            config = table.get("config", {})
            if not isinstance(config, dict):
                raise AdapterError(
                    f"recipes file {path}, model {step}: config must be a table of engine config fields, got {config!r}"
                )
            parent = {k: v for k, v in (merged or {}).items() if k != "description"}  # a description is never inherited
            merged = resolved[step] = {**parent, **table, "config": {**parent.get("config", {}), **config}}
    return resolved


RECIPES_LIMIT = MIB  # bytes; the shipped file is a few KB


def load_recipes(path: Path = RECIPES_PATH) -> dict[str, Recipe]:
    """Every recipe in the TOML file: `[defaults]` merged under each `[models.NAME]` table (over its `base`)."""
    try:
        data = tomllib.loads(read_text(path, "recipes file", RECIPES_LIMIT))
    except tomllib.TOMLDecodeError as exc:
        raise AdapterError(f"cannot read recipes file {path}: {exc}") from None
    except RecursionError:
        raise AdapterError(f"cannot read recipes file {path}: arrays or tables nested too deeply") from None
    defaults = data.get("defaults", {})
    tables = data.get("models", {})
    for what, table in (
        ("[defaults]", defaults),
        ("[models]", tables),
        *((f"[models.{n}]", t) for n, t in tables.items()),
    ):
        if not isinstance(table, dict):
            raise AdapterError(f"recipes file {path}: {what} must be a table, got {table!r}")
    recipes = {}
    for name, table in _with_bases(tables, path).items():
        merged = {**defaults, **table, "name": name}
        if isinstance(merged.get("tasks"), list):
            merged["tasks"] = tuple(merged["tasks"])
        try:
            recipes[name] = Recipe(**merged)
        except TypeError as exc:
            raise AdapterError(f"recipes file {path}, model {name}: {exc}") from exc
        except AdapterError as exc:
            raise AdapterError(f"recipes file {path}: {exc}") from None
    return recipes


def get_recipe(name: str, path: Path = RECIPES_PATH) -> Recipe:
    recipes = load_recipes(path)
    if name not in recipes:
        raise AdapterError(f"unknown recipe {name!r} in {path} (known: {', '.join(recipes)})")
    return recipes[name]
