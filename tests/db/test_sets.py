"""Evaluation sets (db.sets) on real SQLite files: what makes two runs comparable, the latest set as the
default, an accuracy point never merged across sets, old databases still readable, and the suite
mean's standard error."""

from __future__ import annotations

import math
from pathlib import Path

from sqlalchemy import create_engine

from db import queries
from db.headline import benchmark_stderrs, headline_stderr
from db.sets import EvalSet, run_key, run_set, set_label
from db.store import Store
from tests.support.old_databases import SET_RUNS, add_set_runs, older_database, sets_read_before

SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 4, "seed": 0, "stop": []}
FIVE = ["addition", "chain2", "chain3", "chain4", "lookup"]


def _run(
    store: Store,
    model: str,
    loops: int,
    tasks: list[str],
    limit: int | None,
    accuracy: float,
    kv: int,
    sweep: str,
    **extra,
) -> int:
    """A finished run with per-task pass@1 = `accuracy` (stderr 0.02 each) and a KV peak."""
    fields = (
        dict(
            sweep_id=sweep,
            model_spec=model,
            adapter="zoo",
            loops=loops,
            suite="synthetic",
            tasks=tasks,
            limit=limit,
            sampling=SAMPLING,
            seed=0,
            data_fingerprint="f" * 64,
            status="finished",
        )
        | extra
    )
    run_id = store.create_run(**fields)
    store.set_metrics(
        run_id, {t: {"pass@k:k=1&n=4": (accuracy, 0.02)} for t in tasks} | {"all": {"pass@1": (accuracy, None)}}
    )
    store.set_memory_peaks(run_id, {"kv_bytes_allocated": kv, "weights_bytes": 1_000_000})
    return run_id


def test_a_set_is_suite_tasks_limit_sampling_and_data_not_the_seed() -> None:
    base = dict(suite="synthetic", tasks=["chain3", "chain4"], limit=50, sampling=SAMPLING, data_fingerprint="ab" * 32)
    same = run_set(base)
    assert run_set(base | {"tasks": ["chain4", "chain3"]}) == same  # task order is not part of it
    assert run_set(base | {"sampling": SAMPLING | {"seed": 7}}).id == same.id  # seeds repeat one set
    for change in (
        {"tasks": ["chain3"]},
        {"limit": None},
        {"suite": "paper"},
        {"data_fingerprint": "cd" * 32},
        {"sampling": SAMPLING | {"n": 1}},
        {"sampling": SAMPLING | {"max_new_tokens": 16}},
    ):
        assert run_set(base | change).id != same.id, change
    assert set_label(same.id, same) == (
        f"set {same.id}: synthetic · chain3, chain4 · first 50 per task · n=4 "
        "temperature 1 top-p 0.7 8 new tokens · data abababab"
    )
    assert "T=" not in same.description  # T is a looped model's trained depth in every figure, never the temperature
    assert "data not fingerprinted" in run_set(base | {"data_fingerprint": None}).description
    assert "5 tasks" in EvalSet.of("synthetic", FIVE, None, SAMPLING, None).description

    run = base | {"model_spec": "zoo:ouro-tiny", "loops": 4, "seed": 0, "spec": {"model_overrides": {}}}
    assert run_key(run) == run_key(run | {"sampling": SAMPLING | {"seed": 0}})
    for change in (
        {"loops": 6},
        {"seed": 1},
        {"model_spec": "zoo:melt-tiny"},
        {"limit": 10},
        {"spec": {"model_overrides": {"zoo:ouro-tiny": {"dtype": "bfloat16"}}}},
    ):
        assert run_key(run | change) != run_key(run), change
    assert run_key(run | {"spec": {"model_overrides": {"zoo:melt-tiny": {"dtype": "bfloat16"}}}}) == run_key(run)


def test_the_mixed_set_case_gives_two_sets_never_one_merged_point(tmp_path: Path) -> None:
    """The case as found: ouro-tiny r=4 on 5 tasks x 200 items, then on 2 easy tasks x 50 items."""
    store = Store.open(str(tmp_path / "r.sqlite"))
    full = {
        model: _run(store, model, 4, FIVE, None, accuracy, kv, "full")
        for model, accuracy, kv in (("zoo:ouro-tiny", 0.578, 1_300_000), ("zoo:melt-tiny", 0.55, 400_000))
    }
    easy = _run(store, "zoo:ouro-tiny", 4, ["chain3", "chain4"], 50, 0.920, 1_300_000, "easy")

    sets = queries.eval_sets(store.engine)
    assert sets["runs"].tolist() == [1, 2] and sets["last_run_id"].tolist() == [easy, full["zoo:melt-tiny"]]
    latest, older = sets["set_id"]
    assert queries.latest_set(store.engine) == latest

    default = queries.accuracy_memory(store.engine)  # the latest sweep's set: the easy run alone
    assert default[["model", "loops", "run_id"]].values.tolist() == [["zoo:ouro-tiny", 4, easy]]
    assert default["accuracy"].iloc[0] == 0.92 and set(default["set_id"]) == {latest}
    previous = queries.accuracy_memory(store.engine, set_id=older)
    assert dict(zip(previous["model"], previous["run_id"])) == full  # r=4 keeps its 5-task run
    assert dict(zip(previous["model"], previous["accuracy"].round(3))) == {
        "zoo:ouro-tiny": 0.578,
        "zoo:melt-tiny": 0.55,
    }
    assert "chain3, chain4 · first 50 per task" in default["set_label"].iloc[0]
    assert "5 tasks · all items" in previous["set_label"].iloc[0]
    assert queries.tasks(store.engine, latest) == ["all", "chain3", "chain4"]
    store.close()


def test_a_database_from_before_fingerprints_still_reads_with_a_set_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    older_database(path, "0003", model="zoo:ouro-tiny", tasks='["lookup"]', sampling='{"n": 4, "temperature": 1.0}')
    store = Store.open(str(path))  # upgrades to 0004: the old run keeps its row and gets a NULL fingerprint
    (summary,) = store.run_summaries()
    assert summary["data_fingerprint"] is None and "data not fingerprinted" in summary["set_label"]
    assert queries.eval_sets(store.engine)["set_id"].tolist() == [summary["set_id"]]
    new = _run(store, "zoo:ouro-tiny", None, ["lookup"], None, 0.5, 1000, "new", sampling={"n": 4, "temperature": 1.0})
    assert queries.latest_set(store.engine) != summary["set_id"], "fingerprinted runs are a set of their own"
    assert store.finished_run_keys()[run_key(vars(store.get_run(new)))] == new
    store.close()


def test_the_suite_mean_has_the_standard_error_of_a_mean_of_benchmarks() -> None:
    stderrs = {
        "aime24": {"pass@k:k=1&n=4": 0.03},
        "mmlu_redux:anatomy": {"pass@k:k=1&n=4": 0.04, "loglikelihood_acc": 9.0},
        "mmlu_redux:law": {"pass@k:k=1&n=4": 0.02},
        "all": {"pass@1": None},
    }
    group = math.sqrt(0.04**2 + 0.02**2) / 2
    assert benchmark_stderrs(stderrs) == {"aime24": 0.03, "mmlu_redux": group}
    assert math.isclose(headline_stderr(stderrs), math.sqrt(0.03**2 + group**2) / 2)
    assert headline_stderr({"aime24": {"pass@k:k=1&n=4": None}}) is None


def test_the_default_set_is_the_newest_with_scores(tmp_path: Path) -> None:
    """A sweep whose runs are still queued (or all failed) has nothing to plot: the default stays on scored runs."""
    store = Store.open(str(tmp_path / "r.sqlite"))
    scored = _run(store, "zoo:ouro-tiny", 4, FIVE, None, 0.578, 1_300_000, "full")
    store.create_run(
        sweep_id="queued",
        model_spec="zoo:ouro-tiny",
        adapter="zoo",
        loops=4,
        suite="synthetic",
        tasks=["chain3"],
        limit=5,
        sampling=SAMPLING,
        status="queued",
    )
    sets = queries.eval_sets(store.engine)
    assert sets["runs"].tolist() == [1, 1] and sets["last_run_id"].tolist() == [scored, scored + 1]
    assert queries.accuracy_memory(store.engine)["run_id"].tolist() == [scored]
    store.close()


def test_0011_stores_each_old_run_the_set_readers_hashed_before(tmp_path: Path) -> None:
    """An old database upgraded reads the same sets (ids and labels) as it did when every read hashed them; a run
    whose set columns are damaged gets none and does not stop the upgrade; new runs store theirs."""
    path = tmp_path / "old.sqlite"
    older_database(path, "0010", tasks='["lookup"]', sampling='{"n": 4, "temperature": 1.0, "stop": ["\\n"]}')
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        add_set_runs(conn)
    before = sets_read_before(engine)
    with engine.begin() as conn:  # a run with invalid JSON in its sampling (`db.stored`), which no reader could hash
        conn.exec_driver_sql(
            "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks,"
            " sampling, seed, versions, host, status, started_at) SELECT sweep_id, kind, model_spec,"
            " adapter, model_config, suite, tasks, '{\"n\": 4', seed, versions, host, status,"
            " started_at FROM runs WHERE id = 1"
        )
    engine.dispose()
    assert len(before) == 5 and len(set(before.values())) == 4, "runs 2 and 3 repeat one set with two seeds"

    store = Store.open(str(path))
    with store.engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT set_id FROM runs WHERE id = 7").all() == [(None,)]
        conn.exec_driver_sql("DELETE FROM runs WHERE id = 7")
    stored = {row.run_id: (row.set_id, row.set_label) for row in queries.run_sets(store.engine).itertuples()}
    assert stored == before
    summaries = {s["id"]: (s["set_id"], s["set_label"]) for s in store.run_summaries()}
    assert summaries == before | {6: (None, None)}, "the profile (run 6) has no set"
    assert set(queries.eval_sets(store.engine)["set_id"]) == {set_id for set_id, _ in before.values()}

    new = _run(
        store,
        "m",
        1,
        ["chain3", "chain4"],
        50,
        0.5,
        1000,
        "new",
        sampling=SET_RUNS[0]["sampling"],
        data_fingerprint="ab" * 32,
    )
    assert summaries[2][0] == run_set(SET_RUNS[0]).id == store.get_run(new).set_id
    assert queries.accuracy_memory(store.engine, set_id=summaries[2][0])["run_id"].tolist() == [new]
    store.update_run(new, limit=10)  # what the set is made of, changed: its stored id follows
    assert store.get_run(new).set_id == run_set(SET_RUNS[0] | {"limit": 10}).id
    store.close()
