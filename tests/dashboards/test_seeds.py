"""Repeated seeds are pooled, and every view says so: `loopeval results`, the static report and the served app.

A real sweep of seeds 0-3 (one tiny zoo model, 2 docs per task) is stored through the CLI. What each
view must show is computed here from the stored samples themselves: per task, every (seed, doc) item's
pass@1 pooled into one sample, its mean and standard error; the suite mean over tasks with the errors
in quadrature. No view may keep one seed's run and drop the others.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dashboards import figures
from dashboards.app import create_app
from analysis.points import accuracy_points
from dashboards.data import depth_points
from db import queries
from db.headline import rounded
from db.session import open_existing
from harness.planning.defaults import SUITE_SAMPLING

pytestmark = pytest.mark.slow  # a real sweep of four runs

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
MODEL = "zoo:qwen3-tiny-small"
Z95 = 1.96
WIDE = {**os.environ, "COLUMNS": "200"}  # one table row per line


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("seeds") / "seeds.sqlite"
    done = subprocess.run(
        [LOOPEVAL, "run", "--model", MODEL, "--seed", "0-3", "--limit", "2", "--db", str(db), "--no-report"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return db


def expected(db: Path) -> tuple[dict[str, tuple[float, float]], float, float]:
    """From the samples: task -> (pooled mean, its standard error) over every (seed, doc); the suite mean and its error."""
    conn = sqlite3.connect(db)
    items: dict[str, list[float]] = {}
    for task, score in conn.execute("SELECT task, AVG(score) FROM samples GROUP BY run_id, task, doc_id"):
        items.setdefault(task, []).append(score)
    conn.close()
    tasks = {task: (statistics.mean(v), statistics.stdev(v) / math.sqrt(len(v))) for task, v in items.items()}
    assert all(len(v) == 4 * 2 for v in items.values()), "4 seeds x 2 docs per task"
    mean = statistics.mean(m for m, _ in tasks.values())
    error = math.sqrt(sum(e * e for _, e in tasks.values())) / len(tasks)
    return tasks, mean, error


def interval(mean: float, error: float) -> str:
    return f"{rounded(mean)} ± {rounded(Z95 * error)}"


def test_results_shows_the_seed_count_and_the_pooled_interval(sweep: Path) -> None:
    tasks, mean, error = expected(sweep)
    out = subprocess.run(
        [LOOPEVAL, "results", "--db", str(sweep)], capture_output=True, text=True, timeout=300, env=WIDE
    ).stdout
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    # the ranking (memory, per GB), then what a token cost under the same rank: KV/token, loops/token (a plain model: 1)
    assert rows[0] == ["1*", MODEL, "1", "4", interval(mean, error), rows[0][5], rows[0][6], "1-4"], out
    assert rows[1][:5] == ["1*", MODEL, "1", "1.02 KB", "1"] and len(rows) == 2, out
    assert "pools its seeds" in out

    out = subprocess.run(
        [LOOPEVAL, "results", "--db", str(sweep), "--tasks"], capture_output=True, text=True, timeout=300, env=WIDE
    ).stdout
    shown = {
        cells[3]: cells[4]
        for cells in ([c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│"))
    }
    for task, (task_mean, task_error) in tasks.items():
        assert shown[task] == interval(task_mean, task_error), task
    assert shown["mean"] == interval(mean, error)


def test_the_report_names_the_seeds_and_draws_the_pooled_interval(sweep: Path, tmp_path: Path) -> None:
    _, mean, error = expected(sweep)
    report = tmp_path / "report.html"
    done = subprocess.run(
        [LOOPEVAL, "dashboard", "--db", str(sweep), "--out", str(report)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    page = report.read_text()
    assert re.search(r"<option [^>]*>set \w+: [^<]*\(4 runs; seeds 0-3 pooled in each point\)</option>", page)
    blobs = json.loads(re.search(r'<script id="figures" type="application/json">(.*?)</script>', page).group(1))
    figure = next(
        blob for key, blob in blobs.items() if key.startswith("acc|") and key.endswith("|all|kv_bytes_allocated")
    )
    _assert_pooled_point(figure, mean, error)
    (depth,) = [blob for key, blob in blobs.items() if key.startswith("depth|")]
    assert "seeds pooled" in json.dumps(depth["layout"]["annotations"])


def test_the_app_names_the_seeds_and_draws_the_pooled_interval(sweep: Path) -> None:
    _, mean, error = expected(sweep)
    url = f"sqlite:///{sweep}"
    app = create_app(url)
    options = app.layout()["set"].options
    assert [o["label"].endswith("(4 runs; seeds 0-3 pooled in each point)") for o in options] == [True]
    client = app.server.test_client()
    inputs = {
        ("set", "value"): options[0]["value"],
        ("task", "value"): "all",
        ("models", "value"): [MODEL],
        ("loops", "value"): [1],
        ("measure", "value"): "kv_bytes_allocated",
        ("context", "value"): 32768,
        ("refresh", "n_intervals"): None,
    }
    outputs = [("answer", "children"), ("accuracy-memory", "figure"), ("accuracy-loops", "figure")]
    reply = client.post(
        "/_dash-update-component",
        base_url="http://127.0.0.1:8050",
        json={
            "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": i, "property": p, "value": v} for (i, p), v in inputs.items()],
            "changedPropIds": ["set.value"],
            "state": [],
        },
    )
    assert reply.status_code == 200, reply.data[:500]
    response = reply.get_json()["response"]
    assert "4 seeds pooled" in response["answer"]["children"]
    _assert_pooled_point(response["accuracy-memory"]["figure"], mean, error)
    loops_figure = response["accuracy-loops"]["figure"]
    (line,) = [t for t in loops_figure["data"] if t.get("customdata")]
    assert line["customdata"] == ["4 seeds pooled (runs 1-4)"] and _values(line["error_y"]["array"]) == pytest.approx(
        [error]
    )


def test_every_point_pools_all_four_seeds(sweep: Path) -> None:
    """The queries behind every view: one point, four seeds, four runs; never one seed's run alone."""
    engine = open_existing(f"sqlite:///{sweep}")
    _, mean, error = expected(sweep)
    (point,) = accuracy_points(engine, None).itertuples()
    assert (point.seeds, point.run_ids, point.accuracy, point.stderr) == (
        4,
        [1, 2, 3, 4],
        pytest.approx(mean),
        pytest.approx(error),
    )
    assert (
        point.n_samples == 4 * 7 * 2 * SUITE_SAMPLING["synthetic"].n
    )  # every seed's samples: 7 tasks x 2 docs x the suite's n
    depth = depth_points(engine, queries.latest_set(engine))
    assert depth.loc[depth["group"] == "all", ["runs", "seeds", "accuracy"]].values.tolist() == [
        ["1-4", 4, pytest.approx(mean)]
    ]
    assert (queries.eval_sets(engine)[["runs", "seeds", "seed_count"]].values.tolist()) == [[4, "0-3", 4]]


def _values(array: list | dict) -> list[float]:
    """A figure's numbers as JSON holds them: a list, or plotly's typed array (base64 of its bytes)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return array


def _assert_pooled_point(figure: dict, mean: float, error: float) -> None:
    """One plotted point at the pooled mean, its error bar the pooled standard error, its hover and the note naming the seeds."""
    (trace,) = [t for t in figure["data"] if t.get("customdata")]
    assert _values(trace["y"]) == pytest.approx([mean]) and _values(trace["error_y"]["array"]) == pytest.approx([error])
    assert trace["customdata"][0][3] == "4 seeds pooled (runs 1-4)"
    notes = " ".join(a["text"] for a in figure["layout"]["annotations"])
    assert "seeds pooled" in notes and figures.DECIMAL_NOTE in notes
