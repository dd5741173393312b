"""The sample browsers' selection: spread over runs, tasks and verdicts, numeric doc order, long texts cut.

A real SQLite file written through db.store (12 docs per task, so doc 10 must follow doc 9), and the
real tiny sweep for "every run shows up".
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pandas as pd
import pytest

from dashboards.app import create_app
from dashboards.data import SAMPLE_COLUMNS, SAMPLE_TEXT_CHARS, browse_samples, clip, spread_note
from dashboards.report import build_report
from db import sample_queries
from db.session import open_existing
from db.store import Store

EVERY = 10**9  # a sample budget larger than any stratum: sample_spread then returns every matching sample

DOCS, SAMPLES, TASKS = 12, 2, ("t1", "t2")
RUNS = (("model-a", 1), ("model-a", 2), ("plain-b", None))


def _score(run: int, doc: int, sample: int) -> float | None:
    if run == 2 and doc == 11:
        return None  # one unscored doc: a stratum of its own
    return 1.0 if (doc + sample + run) % 3 == 0 else 0.0


@pytest.fixture()
def engine(tmp_path: Path):
    """Three runs of 2 tasks x 12 docs x 2 samples, stored in shuffled order; one output is 5000 characters."""
    path = tmp_path / "samples.sqlite"
    store = Store.open(str(path))
    for run_index, (model, loops) in enumerate(RUNS):
        run = store.create_run(
            sweep_id="s", model_spec=model, adapter="engine", loops=loops, suite="synthetic", tasks=list(TASKS)
        )
        rows = [
            dict(
                task=task,
                doc_id=str(doc),
                sample_index=sample,
                prompt=f"{task} {doc}",
                output="x" * 5000 if (run_index, task, doc, sample) == (0, "t1", 3, 0) else str(doc),
                gold=str(doc),
                score=_score(run_index, doc, sample),
            )
            for task in TASKS
            for doc in range(DOCS)
            for sample in range(SAMPLES)
        ]
        random.Random(run_index).shuffle(rows)
        store.add_samples(run, rows)
        store.finish_run(run, "finished", wall_seconds=1.0)
    store.close()
    engine = open_existing(f"sqlite:///{path}")
    yield engine
    engine.dispose()


def _verdict(score: float | None) -> str:
    return "unscored" if pd.isna(score) else "correct" if score >= 1 else "wrong"


def _strata(rows: pd.DataFrame) -> pd.Series:
    return rows.groupby(["run_id", "task", "verdict"]).size()


def test_everything_fits_the_budget_in_run_task_numeric_doc_order(engine) -> None:
    rows = sample_queries.sample_spread(engine, budget=10_000)
    assert len(rows) == sample_queries.count_samples(engine) == len(RUNS) * len(TASKS) * DOCS * SAMPLES
    key = list(zip(rows["run_id"], rows["task"], rows["doc_id"].astype(int), rows["sample_index"]))
    assert key == sorted(key), "doc ids sort as numbers: 10 after 9"
    assert (rows["verdict"] == rows["score"].map(_verdict)).all()


def test_a_small_budget_takes_the_same_share_of_every_run_task_and_verdict(engine) -> None:
    everything = sample_queries.sample_spread(engine, budget=10_000)
    sizes = _strata(everything)
    budget = 40
    cap = budget // len(sizes)
    rows = sample_queries.sample_spread(engine, budget=budget)
    taken = _strata(rows)
    assert list(taken.index) == list(sizes.index), "every run, task and verdict shows up, correct and wrong alike"
    assert (taken == sizes.clip(upper=cap)).all()
    assert set(rows["model"]) == {model for model, _ in RUNS}
    # Within a stratum the first samples of the lowest doc ids come first.
    for (run_id, task, verdict), group in rows.groupby(["run_id", "task", "verdict"]):
        pool = everything[(everything.run_id == run_id) & (everything.task == task) & (everything.verdict == verdict)]
        first = pool.assign(doc=pool["doc_id"].astype(int)).sort_values(["sample_index", "doc"]).head(cap)
        assert sorted(group["sample_id"]) == sorted(first["sample_id"])


def test_filters_apply_before_the_spread(engine) -> None:
    budget = 12
    wrong = sample_queries.sample_spread(engine, budget, task="t2", model="model-a", correct=False)
    assert set(wrong["task"]) == {"t2"} and set(wrong["model"]) == {"model-a"} and (wrong["score"] < 1).all()
    assert sorted(_strata(wrong)) == [budget // 2] * 2, "the budget is shared by the two matching runs only"
    correct = sample_queries.sample_spread(engine, budget, correct=True)
    assert (correct["score"] >= 1).all() and correct["run_id"].nunique() == len(RUNS)


def test_long_texts_are_cut_with_a_note(engine) -> None:
    rows = browse_samples(engine)
    (cut,) = [text for text in rows["output"] if text.startswith("x")]
    assert cut == "x" * SAMPLE_TEXT_CHARS + f"… [{5000 - SAMPLE_TEXT_CHARS} more characters]"
    assert clip(None) is None and clip("short") == "short"


def test_the_sweep_browser_holds_every_run_with_both_verdicts(results_url: str) -> None:
    engine = open_existing(results_url)
    rows = browse_samples(engine)
    stored = sample_queries.sample_spread(engine, EVERY)
    engine.dispose()
    assert set(rows["run_id"]) == set(stored["run_id"])
    verdicts = stored.assign(verdict=stored["score"].map(_verdict)).groupby("run_id")["verdict"].agg(set)
    assert (rows.groupby("run_id")["verdict"].agg(set) == verdicts).all()


def _app_samples(url: str) -> list[dict]:
    """The app's sample table as the browser receives it, every task, model and verdict."""
    inputs = [("sample-task", None), ("sample-model", None), ("sample-verdict", "all")]
    body = {"output": "..samples.data...sample-count.children..", "changedPropIds": [], "state": [],
            "outputs": [{"id": "samples", "property": "data"}, {"id": "sample-count", "property": "children"}],
            "inputs": [*({"id": name, "property": "value", "value": value} for name, value in inputs),
                       {"id": "refresh", "property": "n_intervals", "value": None}]}  # fmt: skip
    client = create_app(url).server.test_client()
    reply = client.post("/_dash-update-component", base_url="http://127.0.0.1:8050", json=body)
    assert reply.status_code == 200, reply.data[:500]
    return reply.get_json()["response"]["samples"]["data"]


def test_the_report_and_the_app_show_the_same_columns_and_cells(engine, tmp_path: Path) -> None:
    """Both browsers read `data.SAMPLE_COLUMNS`: the report's headings are its labels in order, the app's rows its
    columns, and every sample reads the same in both (doc ids compared as text: the app sorts them as numbers)."""
    page = build_report(engine)
    data = re.search(r'<script id="sample-data" type="application/json">(.*?)</script>', page, re.S).group(1)
    report = json.loads(data)
    assert report["columns"] == list(SAMPLE_COLUMNS.values())
    headings = re.findall(r"<th>([^<]*)</th>", page.split('id="sample-data"')[0])
    assert headings[-len(SAMPLE_COLUMNS) :] == report["columns"]
    app = _app_samples(f"sqlite:///{tmp_path / 'samples.sqlite'}")
    assert [list(row) for row in app] == [list(SAMPLE_COLUMNS)] * len(app) and len(app) == len(report["rows"]) > 0
    as_text = lambda value: None if value is None else str(value)  # noqa: E731
    assert [[as_text(row[key]) for key in SAMPLE_COLUMNS] for row in app] == [
        [as_text(cell) for cell in row] for row in report["rows"]
    ]
    cells = dict(zip(report["columns"], report["rows"][0]))
    assert cells["loops"] == "r=1" and isinstance(cells["score"], float) and cells["verdict"] in ("correct", "wrong")


def test_the_note_says_how_many_of_each_kind_even_past_the_budget(engine) -> None:
    """With more (run, task, verdict) kinds than the budget, each still gives one sample: the note counts what is
    there (never "at most about" the budget when the table holds more)."""
    rows = sample_queries.sample_spread(engine, 1)
    kinds = rows.groupby(["run_id", "task", "verdict"]).ngroups
    assert len(rows) == kinds > 1
    assert spread_note(rows).startswith(f"{kinds} samples: up to 1 of each of the {kinds} runs x tasks x verdicts")
    assert spread_note(rows.iloc[:0]) == "no samples match"
