"""One configuration is one run and one point, however it is spelled: the model bare or with its prefix, its own KV
policy and dtype named or not (on the axis or as its overrides), `shared-ema` per model or on the axis, `temperature`
an integer in a sweep file or a float on the command line. Real `loopeval run`s of a trained zoo model on a real
SQLite file; then a database as an older loopeval left it, with the duplicates the spellings made, read as one point
each, and its set ids joined by migration 0013 without a stored value changing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine

from analysis.points import accuracy_points
from db.record import PlannedRun
from db.session import alembic_config
from db.sets import configuration, run_key, run_set
from db.store import Store
from harness.cli import main
from tests.support.cli import printed
from tests.support.old_databases import older_database
from tests.support.sqlite import query
from tests.support.stored_runs import store_run

MODEL = "zoo:lab-baseloop"  # a per-loop model with a name no other prefix has, so the bare name resolves to it
SMALL = ["--loops", "4", "--tasks", "chain3", "--limit", "2", "--samples", "1"]
FILE_SMALL = 'loops = [4]\ntasks = ["chain3"]\nlimit = 2\nsamples = 1\n'


def _spellings(tmp: Path) -> list[list[str]]:
    """Five ways to ask for MODEL at r = 4, greedy, in its own KV: each a `loopeval run` command line."""
    own = tmp / "own.toml"
    own.write_text(
        FILE_SMALL
        + 'temperature = 0\nmodels = [{spec = "lab-baseloop", overrides = {kv_policy = "per-loop", kv_dtype = "auto"}}]\n'
    )
    twice = tmp / "twice.toml"
    twice.write_text(FILE_SMALL + 'temperature = 0\nmodels = ["lab-baseloop", "zoo:lab-baseloop"]\nkv_dtype = "auto"\n')
    return [
        ["--model", MODEL, "--temperature", "0", *SMALL],
        ["--model", "lab-baseloop", "--kv-policy", "per-loop", "--temperature", "0.0", *SMALL],
        ["--model", MODEL, "--kv-policy", "per-loop", "--kv-dtype", "auto", "--temperature", "0", *SMALL],
        ["--config", str(own)],
        ["--config", str(twice)],
    ]


def test_five_spellings_of_one_configuration_store_one_run_and_results_show_one_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    url = ["--db", f"sqlite:///{db}", "--no-report"]
    logs = [printed(["run", *argv, *url]) for argv in _spellings(tmp_path)]
    assert all("all 1 runs identical to finished run 1" in log for log in logs[1:]), logs
    assert query(db, "SELECT id, model_spec, loops, kv_policy, kv_dtype, status FROM runs") == [
        (1, MODEL, 4, None, None, "finished")
    ]
    (sampling,) = query(db, "SELECT sampling FROM runs")
    assert json.loads(sampling[0])["temperature"] == 0.0 and "0.0" in sampling[0], "a float, however it was given"

    # shared-ema named per model and on the axis, ALPHA's default written or not: one run more, not two
    ema = tmp_path / "ema.toml"
    ema.write_text(
        FILE_SMALL + 'temperature = 0\nmodels = [{spec = "lab-baseloop", overrides = {kv_policy = "shared-ema"}}]\n'
    )
    printed(["run", "--model", MODEL, "--kv-policy", "shared-ema:0.50", "--temperature", "0", *SMALL, *url])
    assert "all 1 runs identical to finished run 2" in printed(["run", "--config", str(ema), *url])
    assert query(db, "SELECT id, kv_policy, kv_dtype, spec FROM runs WHERE id = 2")[0][:3] == (
        2,
        "shared-ema:0.5",
        None,
    )

    capsys.readouterr()
    assert main(["results", "--db", f"sqlite:///{db}", "--json"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert [(s["id"], s["overrides"], s["kv_policy"], s["kv_dtype"]) for s in summaries] == [
        (1, {}, "per-loop", "auto"),
        (2, {"kv_policy": "shared-ema:0.5"}, "shared-ema:0.5", "auto"),
    ]
    engine = create_engine(f"sqlite:///{db}")
    try:
        points = accuracy_points(engine, None)
    finally:
        engine.dispose()
    assert sorted(zip(points["config_label"], points["run_ids"])) == [("", [1]), ("shared-ema:0.5", [2])]


def test_a_model_named_twice_with_different_overrides_is_refused_before_any_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    sweep = tmp_path / "sweep.toml"
    for models in (
        '["qwen3-tiny-small", {spec = "zoo:qwen3-tiny-small", overrides = {dtype = "float32"}}]',
        '[{spec = "qwen3-tiny-small", overrides = {max_batch = 4}}, {spec = "zoo:qwen3-tiny-small", '
        "overrides = {max_batch = 8}}]",
    ):
        sweep.write_text(f"models = {models}\nlimit = 1\n")
        assert main(["run", "--config", str(sweep), "--db", str(db)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("loopeval: error: zoo:qwen3-tiny-small is named twice ('qwen3-tiny-small' and "), line
        assert "with different overrides" in line
        assert not db.exists(), "refused before the first write"


def _older_spellings(store: Store) -> list[int]:
    """Runs as loopeval stored them before it resolved a configuration: the model's own policy and dtype named on
    the axis beside the same run off it, and shared-ema per model beside shared-ema:0.5 on the axis."""
    own = {"model_config": {"kv_strategy": "per_loop", "kv_policy": "per-loop", "kv_dtype": "auto"}}
    return [
        store_run(store, [1.0, 1.0, 0.0, 0.0], **own),
        store_run(store, [1.0, 1.0, 1.0, 0.0], kv_policy="per-loop", kv_dtype="auto", **own),
        store_run(store, [0.0, 0.0, 0.0, 0.0], overrides={"kv_policy": "shared-ema"}, **own),
        store_run(store, [1.0, 1.0, 1.0, 1.0], seed=1, kv_policy="shared-ema:0.5", **own),
    ]


def test_an_older_databases_duplicates_read_as_one_point_each_and_match_a_new_run(tmp_path: Path) -> None:
    """Nothing stored changes: the newest of a point's runs of one seed counts (a rerun of that seed, as
    `db.queries.pooled_metrics` treats any), and its runs of other seeds pool as seeds do. A new sweep asking for
    the same configuration finds them finished."""
    store = Store.open(str(tmp_path / "old.sqlite"))
    try:
        ids = _older_spellings(store)
        points = accuracy_points(store.engine, None)
        keys = store.finished_run_keys()
        rows = [store.get_run(run_id) for run_id in ids]
    finally:
        store.close()
    assert [r.kv_policy for r in rows] == [None, "per-loop", None, "shared-ema:0.5"], "stored values kept"
    by_config = {
        config: (runs, accuracy)
        for config, runs, accuracy in zip(points["config"], points["run_ids"], points["accuracy"])
    }
    assert by_config == {"": ([ids[1]], 0.75), '{"kv_policy":"shared-ema:0.5"}': ([ids[2], ids[3]], 0.5)}
    assert run_key(vars(rows[0])) == run_key(vars(rows[1])), "its own KV named or not: one identity"
    assert keys == {run_key(vars(rows[1])): ids[1], run_key(vars(rows[2])): ids[2], run_key(vars(rows[3])): ids[3]}
    asked = replace(PlannedRun.of(rows[0]), id=None, sweep_id=None)  # as a sweep naming nothing plans it now
    assert keys[asked.key] == ids[1]
    assert configuration(vars(rows[2])) == configuration(vars(rows[3])) == {"kv_policy": "shared-ema:0.5"}


# run keys and set ids of configurations that were already resolved, as the code before resolution computed them:
# every database stored before must keep matching them
_SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 1, "seed": 0, "stop": []}
_RUN = dict(
    model_spec="zoo:ouro-tiny",
    loops=4,
    seed=0,
    suite="synthetic",
    tasks=["chain3", "c30k4"],
    limit=4,
    sampling=_SAMPLING,
    data_fingerprint="f" * 64,
    spec={"model_overrides": {"zoo:ouro-tiny": {"dtype": "float32"}}},
)
KEPT_KEYS = [
    ({}, "ac0ff3913ee70dc4"),
    ({"kv_policy": "shared-last", "kv_dtype": "int8"}, "1282e1f20f2a390d"),
    ({"kv_dtype": "int8"}, "a406de22732a7043"),
    ({"kv_policy": "shared-ema:0.5"}, "1b0d1d7be1b8ab53"),
    ({"exit_threshold": 0.5, "exit_criterion": "gate"}, "d2b84c392018da8e"),
    ({"spec": {}}, "9321b8d1111d0f00"),
]


@pytest.mark.parametrize(("columns", "key"), KEPT_KEYS)
def test_a_resolved_configuration_keeps_its_run_key_and_set(columns: dict[str, object], key: str) -> None:
    run = _RUN | columns
    assert run_key(run) == run_key(run | {"model_config": {"kv_strategy": "per_loop"}}) == key
    assert run_set(run).id == "c1f362c1"


def test_migration_0013_joins_the_sets_an_integer_temperature_split_and_keeps_every_stored_value(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite"
    sampling = {"temperature": 0, "top_p": 0.7, "max_new_tokens": 8, "n": 1, "seed": 0}
    older_database(path, "0010", sampling=json.dumps(sampling))
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:  # the same set from the command line: the float
        conn.exec_driver_sql(
            "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks, sampling, seed, versions,"
            " host, status, started_at) SELECT 'new', kind, model_spec, adapter, model_config, suite, tasks, ?, seed,"
            " versions, host, status, started_at FROM runs",
            (json.dumps(sampling | {"temperature": 0.0}),),
        )
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0011")
    before = query(path, "SELECT id, set_id, sampling FROM runs ORDER BY id")
    assert before[0][1] != before[1][1], "0011 hashed the integer and the float apart"
    store = Store.open(str(path))  # upgrades to head
    store.close()
    after = query(path, "SELECT id, set_id, sampling FROM runs ORDER BY id")
    assert (
        after[0][1] == after[1][1] == before[1][1] == run_set(dict(suite="synthetic", tasks=[], sampling=sampling)).id
    )
    assert [row[2] for row in after] == [row[2] for row in before], "the stored sampling stays as written"
    with engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, "0011")
    engine.dispose()
    assert query(path, "SELECT id, set_id, sampling FROM runs ORDER BY id") == before
