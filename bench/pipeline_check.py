"""What a `loopeval run` on the GPU stored, read back from its SQLite file: the check of bench/gpu_run.sh.

Per run: model, loops, status, samples, the memory ticks with an NVML reading, and the NVML energy
(`runs.energy_joules`, the delta of nvmlDeviceGetTotalEnergyConsumption over the run; NULL where NVML or the
counter is absent). `ok` holds when every run finished with samples, NVML ticks and a positive energy; `problems`
says what is missing where it does not (on a CPU: every run's NVML series and energy). Reads SQLite with the
standard library only, so it runs where the harness's own packages are missing.

    python bench/pipeline_check.py OUT/loopeval.sqlite
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

RUNS = """
SELECT r.id, r.model_spec, r.loops, r.status, r.energy_joules, r.wall_seconds, json_extract(r.model_config, '$.device'),
       (SELECT COUNT(*) FROM samples s WHERE s.run_id = r.id),
       (SELECT COUNT(*) FROM memory_samples m WHERE m.run_id = r.id),
       (SELECT COUNT(*) FROM memory_samples m WHERE m.run_id = r.id AND m.nvml_process IS NOT NULL)
FROM runs r WHERE r.kind = 'eval' ORDER BY r.id
"""
FIELDS = ("id", "model", "loops", "status", "energy_joules", "wall_seconds", "device", "samples", "ticks", "nvml_ticks")


def check(db: Path) -> dict:
    """Every eval run's row, and what keeps the pipeline's check from passing (empty: it passes)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        runs = [dict(zip(FIELDS, row)) for row in connection.execute(RUNS)]
    problems = [] if runs else ["no eval run is stored"]
    for run in runs:
        name = f"run {run['id']} ({run['model']} r={run['loops']})"
        if run["status"] != "finished":
            problems.append(f"{name}: {run['status']}")
        if not run["samples"]:
            problems.append(f"{name}: no samples")
        if not run["nvml_ticks"]:
            problems.append(f"{name}: no NVML reading in its {run['ticks']} memory ticks")
        if run["energy_joules"] is None or run["energy_joules"] <= 0:
            problems.append(f"{name}: NVML energy {run['energy_joules']}")
    return {"ok": not problems, "problems": problems, "runs": runs}


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        raise SystemExit("usage: python bench/pipeline_check.py DB.sqlite (an existing file)")
    result = check(Path(sys.argv[1]))
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
