"""A plotted point is a configuration (db.queries.POINT): on real SQLite files, runs of one model, loops and exit
point that differ in their per-model overrides are two points, never seeds of one, and neither hides the other;
runs of one configuration with two seeds pool into one point."""

from __future__ import annotations

from pathlib import Path

import pytest

from db import queries
from db.sets import config_fields, config_key, configuration, run_key
from db.store import Store
from tests.support.stored_runs import DOCS, MODEL, SAMPLING, TASKS, store_run


@pytest.fixture()
def store(tmp_path: Path):
    store = Store.open(str(tmp_path / "points.sqlite"))
    yield store
    store.close()


def test_runs_differing_only_in_overrides_are_two_points_and_neither_hides_the_other(store: Store) -> None:
    """The red team's case: one model, one seed, one set; a fixed exit at loop 1 scores 0, every loop scores 1."""
    every_loop = store_run(store, [1.0] * DOCS)
    first_loop = store_run(store, [0.0] * DOCS, overrides={"exit_policy": "fixed", "exit_loop": 1})
    points = queries.accuracy_memory(store.engine).set_index("run_id")
    assert sorted(points.index) == [every_loop, first_loop], "two points, the older run not hidden by the newer"
    assert points.at[every_loop, "accuracy"] == 1.0 and points.at[first_loop, "accuracy"] == 0.0
    assert (points["seeds"] == 1).all(), "never pooled as two seeds"
    assert points.at[every_loop, "config"] == "" and config_fields(points.at[first_loop, "config"]) == {
        "exit_policy": "fixed",
        "exit_loop": 1,
    }


def test_one_configuration_with_two_seeds_pools_whatever_order_its_overrides_were_written_in(store: Store) -> None:
    first = store_run(store, [1.0, 1.0, 0.0, 0.0], seed=0, overrides={"dtype": "bfloat16", "exit_loop": 2})
    second = store_run(store, [1.0, 1.0, 1.0, 0.0], seed=1, overrides={"exit_loop": 2, "dtype": "bfloat16"})
    (point,) = queries.accuracy_memory(store.engine).itertuples()
    assert point.seeds == 2 and point.run_ids == [first, second]
    assert point.accuracy == pytest.approx(5 / 8), "the mean over both seeds' items"


def test_a_rerun_of_one_configuration_and_seed_replaces_the_older_run(store: Store) -> None:
    """The one case where a run counts in place of another: the same identity (db.sets.run_key), a `--rerun`."""
    store_run(store, [0.0] * DOCS, overrides={"dtype": "bfloat16"})
    newer = store_run(store, [1.0] * DOCS, overrides={"dtype": "bfloat16"})
    (point,) = queries.accuracy_memory(store.engine).itertuples()
    assert point.run_ids == [newer] and point.accuracy == 1.0


def test_the_point_key_is_the_identity_without_the_seed_and_set() -> None:
    """Two runs share a point exactly when their identities differ at most in the seed: every override counts, the
    overrides of other models do not, and an empty configuration keys as none."""
    run = {
        "model_spec": MODEL,
        "loops": 4,
        "seed": 0,
        "suite": "synthetic",
        "tasks": TASKS,
        "limit": DOCS,
        "sampling": SAMPLING,
        "data_fingerprint": "f" * 64,
        "spec": {"model_overrides": {MODEL: {"dtype": "bfloat16"}}},
    }
    other_model = run | {
        "spec": {"model_overrides": {MODEL: {"dtype": "bfloat16"}, "zoo:melt-tiny": {"dtype": "float16"}}}
    }
    assert config_key(configuration(other_model)) == config_key(configuration(run)) == '{"dtype":"bfloat16"}'
    assert run_key(other_model) == run_key(run)
    changed = run | {"spec": {"model_overrides": {MODEL: {"dtype": "bfloat16", "exit_loop": 2}}}}
    assert config_key(configuration(changed)) != config_key(configuration(run)) and run_key(changed) != run_key(run)
    assert config_key(configuration(run | {"spec": None})) == config_key({}) == ""
