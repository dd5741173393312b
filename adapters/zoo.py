"""`zoo:NAME`: the trained tiny models shipped with loopeval as package data.

Each model is an engine checkpoint directory under `adapters/zoo_data/NAME/` (model.safetensors in
bf16, config.json, tokenizer.json) plus `train_info.json`, the budget it was trained with (steps,
tokens, CPU minutes, held-out validation accuracy). The recipes that produced them are in
`adapters/zoo_data/recipes.toml` (`Recipe`, read here); `loopeval zoo train NAME` reproduces one from
its seed with `adapters.engine.training.train`.

Loading goes through the engine's own checkpoint factories (`qwen3:`, `ouro:`, `melt:` by the
checkpoint's family), so a zoo model is exactly what a user would get from the files themselves;
only the adapter's `spec` is rewritten to `zoo:NAME` so that results name the model.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adapters.base import Adapter, AdapterError
from adapters.engine.config import LoopConfig
from adapters.engine.presets import preset
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


CHECKPOINT_PREFIXES = ("qwen3", "ouro", "melt")  # the families with a checkpoint prefix of their own (adapters.engine.adapter)


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


def inspect_zoo(name: str, **overrides: Any) -> dict[str, Any] | None:
    return inspect(engine_spec(name), **overrides)


@register("zoo", "trained tiny models shipped with loopeval (qwen3-tiny-small, qwen3-tiny-deep, ouro-tiny, melt-tiny, ablations, the recurrence lab)", inspect=inspect_zoo,
          names=zoo_names)
def load_zoo(name: str, **overrides: Any) -> Adapter:
    """Load a shipped model by name with the engine adapter of its family (overrides as for any engine spec)."""
    adapter = load(engine_spec(name), **overrides)
    adapter.spec = f"zoo:{name}"
    return adapter


# ------------------------------------------------------------------------------------ recipes
RECIPES_PATH = ZOO_DIR / "recipes.toml"
KINDS = ("lm", "looplm", "melt")


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
        if self.kind not in KINDS:
            raise AdapterError(f"recipe {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.steps < 1 or self.batch_size < 1:
            raise AdapterError(f"recipe {self.name}: steps and batch_size must be >= 1")
        if self.kind == "melt" and not self.teacher:
            raise AdapterError(f"recipe {self.name}: a melt recipe needs a teacher")

    def with_overrides(self, **changes: Any) -> "Recipe":
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


def _with_base(name: str, tables: dict[str, dict[str, Any]], path: Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A model's table over its `base` model's (resolved the same way, description dropped), `config` merged
    key by key: a variant names only the fields it changes."""
    table = dict(tables[name])
    base = table.pop("base", None)
    if base is None:
        return table
    if base not in tables or base in (*seen, name):
        raise AdapterError(f"recipes file {path}, model {name}: base {base!r} is not another model of the file, or its bases lead back here")
    parent = _with_base(base, tables, path, (*seen, name))
    parent.pop("description", None)
    return {**parent, **table, "config": {**parent.get("config", {}), **table.get("config", {})}}


def load_recipes(path: Path = RECIPES_PATH) -> dict[str, Recipe]:
    """Every recipe in the TOML file: `[defaults]` merged under each `[models.NAME]` table (over its `base`)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AdapterError(f"cannot read recipes file {path}: {exc}") from exc
    defaults = data.get("defaults", {})
    tables = data.get("models", {})
    recipes = {}
    for name in tables:
        merged = {**defaults, **_with_base(name, tables, path), "name": name}
        if "tasks" in merged:
            merged["tasks"] = tuple(merged["tasks"])
        try:
            recipes[name] = Recipe(**merged)
        except TypeError as exc:
            raise AdapterError(f"recipes file {path}, model {name}: {exc}") from exc
    return recipes


def get_recipe(name: str, path: Path = RECIPES_PATH) -> Recipe:
    recipes = load_recipes(path)
    if name not in recipes:
        raise AdapterError(f"unknown zoo model {name!r} (known: {', '.join(recipes)})")
    return recipes[name]
