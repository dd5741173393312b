"""Points keep their identity on real SQLite files: a point's name carries what tells it apart in its set (r, exit
threshold, the overrides its model's points differ in), the answer names each point of the frontier once and says
which point another measure would rank first, and coincident points in the accuracy-memory figure stay at their memory, each with its own mark."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import names
from dashboards import figures
from analysis.answer import answer
from analysis.points import accuracy_points
from dashboards.data import depth_points
from db.store import Store
import measures
from tests.support.stored_runs import MODEL, store_run

MELT = "zoo:melt-tiny"


@pytest.fixture()
def store(tmp_path: Path):
    """ouro-tiny r=4 in two configurations (float32, bfloat16) and at two exit thresholds that score and hold the same
    (coincident points); melt-tiny r=4 in one configuration: smaller KV, lower accuracy."""
    store = Store.open(str(tmp_path / "names.sqlite"))
    store_run(store, [1.0, 1.0, 1.0, 0.0])
    store_run(store, [1.0, 1.0, 0.0, 0.0], overrides={"dtype": "bfloat16"}, kv=500_000)
    for threshold in (0.5, 0.9):
        store_run(store, [1.0, 1.0, 0.0, 0.0], exit_threshold=threshold, exit_criterion="gate")
    store_run(store, [1.0, 0.0, 0.0, 0.0], model=MELT, overrides={"dtype": "bfloat16"}, kv=100_000)
    yield store
    store.close()


def _names(points) -> list[str]:
    return [names.point_name(row) for row in points.itertuples()]


def test_a_name_carries_what_tells_the_point_apart_in_its_set(store: Store) -> None:
    points = accuracy_points(store.engine, None)
    assert sorted(_names(points)) == sorted(
        [
            f"{MODEL} r=4",
            f"{MODEL} r=4 dtype=bfloat16",
            f"{MODEL} r=4 exit gate 0.5",
            f"{MODEL} r=4 exit gate 0.9",
            f"{MELT} r=4",  # melt-tiny runs in one configuration here: its bfloat16 tells nothing apart
        ]
    )
    series = set(depth_points(store.engine, points["set_id"].iloc[0])["model"])
    assert series == {MODEL, f"{MODEL} dtype=bfloat16", f"{MODEL} exit gate 0.5", f"{MODEL} exit gate 0.9", MELT}, (
        "each configuration a line of its own against r"
    )


def test_the_answer_names_each_point_once_and_another_measures_winner(store: Store) -> None:
    points = accuracy_points(store.engine, None)
    sentence = answer(points, measures.WEIGHTS_PLUS_KV)
    # weights + KV: ouro float32 0.75 / 3.0 MB = 250 per GB beats melt 0.25 / 2.1 MB = 119; KV alone: melt 0.25 / 0.1 MB
    assert sentence.startswith(
        "Best by pass@1 per GB of weights + KV cache peak (what the model holds, weights counted): "
        f"{MODEL} r=4 (0.750 at 3 MB), 250 pass@1 per GB; the frontier: "
    )
    frontier = sentence.split("the frontier: ")[1].split("; by ")[0]
    assert frontier.split(" → ") == [
        f"{MELT} r=4 (0.250 at 2.1 MB)",
        f"{MODEL} r=4 dtype=bfloat16 (0.500 at 2.5 MB)",
        f"{MODEL} r=4 (0.750 at 3 MB)",
    ]
    assert sentence.endswith(f"; by KV cache peak alone, {MELT} r=4 would rank first.")
    assert "would rank first" not in answer(points, measures.WEIGHTS_PLUS_KV, rank="accuracy"), (
        "memory does not rank it"
    )


def test_coincident_points_stay_at_their_memory_each_with_its_own_mark_and_hover(store: Store) -> None:
    points = accuracy_points(store.engine, None)
    fig = figures.accuracy_vs_memory(points, measures.WEIGHTS_PLUS_KV)
    (ouro,) = [trace for trace in fig.data if trace.customdata is not None and trace.name == MODEL]
    at = {label: (x, float(held)) for label, x, held in zip(ouro.customdata[:, 0], ouro.x, ouro.customdata[:, 4])}
    assert sorted(at) == ["r=4", "r=4 dtype=bfloat16", "r=4 exit gate 0.5", "r=4 exit gate 0.9"]
    assert all(x == held for x, held in at.values()), "every point drawn at the memory its hover names"
    assert at["r=4 exit gate 0.5"] == at["r=4 exit gate 0.9"] == (3.0, 3.0) and at["r=4 dtype=bfloat16"] == (2.5, 2.5)
    # the two exit thresholds score alike at 3 MB: each hover names the other, and a label counts them
    here = dict(zip(ouro.customdata[:, 0], ouro.customdata[:, 5]))
    assert here["r=4 exit gate 0.5"] == f"<br>also here: {MODEL} r=4 exit gate 0.9" and here["r=4"] == ""
    (count,) = [trace for trace in fig.data if trace.mode == "text"]
    assert (list(count.x), list(count.text)) == ([3.0], ["×2"])
    # each configuration its own mark over the marker, named in the legend; the plain run none
    marks = figures.config_marks(points)
    assert sorted(marks) == ["dtype=bfloat16", "exit gate 0.5", "exit gate 0.9"] and len(set(marks.values())) == 3
    (drawn,) = [trace for trace in fig.data if trace.name == "configuration marks" and trace.legendgroup.endswith("1")]
    assert sorted(zip(drawn.x, drawn.marker.symbol)) == sorted(
        [(2.5, marks["dtype=bfloat16"]), (3.0, marks["exit gate 0.5"]), (3.0, marks["exit gate 0.9"])]
    )
    keys = {t.name: t.marker.symbol for t in fig.data if (t.legendgroup or "").startswith("configuration ")}
    assert keys == {"plain run (no mark)": None, **marks}
    assert figures.COINCIDENT_NOTE in " ".join(a.text.replace("<br>", " ") for a in fig.layout.annotations)


def test_a_configurations_stored_name_is_drawn_as_text_with_its_mark(tmp_path: Path) -> None:
    """An override's value is stored text: its legend entry is escaped like every stored name, and its point still
    carries the mark the legend names."""
    store = Store.open(str(tmp_path / "markup.sqlite"))
    store_run(store, [1.0, 0.0, 0.0, 0.0])
    store_run(store, [1.0, 1.0, 0.0, 0.0], overrides={"dtype": "<b>bf16</b>"}, kv=500_000)
    points = accuracy_points(store.engine, None)
    store.close()
    fig = figures.accuracy_vs_memory(points, measures.WEIGHTS_PLUS_KV)
    keys = {t.name: t.marker.symbol for t in fig.data if (t.legendgroup or "").startswith("configuration ")}
    assert set(keys) == {"plain run (no mark)", "dtype=&lt;b&gt;bf16&lt;/b&gt;"}
    (drawn,) = [t for t in fig.data if t.name == "configuration marks"]
    assert list(drawn.marker.symbol) == [keys["dtype=&lt;b&gt;bf16&lt;/b&gt;"]] and list(drawn.x) == [2.5]
