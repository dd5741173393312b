"""The results store on real SQLite files: migrations, refusals that leave files untouched, idempotent samples, concurrent writers."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, event, inspect

from db.models import Base
from db.session import alembic_config, head_revision, open_engine

from db.store import Store
from db import ResultsError
from tests.support.old_databases import older_database, older_run_key

RUN = dict(sweep_id="s1", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic")


def sample(doc: int, index: int = 0, task: str = "addition") -> dict:
    return dict(task=task, doc_id=str(doc), sample_index=index, prompt=f"p{doc}", output="o", gold="g", score=1.0)


def test_head_creates_exactly_the_declared_schema(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'r.sqlite'}")
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, Base.metadata) == []
    assert set(inspect(engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}


def test_older_database_is_upgraded_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    older_database(path, "0001")
    store = Store.open(str(path))
    (summary,) = store.run_summaries()
    assert summary["sweep_id"] == "old" and summary["status"] == "finished"
    assert store.get_run(summary["id"]).spec == {}
    with store.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()


def test_memory_ticks_stored_before_0006_keep_their_readings_and_have_no_reserved_reading(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    older_database(path, "0005")
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO memory_samples (run_id, t, phase, kv_bytes_used, kv_bytes_allocated, rss) VALUES (1, 0.5, 'task:addition', 10, 16, 1000)"
    )
    conn.commit()
    conn.close()
    store = Store.open(str(path))
    with store.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
        rows = conn.exec_driver_sql(
            "SELECT run_id, t, phase, kv_bytes_used, kv_bytes_allocated, kv_bytes_reserved, rss FROM memory_samples"
        ).all()
    assert [tuple(r) for r in rows] == [(1, 0.5, "task:addition", 10, 16, None, 1000)]


def test_store_is_wal_with_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = open_engine(str(tmp_path / "r.sqlite"))
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_not_a_database_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    content = b"these are my notes, not a database\n" * 100
    path.write_bytes(content)
    with pytest.raises(ResultsError, match="not a SQLite database"):
        open_engine(str(path))
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.sqlite"]


def test_newer_schema_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY); INSERT INTO alembic_version VALUES ('9999');"
    )
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ResultsError, match="which this loopeval does not know .* written by a newer loopeval"):
        open_engine(str(path))
    assert path.read_bytes() == before


def test_unwritable_location_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(ResultsError, match="cannot create the database directory"):
        open_engine(str(blocker / "sub" / "r.sqlite"))
    assert blocker.read_text() == "x"


def test_samples_are_idempotent_per_doc_and_sample_index(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "r.sqlite"))
    run_id = store.create_run(**RUN)
    assert store.add_samples(run_id, [sample(0), sample(0, 1), sample(1)]) == 3
    assert store.add_samples(run_id, [sample(1), sample(2), sample(0, 1)]) == 1
    rows = store.samples(run_id)
    assert [(r.doc_id, r.sample_index) for r in rows] == [("0", 0), ("0", 1), ("1", 0), ("2", 0)]
    store.set_metrics(run_id, {"addition": {"em": (0.5, 0.1)}, "all": {"em": (0.5, 0.1)}})
    store.set_memory_peaks(run_id, {"rss": 123, "nvml_process": None})
    (summary,) = store.run_summaries()
    assert summary["n_samples"] == 4
    assert summary["metrics"] == {"addition": {"em": 0.5}, "all": {"em": 0.5}}
    assert summary["memory"] == {"rss": 123, "nvml_process": None}


WRITER = textwrap.dedent(
    """
    import sys
    from db.store import Store
    store = Store.open(sys.argv[1])
    run_id = store.create_run(sweep_id=sys.argv[2], model_spec="m", adapter="preset", suite="synthetic")
    for doc in range(150):
        store.add_samples(run_id, [dict(task="t", doc_id=str(doc), sample_index=0, prompt="p", output="o")])
    store.finish_run(run_id, "finished")
    """
)


def test_two_processes_write_one_database_at_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"writer{i}"], stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    runs = Store.open(str(path)).run_summaries()
    assert sorted((r["sweep_id"], r["status"], r["n_samples"]) for r in runs) == [
        ("writer0", "finished", 150),
        ("writer1", "finished", 150),
    ]


def test_nan_is_never_stored_as_non_standard_json(tmp_path: Path) -> None:
    """Python's json writes NaN, which no JSON standard reads and Postgres refuses: the store refuses it on every backend."""
    store = Store.open(str(tmp_path / "r.sqlite"))
    with pytest.raises(ResultsError, match="a value to store is NaN or infinite"):
        store.create_runs(
            [
                dict(sweep_id="s", model_spec="m", adapter="a", suite="synthetic"),
                dict(
                    sweep_id="s", model_spec="m", adapter="a", suite="synthetic", spec={"exit_threshold": float("nan")}
                ),
            ]
        )
    assert store.run_summaries() == [], "a sweep is stored whole or not at all"
    store.close()


def test_ctrl_c_during_a_statement_stays_an_interrupt(tmp_path: Path) -> None:
    """Database errors become one line; Ctrl-C or SIGTERM landing inside a statement must stay an interrupt,
    or the run it stops is stored as failed instead of interrupted (and never offered for --resume)."""
    store = Store.open(str(tmp_path / "r.sqlite"))
    (run_id,) = store.create_runs([dict(RUN)])

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    event.listen(store.engine, "do_execute", interrupt)
    with pytest.raises(KeyboardInterrupt):
        store.add_samples(run_id, [sample(0)])
    event.remove(store.engine, "do_execute", interrupt)
    assert store.run_summaries()[0]["n_samples"] == 0
    store.close()


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Python's own Ctrl-C handler, as in a terminal: a test process started in the background inherits SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_signal_inside_a_transaction_is_held_until_it_commits_and_leaves_no_lock(tmp_path: Path) -> None:
    """A real Ctrl-C that lands mid-transaction is delivered once the transaction ends: the write is stored, the
    write lock is free for the process's next write (a sweep storing its runs as interrupted), and the
    interrupt still stops the caller. Unheld, it cut the write short and could leave the lock held."""
    path = tmp_path / "r.sqlite"
    store = Store.open(str(path))
    (run_id,) = store.create_runs([dict(RUN)])

    def ctrl_c(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.startswith("UPDATE runs"):
            os.kill(os.getpid(), signal.SIGINT)

    event.listen(store.engine, "before_cursor_execute", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        store.finish_run(run_id, "interrupted", error="stopped")
    event.remove(store.engine, "before_cursor_execute", ctrl_c)
    assert store.get_run(run_id).status == "interrupted"
    probe = sqlite3.connect(path, timeout=0.1, isolation_level=None)
    probe.execute("BEGIN IMMEDIATE")
    probe.execute("ROLLBACK")
    probe.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back
    store.close()


def test_0009_adds_the_compute_columns_empty_and_downgrade_takes_them_back(tmp_path: Path) -> None:
    """Runs stored before the exit axis keep their identity (no threshold: not swept) and read NULL (not recorded)."""
    path = tmp_path / "old.sqlite"
    older_database(path, "0008", sampling='{"n": 1}')
    sample_row = sample(0)
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO samples (run_id, task, doc_id, sample_index, prompt, output, loops_used, created_at) "
        "VALUES (1, 'addition', '0', 0, 'p', 'o', 2.5, '2026-12-01 00:00:00')"
    )
    conn.commit()
    conn.close()
    before = older_run_key({"n": 1})
    store = Store.open(str(path))
    assert store.finished_run_keys() == {before: 1}, "the stored run keeps its identity"
    (summary,) = store.run_summaries()
    assert (summary["exit_threshold"], summary["exit_criterion"], summary["energy_joules"]) == (None, None, None)
    (old,) = store.samples(1)
    assert (old.loops_used, old.loops_histogram, old.decode_seconds) == (2.5, None, None)
    store.add_samples(
        1,
        [
            {**sample_row, "doc_id": str(doc), "loops_histogram": histogram}
            for doc, histogram in ((1, {"1": 2, "4": 1}), (2, None))
        ],
    )
    with store.engine.connect() as conn:  # a model that does not loop stores SQL NULL, not the JSON text null
        assert conn.exec_driver_sql(
            "SELECT doc_id, loops_histogram IS NULL FROM samples WHERE doc_id != '0' ORDER BY doc_id"
        ).all() == [("1", 0), ("2", 1)]
    assert [s.loops_histogram for s in store.samples(1)][1:] == [{"1": 2, "4": 1}, None]
    store.close()

    engine = create_engine(f"sqlite:///{path}")
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0008")
    columns = {table: {c["name"] for c in inspect(engine).get_columns(table)} for table in ("runs", "samples")}
    assert not columns["runs"] & {"exit_threshold", "exit_criterion", "energy_joules"}
    assert not columns["samples"] & {"loops_histogram", "decode_seconds"} and "loops_used" in columns["samples"]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT model_spec, status FROM runs").all() == [("m", "finished")]
        assert conn.exec_driver_sql("SELECT loops_used FROM samples ORDER BY doc_id").all() == [
            (2.5,),
            (None,),
            (None,),
        ]
    engine.dispose()


def test_0010_adds_the_kv_axis_empty_so_stored_runs_keep_their_identity_and_point(tmp_path: Path) -> None:
    """A run stored before the KV axis reads NULL (not swept), keeps its key and configuration; downgrade takes the
    columns back."""
    path = tmp_path / "old.sqlite"
    older_database(path, "0009", sampling='{"n": 1}')
    before = older_run_key({"n": 1})
    store = Store.open(str(path))
    assert store.finished_run_keys() == {before: 1}, "the stored run keeps its identity"
    (summary,) = store.run_summaries()
    assert (summary["kv_policy"], summary["kv_dtype"], summary["kv_bytes_per_token"], summary["overrides"]) == (
        None,
        None,
        None,
        {},
    )
    store.close()

    engine = create_engine(f"sqlite:///{path}")
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0009")
    assert not {c["name"] for c in inspect(engine).get_columns("runs")} & {"kv_policy", "kv_dtype"}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT model_spec, status FROM runs").all() == [("m", "finished")]
    engine.dispose()


def test_a_lease_passes_on_only_when_it_expired_or_its_holder_is_gone(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "r.sqlite"))
    run_id = store.create_run(**RUN)
    alive, gone = (lambda holder: False), (lambda holder: True)
    assert store.lease_holder(run_id, alive) is None  # never leased
    assert store.take_lease(run_id, "a", 60, alive) is None
    assert store.take_lease(run_id, "b", 60, alive) == "a" and store.lease_holder(run_id, alive) == "a"
    assert store.lease_holder(run_id, gone) is None and store.take_lease(run_id, "b", 60, gone) is None
    assert store.lease_holder(run_id, alive) == "b"
    store.release_lease(run_id, "a")  # not the holder: nothing changes
    assert store.lease_holder(run_id, alive) == "b"
    store.release_lease(run_id, "b")
    assert store.lease_holder(run_id, alive) is None
    assert store.take_lease(run_id, "c", -1, alive) is None  # a lease already expired
    assert store.lease_holder(run_id, alive) is None and store.take_lease(run_id, "d", 60, alive) is None
    assert store.lease_holder(run_id + 1, alive) is None  # no such run
    store.close()
