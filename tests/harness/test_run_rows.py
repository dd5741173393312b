"""A run's row: what an eval sweep stores, its sampling once (and a database of the schema before that,
upgraded, still skips and resumes its runs), and the one way an adapter is set to a run's loops."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import create_engine

import adapters
from adapters.base import AdapterError
from db.session import alembic_config
from db.record import PlannedRun
from db.sets import run_key, run_set
from db.store import Store
from harness.execution.runner import resume_run, skip_stored, store_sweep
from harness.planning.plan import prepare_sweep, stored_spec
from harness.planning.spec import RunSpec, at_loops

OVERRIDES = {"preset:ouro-tiny": {"exit_policy": "none"}}


def _spec() -> RunSpec:
    return RunSpec.build(
        models=["preset:ouro-tiny"],
        tasks=["lookup"],
        loops=[2],
        limit=1,
        samples=2,
        max_new_tokens=3,
        batch_size=1,
        seed=5,
        model_overrides=OVERRIDES,
    )


def _row(db: Path, run_id: int) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        row = dict(conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())
    finally:
        conn.close()
    return {
        k: json.loads(v) if k in ("model_config", "tasks", "sampling", "spec", "versions", "host") else v
        for k, v in row.items()
    }


def test_a_sweep_stores_each_run_with_its_sampling_once(tmp_path: Path) -> None:
    spec, db = _spec(), tmp_path / "r.sqlite"
    plan = prepare_sweep(spec)
    store = Store.open(str(db))
    (run,) = store_sweep(plan, store, "sweep1")
    store.close()
    row = _row(db, run.id)
    sampling = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 3, "n": 2, "seed": 5, "stop": []}
    assert {
        k: row[k]
        for k in (
            "sweep_id",
            "kind",
            "model_spec",
            "adapter",
            "model_config",
            "loops",
            "suite",
            "tasks",
            "sampling",
            "seed",
            "limit",
            "data_fingerprint",
            "status",
        )
    } == {
        "sweep_id": "sweep1",
        "kind": "eval",
        "model_spec": "preset:ouro-tiny",
        "adapter": "preset",
        "model_config": {},
        "loops": 2,
        "suite": "synthetic",
        "tasks": ["lookup"],
        "sampling": sampling,
        "seed": 5,
        "limit": 1,
        "data_fingerprint": plan.fingerprint,
        "status": "queued",
    }
    assert (run.model, run.loops, run.sweep_id) == ("preset:ouro-tiny", 2, "sweep1")
    assert PlannedRun.of(row) == run and run.key == run_key(row), (
        "the stored row reads back as the run it was planned as"
    )
    assert (
        "sampling" not in row["spec"] and row["spec"]["model_overrides"] == OVERRIDES and row["spec"]["batch_size"] == 1
    )
    assert "torch" in row["versions"] and row["host"]["cpu_count"] > 0
    assert RunSpec.from_dict(row["spec"], row["sampling"], None) == spec


def _previous_schema_database(db: Path, spec: RunSpec, plan: Any) -> list[dict[str, Any]]:
    """A SQLite file at schema 0006 with a finished and a queued run of `spec`, each stored as the code of that
    schema stored it: its sampling in `runs.sampling` and again inside `runs.spec`. Returns both rows' columns."""
    engine = create_engine(f"sqlite:///{db}")
    config = alembic_config()
    sampling = json.loads(json.dumps(dataclasses.asdict(spec.sampling)))  # as JSON columns read back
    old_spec = json.loads(json.dumps({**spec.to_dict(), "sampling": sampling}))
    rows = [
        dict(
            model_spec=model,
            loops=loops,
            suite=spec.suite,
            tasks=["lookup"],
            limit=spec.limit,
            seed=spec.seed,
            sampling=sampling,
            data_fingerprint=plan.fingerprint,
            spec=old_spec,
            status=status,
        )
        for model, loops, status in [
            (plan.runs[0].model, plan.runs[0].loops, "finished"),
            (plan.runs[0].model, plan.runs[0].loops, "queued"),
        ]
    ]
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
        for row in rows:
            conn.exec_driver_sql(
                "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, loops, suite, tasks, sampling, seed,"
                " \"limit\", data_fingerprint, spec, versions, host, status, started_at) VALUES ('old', 'eval', ?, 'preset',"
                " '{}', ?, ?, ?, ?, ?, ?, ?, ?, '{}', '{}', ?, '2026-12-03 00:00:00')",
                (
                    row["model_spec"],
                    row["loops"],
                    row["suite"],
                    json.dumps(row["tasks"]),
                    json.dumps(row["sampling"]),
                    row["seed"],
                    row["limit"],
                    row["data_fingerprint"],
                    json.dumps(row["spec"]),
                    row["status"],
                ),
            )
    engine.dispose()
    return rows


def test_a_database_of_the_schema_before_keeps_its_runs_identity_and_skips_them(tmp_path: Path) -> None:
    spec, db = _spec(), tmp_path / "old.sqlite"
    plan = prepare_sweep(spec)
    before = _previous_schema_database(db, spec, plan)
    store = Store.open(str(db))  # upgrades to head
    finished, queued = store.get_run(1), store.get_run(2)
    for run, old in zip((finished, queued), before):
        assert "sampling" not in run.spec and run.spec == {k: v for k, v in old["spec"].items() if k != "sampling"}
        assert run.sampling == old["sampling"]
        assert stored_spec(run, None) == spec
        assert run.set_id == run_set(_row(db, run.id)).id == run_set(old).id  # migration 0011: the set readers hashed
    assert store.finished_run_keys() == {run_key(before[0]): 1}
    skipped = skip_stored(plan, store, lambda line: None)  # the sweep planned again is the stored one: skipped
    assert [(o.run_id, o.status) for o in skipped] == [(1, "finished")] and plan.runs == []
    store.close()

    config = alembic_config()
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0006")
    engine.dispose()
    assert [_row(db, i)["spec"] for i in (1, 2)] == [old["spec"] for old in before]  # what older code resumes from


@pytest.mark.slow  # a real run of a tiny preset
def test_a_run_queued_under_the_schema_before_resumes_with_its_sampling(tmp_path: Path) -> None:
    spec, db = _spec(), tmp_path / "old.sqlite"
    _previous_schema_database(db, spec, prepare_sweep(spec))
    store = Store.open(str(db))
    (outcome,) = resume_run(2, store, str(db), log=lambda line: None)
    assert (outcome.run_id, outcome.status) == (2, "finished")
    store.close()
    conn = sqlite3.connect(db)
    try:
        samples = conn.execute("SELECT sample_index FROM samples WHERE run_id = 2 ORDER BY sample_index").fetchall()
    finally:
        conn.close()
    assert samples == [(0,), (1,)]  # n = 2 from the stored sampling, one doc (--limit 1)


def test_at_loops_changes_an_engine_adapter_in_place_through_its_checked_properties() -> None:
    adapter = at_loops(None, "preset:ouro-tiny", 2, {"seed": 3})
    assert adapter.loops == 2 and adapter.batching == "continuous"
    assert at_loops(adapter, "preset:ouro-tiny", 3, {"seed": 3}, batching="static") is adapter
    assert (adapter.loops, adapter.batching) == (3, "static")
    assert at_loops(adapter, "preset:ouro-tiny", None, {"seed": 3}) is adapter and adapter.loops == 3
    with pytest.raises(AdapterError, match="loops must be an integer"):
        at_loops(adapter, "preset:ouro-tiny", 0, {})
    with pytest.raises(AdapterError, match="batching 'paged' is not one of"):
        at_loops(adapter, "preset:ouro-tiny", 2, {}, batching="paged")
    plain = at_loops(None, "preset:qwen3-tiny", None, {})
    with pytest.raises(AdapterError, match="needs kv_strategy"):
        at_loops(plain, "preset:qwen3-tiny", 2, {})


def test_at_loops_loads_an_adapter_without_loops_with_the_override(tmp_path: Path) -> None:
    from adapters.testing import save_tiny_qwen3

    model = f"transformers:{save_tiny_qwen3(tmp_path / 'qwen3')}"
    adapter = adapters.load(model)
    assert not hasattr(adapter, "loops") and not hasattr(adapter, "batching")
    assert at_loops(adapter, model, None, {}, batching="static") is adapter  # nothing to change: kept
    with pytest.raises(AdapterError, match="loops"):  # loaded again with the override, which it refuses
        at_loops(adapter, model, 2, {})
