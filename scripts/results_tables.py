"""The zoo's tables (docs/findings.md) from `loopeval results --json`: accuracy per task and average, weights, KV peak, KV per token.

The zoo section of docs/findings.md is this script's output for the default run, so its numbers are
exactly what `loopeval results` prints:

    .venv/bin/loopeval results --json | .venv/bin/python scripts/results_tables.py
    .venv/bin/loopeval results --db ablations.sqlite --json | .venv/bin/python scripts/results_tables.py --no-memory
    .venv/bin/loopeval results --json | .venv/bin/python scripts/results_tables.py --depth   # the recurrence lab's table

Only runs of one evaluation set are tabled (the set of the latest finished run, or `--set ID`; see
`loopeval results`), so every row was scored on the same items in the same way. `--depth` tables
pass@1 per task group against the loop count r instead, from the set sweeping the most loop counts
(the default run's recurrence-lab sweep), as the report's depth-extrapolation figure opens on.

KV bytes per token is what one more token of context adds to the KV cache at the run's loop count
and dtype, as the engine adapter described it when the run was stored; it excludes the MELT latent
state, which does not grow with the context.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import pandas as pd

from analysis.names import config_labels, series_name
from db.headline import rounded
from db.sets import config_key


def by_point(runs: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """(name, loops r) -> its runs, one per seed (the latest run of a seed), in the order they were stored.

    The name is the model with what tells its point apart (`analysis.names.series_name`: the exit threshold,
    the overrides its runs differ in), so two configurations are two rows, never one run hiding another.
    A plain model runs once: r = 1, as the report and `results` show it. Seeds are pooled as `loopeval
    results` pools them: a set scores the same docs in every seed, so the pooled mean is the seeds' mean.
    """
    configs = pd.DataFrame(
        {"model": [run["model"] for run in runs], "config": [config_key(run.get("overrides") or {}) for run in runs]}
    )
    latest: dict[tuple[str, int, int | None], dict] = {}
    for run, config in zip(runs, config_labels(configs)):
        name = series_name(run["model"], run.get("exit_threshold"), run.get("exit_criterion"), config)
        latest[(name, run["loops"] or 1, run.get("seed"))] = run
    points: dict[tuple[str, int], list[dict]] = {}
    for (name, loops, _), run in latest.items():
        points.setdefault((name, loops), []).append(run)
    return points


def mean(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else statistics.fmean(values)


def table(runs: list[dict], memory: bool) -> str:
    """One row per (model, loops) of the set; each task's pass@1 and the suite mean (`pass_at_1`, as `results` computes
    it), pooled over seeds and rounded as `results` rounds; a seeds column where the set ran several."""
    points = by_point(runs)
    tasks = sorted({task for run in runs for task in run["pass_at_1"]["benchmarks"]})
    several = any(len(seeds) > 1 for seeds in points.values())
    head = ["model", "loops", *(["seeds"] if several else []), *tasks, "average"]
    head += ["weights_bytes", "kv_bytes_allocated", "KV bytes/token"] if memory else []
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (model, loops), seeds in points.items():
        values = [mean([run["pass_at_1"]["benchmarks"].get(task) for run in seeds]) for task in tasks]
        values.append(mean([run["pass_at_1"]["mean"] for run in seeds]))
        cells = [model, str(loops), *([str(len(seeds))] if several else [])]
        cells += [rounded(v) if v is not None else "n/a" for v in values]
        if memory:
            per_token = seeds[-1]["kv_bytes_per_token"]
            cells += [
                f"{max(run['memory'].get(k) or 0 for run in seeds):,}" for k in ("weights_bytes", "kv_bytes_allocated")
            ]
            cells.append(f"{per_token:,}" if per_token is not None else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def depth_table(runs: list[dict]) -> str:
    """One row per (model, task group), pass@1 at each loop count r of the set (seeds pooled); "all" is the suite mean."""
    points = by_point(runs)
    loops = sorted({r for _, r in points})
    lines = ["| model | group | " + " | ".join(f"r = {r}" for r in loops) + " |", "|" + " --- |" * (len(loops) + 2)]
    for model in dict.fromkeys(model for model, _ in points):
        by_r = {r: [run["pass_at_1"] for run in seeds] for (m, r), seeds in points.items() if m == model}
        groups = ["all", *sorted({g for p in by_r.values() for one in p for g in one["groups"]})]
        for group in groups:
            values = [
                None
                if r not in by_r
                else mean([p["mean"] if group == "all" else p["groups"].get(group) for p in by_r[r]])
                for r in loops
            ]
            cells = [rounded(v, 2) if v is not None else "-" for v in values]
            lines.append(f"| {model if group == 'all' else ''} | {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def widest_set(runs: list[dict]) -> str | None:
    """The set whose runs cover the most loop counts (ties: the latest)."""
    counts: dict[str, set[int]] = {}
    for run in runs:
        counts.setdefault(run.get("set_id"), set()).add(run["loops"] or 1)
    return max(reversed(list(counts)), key=lambda set_id: len(counts[set_id]), default=None)


def one_set(runs: list[dict], set_id: str | None, widest: bool = False) -> list[dict]:
    """The finished evaluation runs of `set_id`, else of the widest sweep of r (`widest`) or the latest finished run's set."""
    runs = [run for run in runs if run.get("kind", "eval") == "eval" and run["status"] == "finished"]
    chosen = set_id or (widest_set(runs) if widest else runs[-1].get("set_id") if runs else None)
    if set_id is not None and not any(run.get("set_id") == set_id for run in runs):
        sys.exit(f"results_tables.py: no finished run of set {set_id}")
    return [run for run in runs if run.get("set_id") == chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-memory", action="store_true", help="accuracy columns only (the ablation table)")
    parser.add_argument(
        "--depth", action="store_true", help="pass@1 per task group against r (the recurrence lab's table)"
    )
    parser.add_argument("--set", dest="set_id", help="the evaluation set to table (default: the latest finished run's)")
    args = parser.parse_args()
    runs = one_set(json.load(sys.stdin), args.set_id, widest=args.depth)
    print(depth_table(runs) if args.depth else table(runs, memory=not args.no_memory))


if __name__ == "__main__":
    main()
