"""`loopeval run --suite paper --data-dir DIR` on fixtures of all ten benchmarks, then `loopeval results`.

The model is `ReferenceAdapter` (tests/support/paper_data.py) loaded as a folder plugin: `reference:right` answers
every item correctly in the forms reasoning models write, `reference:wrong` answers every item
wrongly in the same forms. Real pipeline, real sandbox, real SQLite file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from db import queries
from db.session import open_existing
from harness.cli import main
from suites.paper import TASKS
from tests.support.paper_data import write_data_dir

PLUGIN = """
import sys

sys.path.insert(0, {root!r})  # the checkout, whose tests.support the plugin imports
from adapters import register
from tests.support.paper_data import ReferenceAdapter


@register("reference", "answers the paper fixtures: reference:right or reference:wrong")
def make(arg, **overrides):
    return ReferenceAdapter(wrong=arg == "wrong")
"""


def test_paper_suite_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data_dir(tmp_path / "data")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "reference.py").write_text(PLUGIN.format(root=str(Path(__file__).parents[2])))
    db = tmp_path / "r.sqlite"
    argv = ["run", "--adapters-dir", str(plugins), "--suite", "paper", "--data-dir", str(data), "--model", "reference:right",
            "--model", "reference:wrong", "--samples", "2", "--db", str(db), "--no-report"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()

    assert main(["results", "--db", str(db), "--json"]) == 0
    right, wrong = json.loads(capsys.readouterr().out)
    assert right["status"] == wrong["status"] == "finished"
    assert list(right["pass_at_1"]["benchmarks"]) == list(TASKS)  # ten, MMLU-Redux counted once
    assert set(right["pass_at_1"]["benchmarks"].values()) == {1.0} and right["pass_at_1"]["mean"] == 1.0
    assert set(wrong["pass_at_1"]["benchmarks"].values()) == {0.0} and wrong["pass_at_1"]["mean"] == 0.0
    assert right["metrics"]["all"] == {"pass@1": 1.0}
    assert "loglikelihood_acc" in right["metrics"]["mmlu_redux"]  # kept, but outside the headline

    assert (
        main(["results", "--db", str(db), "--tasks"]) == 0
    )  # each benchmark's pass@1, each group's mean, the suite mean
    rows = [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("│")
    ]
    groups = [
        "[maths/reasoning]",
        "[knowledge]",
        "[code]",
    ]  # db.headline.TASK_GROUPS["paper"], in first-benchmark order
    assert [(row[0], row[3], row[4].split()[0]) for row in rows] == [  # model, r, seeds, task, pass@1, runs
        (model if i == 0 else "", task, score)
        for model, score in (("reference:right", "1.000"), ("reference:wrong", "0.000"))
        for i, task in enumerate([*TASKS, *groups, "mean"])
    ]

    engine = open_existing(f"sqlite:///{db}")
    points = queries.accuracy_memory(engine, task="all")  # what the dashboards plot
    assert dict(zip(points["model"], points["accuracy"])) == {"reference:right": 1.0, "reference:wrong": 0.0}
    assert set(points["metric"]) == {"pass@1"}
    assert set(queries.accuracy_memory(engine, task="mmlu_redux")["metric"]) == {"pass@k:k=1&n=2"}


def test_a_bad_data_file_stops_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data_dir(tmp_path / "data", subjects=())
    (data / "aime26.jsonl").write_text('{"problem_idx": 1, "problem": "p", "answer": [1, 2]}\n')
    db = tmp_path / "r.sqlite"
    argv = ["run", "--suite", "paper", "--tasks", "aime24,aime26", "--data-dir", str(data), "--model", "preset:qwen3-tiny",
            "--db", str(db), "--no-report"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("loopeval: error: task aime26: ")
    assert "aime26.jsonl row 1, column 'answer': expected text, got list [1, 2]" in err and "MathArena/aime_2026" in err
    assert not db.exists()
