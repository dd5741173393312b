"""`loopeval models`: the model specs every command accepts (`run --model`, `profile`, `estimate`), one per line."""

from __future__ import annotations

import typer


def models() -> None:
    """Model specs every command accepts: the engine's families, adapter prefixes, then the named models with their
    context lengths.

    Each family line says its KV strategy, where its checkpoints come from and what `--loops` means for it
    (`adapters.engine.io.presets.FAMILY_GUIDE`, which the README's model table also shows).

    A bare name stands for the one spec that has it; the last line names those two prefixes share.
    """
    import adapters
    from adapters.engine.config import LoopConfig
    from adapters.engine.io.presets import FAMILY_GUIDE, PRESETS
    from adapters.registry import named_models
    from adapters.zoo import zoo_info, zoo_names

    for name, family in FAMILY_GUIDE.items():
        typer.echo(
            f"family {name}: {family.models}; KV {family.kv}; checkpoints {family.checkpoints}; "
            f"--loops: {family.loops}".replace("`", "")
        )
    for entry in adapters.available():
        typer.echo(f"{entry.prefix}:...  {entry.description}")
    named = [(f"preset:{name}", config) for name, config in PRESETS.items()]
    named += [(f"zoo:{name}", LoopConfig.from_dict(zoo_info(name)["config"])) for name in zoo_names()]
    for spec, config in named:
        typer.echo(
            f"{spec}  {config.family}, {config.num_layers} layers, loops {config.loops}, {config.kv_strategy} KV, "
            f"context {config.max_position}"
        )
    shared = [name for name, specs in named_models().items() if len(specs) > 1]
    typer.echo(
        "A bare name stands for its one spec (ouro-1.4b is preset:ouro-1.4b)"
        + (f"; give the prefix with {', '.join(shared)}." if shared else ".")
    )
