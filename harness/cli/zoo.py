"""`loopeval zoo`: list the shipped tiny models, retrain them from their recipes, convert a LoopLM to MELT.

- `loopeval zoo list [--json]`: the shipped models with parameter counts and training budgets.
- `loopeval zoo train [NAME ...] [--out DIR] [--steps N] [--device cpu|cuda]`: reproduce zoo models
  from adapters/zoo_data/recipes.toml (all of them, in dependency order, when no name is given).
- `loopeval zoo convert --teacher ouro:PATH --out DIR [--device cuda] ...`: the MELT conversion of
  any LoopLM the engine loads, with the melt-tiny recipe's two stages and overridable
  hyper-parameters; the zoo's melt-tiny is this command's CPU-sized run.

The training itself is the `training` package's (`training.train.train`); this module only reads the
synthetic suite's train split (or the user's JSONL) and hands the items over.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Annotated, Any

import typer

from adapters.base import AdapterError
from adapters.files import MIB, parse_json, read_text
from harness.cli.common import (
    DeviceOption,
    JsonFlag,
    ThreadsOption,
    check_device,
    check_out_dir,
    print_table,
    use_threads,
)
from harness.errors import UserError

RecipesOption = Annotated[
    Path | None,
    typer.Option("--recipes", help="Recipes file (TOML, as adapters/zoo_data/recipes.toml, the default)."),
]

_LIST_COLUMNS = [
    ("name", "model"),
    ("family", "family"),
    ("kv_strategy", "KV"),
    ("gate", "gate"),
    ("layers", "layers"),
    ("loops", "T"),
    ("context", "context"),
    ("params", "params"),
    ("steps", "steps"),
    ("tokens", "tokens"),
    ("cpu_minutes", "CPU min"),
    ("val_accuracy", "val acc"),
    ("teacher", "teacher"),
]


def zoo_rows() -> list[dict]:
    """One plain row per shipped model: what `loopeval zoo list` prints."""
    from adapters.zoo import zoo_info, zoo_names

    rows = []
    for name in zoo_names():
        info = zoo_info(name)
        cfg, train = info["config"], info["train"]
        gate = cfg["gate_variant"] if cfg["kv_strategy"] == "gated" else ""
        rows.append(
            {
                "name": name,
                "family": cfg["family"],
                "kv_strategy": cfg["kv_strategy"],
                "gate": gate,
                "layers": cfg["shared_layers"] + cfg["prelude_layers"] + cfg["coda_layers"],
                "loops": cfg["loops"],
                "context": cfg["max_position"],
                "params": train.get("params"),
                "steps": train.get("steps"),
                "tokens": train.get("tokens"),
                "cpu_minutes": train.get("cpu_minutes"),
                "teacher": train.get("teacher"),
                "val_accuracy": (train.get("validation_accuracy") or {}).get("average"),
                "file_bytes": info["file_bytes"],
            }
        )
    return rows


def _train_order(names: list[str], recipes: dict) -> list[str]:
    """Teachers before their students, so `zoo train` with no names can run the whole zoo."""
    ordered: list[str] = []
    for name in names:
        teacher = recipes[name].teacher
        if teacher in recipes and teacher in names and teacher not in ordered:
            ordered.append(teacher)
        if name not in ordered:
            ordered.append(name)
    return ordered


def _synthetic_items(tasks: tuple[str, ...]) -> dict[str, list[dict]]:
    """The synthetic suite's train split of each task (the test split is never trained on)."""
    from suites import synthetic

    return {task: synthetic.load_split(task, "train") for task in tasks}


DATA_LIMIT = 256 * MIB  # bytes of a --data file; the synthetic train split of every task is about 5 MB


def _read_items(path: Path) -> dict[str, list[dict]]:
    """A user's JSONL training file: one {"prompt": ..., "answer": ...} object of two strings per line."""
    try:
        text = read_text(path, "--data file", DATA_LIMIT)
    except AdapterError as exc:
        raise UserError(f"cannot read {exc}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except ValueError as exc:
            raise UserError(f"cannot read --data file {path}: line {number}: {exc}") from None
        if not isinstance(row, dict) or not all(
            isinstance(row.get(key), str) and row[key] for key in ("prompt", "answer")
        ):
            raise UserError(
                f'--data file {path}, line {number}: expected a JSON object whose "prompt" and "answer" are '
                f"non-empty strings, got {line[:80]!r}"
            )
        rows.append(row)
    if not rows:
        raise UserError(f'--data file {path} holds no rows: one JSON object with "prompt" and "answer" per line')
    return {"data": rows}


def _fits(device: str, hint: str) -> Callable[[str, int], None]:
    """The check `train` makes before building a model: its memory floor against what `device` has free, as `run` checks."""
    from harness.measurement.capacity import check_memory

    return lambda what, need: check_memory(what, need, device, hint)


def list_models(as_json: JsonFlag = False) -> None:
    """The shipped models (loadable as zoo:NAME) with parameter counts and training budgets."""
    rows = zoo_rows()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    cells = [["" if row.get(key) is None else str(row[key]) for key, _ in _LIST_COLUMNS] for row in rows]
    print_table("loopeval zoo (zoo:NAME)", [header for _, header in _LIST_COLUMNS], cells)


def train(
    names: list[str] | None = typer.Argument(None, help="Zoo models to train (default: all recipes)."),
    out: Path = typer.Option(Path("zoo-out"), "--out", help="Each model is written to OUT/NAME."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Override the recipe's step count."),
    device: DeviceOption = "cpu",
    teacher: str | None = typer.Option(
        None,
        "--teacher",
        help="MELT teacher spec (default: OUT/ouro-tiny when trained in this call, else the shipped zoo model).",
    ),
    threads: ThreadsOption = None,
    resume: bool = typer.Option(
        True, "--resume/--no-resume", help="Continue from OUT/NAME/train_state.pt when present."
    ),
    recipes_file: RecipesOption = None,
) -> None:
    """Reproduce zoo models from their recipes (adapters/zoo_data/recipes.toml)."""
    from adapters import inspect, resolve
    from training.train import train as train_model
    from adapters.zoo import RECIPES_PATH, load_recipes
    from suites.synthetic import STOP

    check_device(device)
    check_out_dir(out, "--out")
    teacher = (
        None if teacher is None else resolve(teacher)
    )  # the specs every command takes; bare names refused when shared
    if teacher is not None:
        inspect(teacher)  # its config, checked before anything is trained or written
    use_threads(threads, None)  # training batches are large: the cores pay there
    recipes = load_recipes(recipes_file or RECIPES_PATH)
    unknown = [n for n in names or [] if n not in recipes]
    if unknown:
        raise UserError(f"unknown zoo model(s) {', '.join(unknown)} (recipes: {', '.join(recipes)})")
    trained: dict[str, Path] = {}
    for name in _train_order(list(names or recipes), recipes):
        recipe = recipes[name].with_overrides(steps=steps)
        spec = teacher
        if recipe.kind == "melt" and spec is None and recipe.teacher in trained:
            spec = f"ouro:{trained[recipe.teacher]}"
        info = train_model(
            recipe,
            out / name,
            _synthetic_items(recipe.tasks),
            stop=STOP,
            device=device,
            resume=resume,
            teacher_spec=spec,
            fits=_fits(device, "the recipe's batch_size or its model's sizes"),
        )
        assert info is not None  # None only for a run stopped early (`until`), which the CLI never asks
        trained[name] = out / name
        print(
            f"{name}: {info['steps']} steps, {info['cpu_minutes']} CPU min, validation accuracy "
            f"{info['validation_accuracy']['average']:.3f} -> {out / name}"
        )


def convert(
    teacher: str = typer.Option(
        ..., "--teacher", help="The LoopLM to convert: ouro:PATH, zoo:ouro-tiny, ... (see `loopeval models`)"
    ),
    out: Path = typer.Option(..., "--out", help="Directory for the MELT checkpoint and its loss curve."),
    recipe_name: str = typer.Option("melt-tiny", "--recipe", help="Recipe whose hyper-parameters are the defaults."),
    device: DeviceOption = "cpu",
    steps: int | None = typer.Option(None, "--steps", min=1),
    gate: str | None = typer.Option(None, "--gate", help="elementwise, scalar, last, mean or ema."),
    chunk_size: int | None = typer.Option(None, "--chunk-size", min=1),
    ramp_steps: int | None = typer.Option(None, "--ramp-steps", min=0),
    stage2_start: int | None = typer.Option(None, "--stage2-start", min=0),
    beta: float | None = typer.Option(None, "--beta", min=0.0),
    lr: float | None = typer.Option(None, "--lr", min=0.0),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1),
    data: Path | None = typer.Option(
        None, "--data", help="JSONL of {prompt, answer} to train on (default: the synthetic train split)."
    ),
    threads: ThreadsOption = None,
    resume: bool = typer.Option(True, "--resume/--no-resume"),
    recipes_file: RecipesOption = None,
) -> None:
    """Convert a LoopLM into MELT with the paper's two stages (KV interpolation, then alignment)."""
    from adapters import inspect, resolve
    from adapters.engine.config import GATE_VARIANTS
    from training.train import train as train_model
    from adapters.zoo import RECIPES_PATH, get_recipe
    from suites.synthetic import STOP

    check_device(device)
    if gate is not None and gate not in GATE_VARIANTS:
        raise UserError(f"--gate must be one of {', '.join(GATE_VARIANTS)}, got {gate!r}")
    check_out_dir(out, "--out")
    teacher = resolve(teacher)  # the specs every command takes; bare names refused when shared
    inspect(teacher)  # its config, checked before anything is trained or written
    use_threads(threads, None)  # training batches are large: the cores pay there
    recipe = get_recipe(recipe_name, recipes_file or RECIPES_PATH)
    if recipe.kind != "melt":
        raise UserError(f"--recipe {recipe_name} is a {recipe.kind} recipe; conversion needs a melt recipe")
    items: dict[str, Any] = _read_items(data) if data is not None else _synthetic_items(recipe.tasks)
    recipe = recipe.with_overrides(
        name=out.resolve().name,
        teacher=teacher,
        steps=steps,
        gate_variant=gate,
        chunk_size=chunk_size,
        ramp_steps=ramp_steps,
        stage2_start=stage2_start,
        beta=beta,
        lr=lr,
        batch_size=batch_size,
        tasks=tuple(items),
    )
    info = train_model(
        recipe,
        out,
        items,
        stop=STOP,
        device=device,
        resume=resume,
        teacher_spec=teacher,
        fits=_fits(device, "--batch-size (or train on the GPU)"),
    )
    assert info is not None  # None only for a run stopped early (`until`), which the CLI never asks
    print(
        f"MELT checkpoint written to {out} ({info['steps']} steps, validation accuracy "
        f"{info['validation_accuracy']['average']:.3f}); load it as melt:{out}"
    )
