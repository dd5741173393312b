"""Databases that fail under loopeval: a server that never answers, a statement another session blocks, a disk
that fills in the middle of a run. Each is one `loopeval: error:` line naming the database (exit 2), within the
stated time, and nothing half-committed: what was stored stays whole and the run continues with `--resume`.

Real things throughout: a TCP server that accepts connections and says nothing, the tests' Postgres server
(tests/support/pg.py), and a small tmpfs mount that really fills (the tests run as root; elsewhere those skip with the reason).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from db.store import Store
from harness.cli import main

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))


def _one_error(capfd: pytest.CaptureFixture[str]) -> str:
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("loopeval: error: "), err
    return lines[0]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte; its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize(
    "command",
    [
        ["results"],
        ["dashboard"],
        ["run", "--model", "preset:qwen3-tiny", "--tasks", "lookup", "--limit", "1"],
        ["run", "--resume", "1"],
    ],
)
def test_a_server_that_accepts_and_never_answers_is_an_error_after_the_connect_timeout(
    command: list[str], silent_server: int, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg", reason="Postgres URLs need the postgres extra (psycopg 3)")
    monkeypatch.setenv("LOOPEVAL_DB_CONNECT_TIMEOUT", "2")
    began = time.monotonic()
    code = main([*command, "--db", f"postgresql://me:secret@127.0.0.1:{silent_server}/loopeval"])
    elapsed = time.monotonic() - began
    line = _one_error(capfd)
    assert code == 2 and "no answer within the connect timeout ($LOOPEVAL_DB_CONNECT_TIMEOUT" in line, line
    assert f"127.0.0.1:{silent_server}/loopeval" in line and "secret" not in line
    assert elapsed < 30, f"waited {elapsed:.0f} s for a 2 s timeout"


def test_a_timeout_that_is_not_a_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOPEVAL_DB_CONNECT_TIMEOUT", "soon")
    assert main(["results", "--db", "postgresql://me@127.0.0.1:1/loopeval"]) == 2
    assert "LOOPEVAL_DB_CONNECT_TIMEOUT must be a whole number of seconds >= 1, got 'soon'" in _one_error(capfd)


@pytest.mark.slow  # a Postgres server: the fast tier starts none
def test_a_statement_another_session_blocks_is_an_error_after_the_statement_timeout(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    store = Store.open(postgres_url)
    store.finish_run(
        store.create_run(sweep_id="s", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic"), "finished"
    )
    store.close()
    locker = sqlalchemy.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with locker.connect() as conn:
        conn.exec_driver_sql("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")  # held until this transaction ends
        monkeypatch.setenv("LOOPEVAL_DB_STATEMENT_TIMEOUT", "1")
        began = time.monotonic()
        code = main(["results", "--db", postgres_url])
        elapsed = time.monotonic() - began
        conn.rollback()
    locker.dispose()
    line = _one_error(capfd)
    assert code == 2 and "no answer within the statement timeout ($LOOPEVAL_DB_STATEMENT_TIMEOUT" in line, line
    assert elapsed < 30
    monkeypatch.delenv("LOOPEVAL_DB_STATEMENT_TIMEOUT")
    assert (
        main(["results", "--db", postgres_url]) == 0
    )  # nothing changed: the same database reads once the lock is gone


def _fill(folder: Path) -> Path:
    """Fill the disk of `folder` to the last byte; the filler's path."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    for size in (1 << 20, 4096, 1):  # unbuffered writes, smaller and smaller, until not one byte fits
        try:
            while True:
                os.write(fd, b"\0" * size)
        except OSError:
            continue
    os.close(fd)
    return filler


@pytest.mark.slow  # a whole run in a process of its own, twice
def test_a_disk_that_fills_mid_run_is_one_line_and_the_run_resumes(small_disk: Path) -> None:
    db = small_disk / "results.sqlite"
    run = [
        LOOPEVAL,
        "run",
        "--model",
        "preset:qwen3-tiny",
        "--tasks",
        "chain2",
        "--limit",
        "200",
        "--samples",
        "4",
        "--max-new-tokens",
        "4",
        "--loops",
        "1",
        "--db",
        str(db),
        "--no-report",
    ]
    proc = subprocess.Popen(
        run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    filler = None
    deadline = time.monotonic() + 120
    while filler is None and time.monotonic() < deadline and proc.poll() is None:  # fill the disk once samples come in
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                if conn.execute("SELECT count(*) FROM samples").fetchone()[0] > 0:
                    filler = _fill(small_disk)
            conn.close()
        except sqlite3.Error:
            pass
        time.sleep(0.05)
    out, err = proc.communicate(timeout=180)
    assert filler is not None, f"the run ended before any sample was stored: {err}"
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert lines[-1].startswith(f"loopeval: error: database sqlite:///{db}: the disk is full"), err
    assert sum(line.startswith("loopeval: error:") for line in lines) == 1
    filler.unlink()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        run_id, status = conn.execute("SELECT id, status FROM runs").fetchone()
        stored = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    conn.close()
    assert status != "finished" and 0 < stored < 800
    assert (
        main(["run", "--resume", str(run_id), "--db", str(db), "--no-report"]) == 0
    )  # in this process, the disk freed
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM runs").fetchone() == ("finished",)
        assert conn.execute(
            "SELECT count(*), count(DISTINCT doc_id || ':' || sample_index) FROM samples"
        ).fetchone() == (800, 800)
    conn.close()
