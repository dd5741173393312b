"""The Ray executor's overhead against the local executor on a small sweep, timed as the user sees it.

The sweep: preset:ouro-tiny and preset:melt-tiny at loops 1 and 2 (4 runs) on the synthetic suite
with `--limit`, n = 1, each executor into its own SQLite file. Each variant is the whole
`loopeval run` command in a fresh process (imports, planning, the runs, the summary):

- `local`: the default executor, the runs one after another, each model loaded once;
- `ray_connected`: `--executor ray --ray-address` to a Ray instance this script started first with
  `--cpus` CPUs, which is what a cluster user pays per sweep (`--cpus 1` runs the tasks one at a
  time, so the ratio is pure overhead; with 2 they run two at a time);
- `ray_own_instance`: `--executor ray` alone, which starts and stops a local Ray instance.

Ray's cost is a fresh worker process per run (`max_calls=1`: imports and a model load each) plus
scheduling and the submitter's polling; `run_seconds` (the sum of the runs' own wall time, from the
store) shows how much of each command was the runs themselves. Prints JSON, with `ratio` = the
median of ray_connected / local over rounds (alternating, since the machine's speed drifts).

    .venv/bin/python bench/bench_executors.py --cpus 1
    .venv/bin/python bench/bench_executors.py --cpus 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
ROOT = Path(__file__).resolve().parents[1]


def sweep_args(limit: int) -> list[str]:
    return [
        "--model",
        "preset:ouro-tiny",
        "--model",
        "preset:melt-tiny",
        "--loops",
        "1,2",
        "--tasks",
        "addition,chain2",
        "--limit",
        str(limit),
        "--samples",
        "1",
        "--max-new-tokens",
        "6",
        "--no-report",
    ]


def timed(argv: list[str], db: Path) -> dict[str, float]:
    """Run one `loopeval run` and return its wall time and the runs' own summed wall time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    began = time.perf_counter()
    done = subprocess.run([LOOPEVAL, "run", *argv, "--db", str(db)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"loopeval run {' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    conn = sqlite3.connect(db)
    ((run_seconds, runs),) = conn.execute(
        "SELECT SUM(wall_seconds), COUNT(*) FROM runs WHERE status = 'finished'"
    ).fetchall()
    conn.close()
    if runs != 4:
        raise SystemExit(f"expected 4 finished runs in {db}, found {runs}")
    return {"wall_seconds": round(wall, 2), "run_seconds": round(run_seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=8, help="docs per task (2 tasks, 4 runs)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the Ray instance the connected variant uses")
    parser.add_argument("--rounds", type=int, default=1, help="alternating local / ray rounds")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with tempfile.TemporaryDirectory(prefix="loopeval-bench-executors-") as scratch:
        report = measure(args, Path(scratch))
    print(json.dumps(report, indent=2))


def measure(args: argparse.Namespace, scratch: Path) -> dict[str, object]:
    """Every variant once per round, in `scratch` (the databases and the Ray instance's files)."""
    sweep = sweep_args(args.limit)
    report: dict[str, object] = {
        "workload": {"runs": 4, "limit": args.limit, "tasks": 2, "samples": 1, "ray_cpus": args.cpus}
    }
    report["ray_own_instance"] = timed([*sweep, "--executor", "ray"], scratch / "own.sqlite")

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _temp_dir=str(scratch / "ray"))
    address = ray.get_runtime_context().gcs_address
    local, connected = [], []
    try:
        for i in range(args.rounds):
            local.append(timed(sweep, scratch / f"local{i}.sqlite"))
            connected.append(timed([*sweep, "--executor", "ray", "--ray-address", address], scratch / f"ray{i}.sqlite"))
    finally:
        ray.shutdown()
    ratios = [r["wall_seconds"] / l["wall_seconds"] for l, r in zip(local, connected)]
    report.update(
        local=local,
        ray_connected=connected,
        ratio_per_round=[round(r, 3) for r in ratios],
        ratio=round(statistics.median(ratios), 3),
        ray_extra_seconds_per_run=round(
            statistics.median(r["wall_seconds"] - l["wall_seconds"] for l, r in zip(local, connected)) / 4, 2
        ),
    )
    return report


if __name__ == "__main__":
    main()
