"""The results store on a real, throwaway Postgres server (tests/support/pg.py): migrations, the psycopg 3 driver, concurrent writers.

Every test gets a fresh database on the session's server; without a Postgres server here they skip
with the reason (LOOPEVAL_REQUIRE_SERVICES turns that into a failure, as in .ci/run).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from db import queries
from db.models import Base
from db.session import alembic_config, head_revision, open_engine, open_existing
from db.store import Store
from tests.support.old_databases import SET_RUNS, add_set_runs, sets_read_before

pytestmark = pytest.mark.slow  # starts a Postgres server: the fast tier (-m 'not slow') starts none

RUN = dict(sweep_id="s1", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic")


def test_head_creates_exactly_the_declared_schema(postgres_url: str) -> None:
    engine = open_engine(postgres_url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, Base.metadata) == []
    assert set(inspect(engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
    engine.dispose()


def _database_at(postgres_url: str, revision: str, insert: str) -> None:
    """A database as the code of `revision` left it: the schema migrated to there, then one row written in its SQL."""
    engine = create_engine(postgres_url)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        conn.exec_driver_sql(insert)
    engine.dispose()


def test_older_database_is_upgraded_and_keeps_its_rows(postgres_url: str) -> None:
    _database_at(
        postgres_url,
        "0001",
        "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks, sampling, seed,"
        " versions, host, status, started_at) VALUES ('old', 'eval', 'm', 'preset', '{}', 'synthetic', '[]',"
        " '{}', 0, '{}', '{}', 'finished', '2026-11-30 00:00:00+00')",
    )
    store = Store.open(postgres_url)
    (summary,) = store.run_summaries()
    assert summary["sweep_id"] == "old" and summary["status"] == "finished"
    assert store.get_run(summary["id"]).spec == {}
    with store.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    store.close()


def test_an_eval_run_stored_before_0008_keeps_its_sampling_once_in_its_column(postgres_url: str) -> None:
    sampling = '{"temperature": 1.0, "top_p": 0.7, "top_k": null, "max_new_tokens": 20, "n": 4, "seed": 0, "stop": []}'
    _database_at(
        postgres_url,
        "0006",
        "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks, sampling, seed, spec,"
        " versions, host, status, started_at) VALUES ('old', 'eval', 'm', 'preset', '{}', 'synthetic', '[]',"
        f" '{sampling}', 0, '{{\"batch_size\": 4, \"sampling\": {sampling}}}', '{{}}', '{{}}', 'queued', '2026-12-03 00:00:00+00')",
    )
    store = Store.open(postgres_url)
    (summary,) = store.run_summaries()
    run = store.get_run(summary["id"])
    assert run.spec == {"batch_size": 4} and run.sampling == summary["sampling"]
    assert run.sampling == {
        "temperature": 1.0,
        "top_p": 0.7,
        "top_k": None,
        "max_new_tokens": 20,
        "n": 4,
        "seed": 0,
        "stop": [],
    }
    store.close()


def test_0009_adds_the_compute_columns_empty_and_downgrade_takes_them_back(postgres_url: str) -> None:
    _database_at(
        postgres_url,
        "0008",
        "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks, sampling, seed, spec,"
        " versions, host, status, started_at) VALUES ('old', 'eval', 'm', 'preset', '{}', 'synthetic', '[]',"
        " '{\"n\": 1}', 0, '{}', '{}', '{}', 'finished', '2026-12-03 00:00:00+00');"
        " INSERT INTO samples (run_id, task, doc_id, sample_index, prompt, output, loops_used, created_at)"
        " VALUES (1, 'addition', '0', 0, 'p', 'o', 2.5, '2026-12-03 00:00:00+00')",
    )
    store = Store.open(postgres_url)
    (summary,) = store.run_summaries()
    assert (summary["exit_threshold"], summary["exit_criterion"], summary["energy_joules"]) == (None, None, None)
    (sample,) = store.samples(summary["id"])
    assert (sample.loops_used, sample.loops_histogram, sample.decode_seconds) == (2.5, None, None)
    store.add_samples(
        summary["id"],
        [
            dict(
                task="addition",
                doc_id="1",
                sample_index=0,
                prompt="p",
                output="o",
                loops_used=2.5,
                loops_histogram={"1": 1, "4": 1},
                decode_seconds=0.25,
            )
        ],
    )
    assert [(s.loops_histogram, s.decode_seconds) for s in store.samples(summary["id"])][1] == ({"1": 1, "4": 1}, 0.25)
    store.update_run(summary["id"], exit_threshold=0.5, exit_criterion="gate", energy_joules=12.5)
    run = store.get_run(summary["id"])
    assert (run.exit_threshold, run.exit_criterion, run.energy_joules) == (0.5, "gate", 12.5)
    store.close()

    engine = create_engine(postgres_url)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0008")
    columns = {table: {c["name"] for c in inspect(engine).get_columns(table)} for table in ("runs", "samples")}
    assert not columns["runs"] & {"exit_threshold", "exit_criterion", "energy_joules"}
    assert not columns["samples"] & {"loops_histogram", "decode_seconds"}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM samples").scalar_one() == 2
    engine.dispose()


def test_0011_stores_each_old_run_the_set_readers_hashed_before(postgres_url: str) -> None:
    """On a server, whose driver hands JSON parsed, an upgraded database reads the same sets as it did when every
    read hashed them; downgrade takes the column back."""
    engine = create_engine(postgres_url)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0010")
        add_set_runs(conn)
    before = sets_read_before(engine)
    assert len(before) == 4 and len(set(before.values())) == 3, "runs 1 and 2 repeat one set with two seeds"

    store = Store.open(postgres_url)
    assert {row.run_id: (row.set_id, row.set_label) for row in queries.run_sets(store.engine).itertuples()} == before
    assert {s["id"]: (s["set_id"], s["set_label"]) for s in store.run_summaries()} == before | {5: (None, None)}
    new = store.create_run(sweep_id="new", model_spec="m", adapter="preset", **SET_RUNS[2])
    assert store.get_run(new).set_id == before[3][0]
    store.close()

    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0010")
    assert "set_id" not in {c["name"] for c in inspect(engine).get_columns("runs")}
    engine.dispose()


def test_a_plain_postgresql_url_uses_psycopg_3_and_never_shows_the_password(postgres_url: str) -> None:
    plain = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    store = Store.open(plain)
    assert store.engine.dialect.driver == "psycopg"
    assert make_url(postgres_url).password not in store.url and "***" in store.url
    run_id = store.create_run(**RUN)
    store.add_samples(run_id, [dict(task="t", doc_id="0", sample_index=0, prompt="p", output="o")])
    store.close()
    reader = open_existing(plain.replace("postgresql://", "postgres://"))
    assert reader.dialect.driver == "psycopg"
    reader.dispose()


WRITER = textwrap.dedent(
    """
    import sys
    from db.store import Store
    store = Store.open(sys.argv[1])  # every writer opens the new database at once: they take turns to migrate it
    run_id = store.create_run(sweep_id=sys.argv[2], model_spec="m", adapter="preset", suite="synthetic")
    for doc in range(150):
        store.add_samples(run_id, [dict(task="t", doc_id=str(doc), sample_index=0, prompt="p", output="o")])
    store.finish_run(run_id, "finished")
    """
)


def test_three_processes_create_and_write_one_database_at_once(postgres_url: str) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, postgres_url, f"writer{i}"], stderr=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    store = Store.open(postgres_url)
    assert sorted((r["sweep_id"], r["status"], r["n_samples"]) for r in store.run_summaries()) == [
        ("writer0", "finished", 150),
        ("writer1", "finished", 150),
        ("writer2", "finished", 150),
    ]
    store.close()


SAME_RUN = textwrap.dedent(
    """
    import random, sys
    from db.store import Store
    store = Store.open(sys.argv[1])
    docs = list(range(200))
    random.Random(int(sys.argv[3])).shuffle(docs)
    for start in range(0, 200, 5):
        batch = docs[start:start + 5]
        store.add_samples(int(sys.argv[2]), [dict(task="t", doc_id=str(d), sample_index=0, prompt="p", output="o") for d in batch])
    """
)


def test_two_workers_holding_one_run_store_each_sample_once(postgres_url: str) -> None:
    """What a lost Ray node leaves behind: its worker still writes while the retry writes the same samples."""
    store = Store.open(postgres_url)
    run_id = store.create_run(**RUN)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAME_RUN, postgres_url, str(run_id), str(seed)], stderr=subprocess.PIPE, text=True
        )
        for seed in range(3)
    ]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    rows = store.samples(run_id)
    assert len(rows) == 200 and len({r.doc_id for r in rows}) == 200
    store.close()
