"""`loopeval models`: the model specs `loopeval run --model` accepts, one per line."""

from __future__ import annotations

import typer


def models() -> None:
    """Model specs `loopeval run --model` accepts: adapter prefixes and built-in presets, one per line."""
    import adapters
    from adapters.engine.presets import PRESETS

    for entry in adapters.available():
        typer.echo(f"{entry.prefix}:...  {entry.description}")
    for name, config in PRESETS.items():
        typer.echo(f"preset:{name}  {config.family}, {config.num_layers} layers, loops {config.loops}, {config.kv_strategy} KV")
