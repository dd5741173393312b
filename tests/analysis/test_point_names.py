"""Points keep their identity on real SQLite files: a point's name carries what tells it apart in its set (r, exit
threshold, the overrides its model's points differ in), the answer names each point of the frontier once and says
which point another measure would rank first, and coincident points are set apart in the accuracy-memory figure."""

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


def test_coincident_points_are_set_side_by_side_with_their_own_hover(store: Store) -> None:
    points = accuracy_points(store.engine, None)
    fig = figures.accuracy_vs_memory(points, measures.WEIGHTS_PLUS_KV)
    (ouro,) = [trace for trace in fig.data if trace.customdata is not None and trace.name == MODEL]
    at = {label: (x, float(held)) for label, x, held in zip(ouro.customdata[:, 0], ouro.x, ouro.customdata[:, 4])}
    # the two exit thresholds and the float32 run hold 3 MB and two of them score alike: set apart, centred on 3 MB
    together = sorted(x for label, (x, _) in at.items() if label != "r=4 dtype=bfloat16")
    step = figures.SPREAD * 3.0
    assert together == pytest.approx([3.0 - step, 3.0, 3.0 + step])
    assert all(held == 3.0 for label, (_, held) in at.items() if label != "r=4 dtype=bfloat16"), "hovers say 3 MB"
    assert at["r=4 dtype=bfloat16"] == (2.5, 2.5), "a point alone at its memory stays where it is"
    assert sorted(at) == ["r=4", "r=4 dtype=bfloat16", "r=4 exit gate 0.5", "r=4 exit gate 0.9"]
    assert figures.SPREAD_NOTE in " ".join(a.text.replace("<br>", " ") for a in fig.layout.annotations)
