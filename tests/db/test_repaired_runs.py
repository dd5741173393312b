"""A run damaged before migration 0011 and corrected afterwards, as its error line advises: the upgrade could not
hash its evaluation set, so it has none stored. On a real old-schema SQLite file: once corrected it regains its set
(its other seed is pooled with it again); where the file cannot be written it is named, never silently dropped."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from harness.cli import main
from tests.support.mounts import remount_read_only
from tests.support.rich_tables import body_rows
from tests.support.old_databases import SET_RUNS, add_set_runs, older_database, sets_read_before
from tests.support.sqlite import query

SEED_3 = 3  # run 3 is SET_RUNS[1]: the set of run 2, at seed 3


def _results(db: Path, capfd: pytest.CaptureFixture[str]) -> tuple[dict[int, str | None], list[str]]:
    """`loopeval results --json`: each run's stored set id, and the lines on stderr."""
    capfd.readouterr()
    assert main(["results", "--json", "--db", str(db)]) == 0
    out, err = capfd.readouterr()
    assert "Traceback" not in err, err
    return {run["id"]: run["set_id"] for run in json.loads(out)}, err.strip().splitlines()


@pytest.fixture
def corrected(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> tuple[Path, dict[int, tuple[str, str]]]:
    """An 0010 database whose run 3 held invalid JSON in its sampling when loopeval upgraded it, corrected since;
    with the sets readers gave its runs before 0011."""
    db = tmp_path / "old.sqlite"
    older_database(db, "0010")
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        add_set_runs(conn)
    before = sets_read_before(engine)
    engine.dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET sampling = '{\"n\": 4' WHERE id = ?", (SEED_3,))
    conn.close()

    sets, err = _results(db, capfd)  # upgrades to head: the damaged run gets no set id
    assert SEED_3 not in sets and err == [f"run {SEED_3} skipped: runs.sampling is not valid JSON (sqlite:///{db})"], (
        err
    )
    assert query(db, "SELECT set_id FROM runs WHERE id = ?", SEED_3) == [(None,)]

    with sqlite3.connect(db) as conn:  # corrected as the line advises: the value it held before
        conn.execute("UPDATE runs SET sampling = ? WHERE id = ?", (json.dumps(SET_RUNS[1]["sampling"]), SEED_3))
    conn.close()
    return db, before


def test_a_run_corrected_after_the_upgrade_regains_its_set(
    corrected: tuple[Path, dict[int, tuple[str, str]]], capfd: pytest.CaptureFixture[str]
) -> None:
    db, before = corrected
    sets, err = _results(db, capfd)
    assert err == []
    assert sets[SEED_3] == sets[2] == before[SEED_3][0], "the same set as its other seed, as read before 0011"
    assert {run_id: sets[run_id] for run_id in before} == {run_id: set_id for run_id, (set_id, _) in before.items()}
    assert query(db, "SELECT set_id FROM runs WHERE id = ?", SEED_3) == [(before[SEED_3][0],)]

    capfd.readouterr()
    assert main(["results", "--db", str(db), "--set", before[2][0]]) == 0
    out = capfd.readouterr().out
    assert body_rows(out)[0] == [["", "m", "1", "2", "finished", "n/a", "n/a", "2-3"]], "its two seeds, one point"


def test_a_corrected_run_on_a_read_only_mount_is_named_and_the_others_shown(
    corrected: tuple[Path, dict[int, tuple[str, str]]], small_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    source, before = corrected
    db = small_disk / "old.sqlite"
    shutil.copy(source, db)
    remount_read_only(small_disk)
    sets, err = _results(db, capfd)
    assert sorted(sets) == sorted(set(before) - {SEED_3}) + [6]
    assert err == [
        f"run {SEED_3} skipped: runs.set_id is empty: a value of the run was damaged when the database was upgraded, "
        "so it was given no evaluation set; open the database where it can be written once that value is correct "
        f"(sqlite:///{db})"
    ]
