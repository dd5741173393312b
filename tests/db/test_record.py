"""`db.record.PlannedRun`, the one record of a run, through a real SQLite store: its columns are what is stored, and
a stored run, as an ORM row or as a query's row, reads back as the run it was planned as, with the same identity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from db.models import Run
from db.record import PlannedRun
from db.sets import configuration, run_key
from db.store import Store

SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 2, "seed": 3, "stop": ()}
SPEC = {"models": ("zoo:ouro-tiny",), "loops": (4,), "model_overrides": {"zoo:ouro-tiny": {"max_batch": 8}}}


def _planned(**axes: object) -> PlannedRun:
    return PlannedRun(
        "zoo:ouro-tiny",
        4,
        "synthetic",
        ("lookup", "addition"),
        SAMPLING,
        3,
        limit=5,
        data_fingerprint="f" * 64,
        spec=SPEC,
        **axes,
    )  # type: ignore[arg-type]


def test_a_stored_run_reads_back_as_the_run_it_was_planned_as(tmp_path: Path) -> None:
    planned = [
        _planned(),
        _planned(exit_threshold=0.5, exit_criterion="kl"),
        _planned(kv_policy="shared-last", kv_dtype="int8"),
    ]
    store = Store.open(str(tmp_path / "r.sqlite"))
    try:
        ids = store.create_runs(
            [{**run.columns(), "sweep_id": "s1", "adapter": "zoo", "status": "finished"} for run in planned]
        )
        stored = [run.stored(run_id, "s1") for run_id, run in zip(ids, planned)]
        assert [PlannedRun.of(store.get_run(run_id)) for run_id in ids] == stored
        with store.engine.connect() as connection:
            rows = connection.execute(select(Run).order_by(Run.id)).all()
        assert [PlannedRun.of(row._mapping) for row in rows] == stored, "a query's row reads back the same"
        assert store.finished_run_keys() == {run.key: run.id for run in stored}, (
            "the key the store computes is the record's"
        )
    finally:
        store.close()
    assert len({run.key for run in planned}) == 3, "each point of an axis is a run of its own"
    assert planned[2].configuration == {"max_batch": 8, "kv_policy": "shared-last", "kv_dtype": "int8"}
    assert planned[0].overrides == {"max_batch": 8} and configuration(planned[0].columns()) == {"max_batch": 8}


def test_its_json_columns_hold_what_the_database_gives_back() -> None:
    """Tuples become lists as JSON has them, so a record and its stored row are equal and key alike."""
    run = _planned()
    assert run.sampling["stop"] == [] and run.spec["loops"] == [4] and run.tasks == ("lookup", "addition")
    assert run.key == run_key(run.columns()) == replace(run, sampling={**SAMPLING, "stop": []}).key
    with pytest.raises(ValueError, match="planned but not stored"):
        _ = run.run_id
