"""The runs behind the points (`analysis.runs`) find their point by the one key (`analysis.points.point_key`), on a
real SQLite file: a plain model stored without a loop count, a run off the exit axis and one on it, a configuration,
and a run not scored yet, whose point has no row of its own."""

from __future__ import annotations

from pathlib import Path

from analysis.points import accuracy_points, point_key
from analysis.runs import ordered_sets, run_records
from db.store import Store
from tests.support.stored_runs import MODEL, SAMPLING, store_run


def test_every_scored_run_finds_its_point_and_an_unscored_one_none(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "runs.sqlite"))
    plain = store_run(store, [1.0, 0.0, 0.0, 0.0], model="zoo:qwen3-tiny-small", loops=None)  # stored NULL: r=1
    own = store_run(store, [1.0, 1.0, 0.0, 0.0])
    exits = store_run(store, [1.0, 1.0, 1.0, 0.0], exit_threshold=0.5, exit_criterion="gate")
    bf16 = store_run(store, [1.0, 1.0, 1.0, 1.0], overrides={"dtype": "bfloat16"})
    queued = store.create_run(
        sweep_id="later",
        model_spec=MODEL,
        adapter="zoo",
        loops=2,
        suite="synthetic",
        tasks=["chain3", "c30k4"],
        limit=4,
        sampling=SAMPLING,
        seed=0,
        data_fingerprint="f" * 64,
        status="queued",
        spec={"models": [MODEL], "seed": 0},
    )
    profile = store.create_run(sweep_id="profiled", kind="profile", model_spec=MODEL, adapter="zoo", suite="profile")
    runs = run_records(store.engine)
    points = accuracy_points(store.engine, None)
    store.close()
    by_key = {point_key(row): row.run_id for row in points.itertuples()}
    found = {run["run_id"]: by_key.get(point_key(run)) for run in runs}
    assert found == {plain: plain, own: own, exits: exits, bf16: bf16, queued: None, profile: None}
    assert point_key(runs[0]) == ("zoo:qwen3-tiny-small", 1, None, None, ""), "a NULL loop count reads r=1, NaN None"
    assert [run["scored"] for run in runs] == [True, True, True, True, False, False]
    assert runs[-1]["set_id"] is None and runs[-1]["kind"] == "profile", "a profile has no evaluation set"
    assert list(ordered_sets(runs)) == [runs[0]["set_id"]], "one set: every evaluation run's"
