"""`zoo:NAME`: the trained tiny models shipped with loopeval as package data.

Each model is an engine checkpoint directory under `adapters/zoo_data/NAME/` (model.safetensors in
bf16, config.json, tokenizer.json) plus `train_info.json`, the budget it was trained with (steps,
tokens, CPU minutes, held-out validation accuracy). The recipes that produced them are in
`adapters/zoo_data/recipes.toml`; `loopeval zoo train NAME` reproduces one from its seed.

Loading goes through the engine's own checkpoint factories (`qwen3:`, `ouro:`, `melt:` by the
checkpoint's family), so a zoo model is exactly what a user would get from the files themselves;
only the adapter's `spec` is rewritten to `zoo:NAME` so that results name the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapters.base import Adapter, AdapterError
from adapters.registry import load, register

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


@register("zoo", "trained tiny models shipped with loopeval (qwen3-tiny-small, qwen3-tiny-deep, ouro-tiny, melt-tiny, ablations)")
def load_zoo(name: str, **overrides: Any) -> Adapter:
    """Load a shipped model by name with the engine adapter of its family (overrides as for any engine spec)."""
    path = zoo_path(name)
    family = json.loads((path / "config.json").read_text())["config"]["family"]
    adapter = load(f"{family}:{path}", **overrides)
    adapter.spec = f"zoo:{name}"
    return adapter
