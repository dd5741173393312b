"""One zoo trial: a shipped recipe with some fields changed, trained on named synthetic tasks.

    python scripts/zoo_trial.py ouro-tiny --tasks r30k4 --steps 1000 --out /tmp/trial --loops 1,2,4,8 \
        --config '{"norm_layout": "pre"}' --recipe '{"entropy_weight": 0.5}'

Trains with the zoo's own machinery (`training.train.train`, the recipe of
adapters/zoo_data/recipes.toml with the overrides given) on the synthetic train split of each task,
prints the training budget and the held-out validation accuracy (teacher-forced argmax over the
whole answer, which equals greedy decoding's exact match), and for a looped model the same figure
at each loop count of --loops. docs/zoo-trials.md records the trials run with it; the test split is
never read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import adapters
from adapters.engine.io.tokenizer import char_tokenizer
from training.data import TaskData, answer_accuracy
from training.train import train
from adapters.zoo import checkpoint_spec, get_recipe
from suites import synthetic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe_name", help="a recipe of adapters/zoo_data/recipes.toml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", required=True, help="comma-separated synthetic tasks")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--loops", default="", help="loop counts to evaluate a looped model at, e.g. 1,2,4,8")
    parser.add_argument("--config", default="{}", help="JSON: model config fields changed from the recipe's")
    parser.add_argument("--recipe", default="{}", help="JSON: other recipe fields changed (lr, entropy_weight, ...)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tasks = tuple(args.tasks.split(","))
    items = {task: synthetic.load_split(task, "train") for task in tasks}
    recipe = get_recipe(args.recipe_name)
    recipe = recipe.with_overrides(
        tasks=tasks,
        steps=args.steps,
        seed=args.seed,
        config={**recipe.config, **json.loads(args.config)},
        save_every=10**9,
        log_every=100,
        **json.loads(args.recipe),
    )
    info = train(recipe, args.out, items, stop=synthetic.STOP, progress=False)
    print(
        "TRAIN",
        json.dumps({k: info[k] for k in ("name", "steps", "cpu_minutes", "wall_minutes", "validation_accuracy")}),
    )
    if args.loops:
        model = adapters.load(checkpoint_spec(args.out), device="cpu", dtype="float32").model
        data = TaskData(tasks, char_tokenizer(), recipe.val_items, items, synthetic.STOP)
        for loops in map(int, args.loops.split(",")):
            accuracy = answer_accuracy(model, data, "cpu", loops=loops)
            print("LOOPS", loops, json.dumps({k: round(v, 3) for k, v in accuracy.items()}))


if __name__ == "__main__":
    main()
