"""`loopeval run` twice: a run already stored finished with the same model, overrides, loops, evaluation
set and seed is named and skipped, unless `--rerun`; anything that changes the set or the seed runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness.cli import main

pytestmark = pytest.mark.slow  # real runs of tiny presets


def _runs(db: Path) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute('SELECT id, loops, seed, "limit", status FROM runs ORDER BY id').fetchall()
    finally:
        conn.close()


def _run(db: Path, loops: str, *extra: str, limit: str = "1") -> None:
    assert (
        main(
            [
                "run",
                "--model",
                "preset:ouro-tiny",
                "--tasks",
                "lookup",
                "--limit",
                limit,
                "--samples",
                "1",
                "--max-new-tokens",
                "2",
                "--batch-size",
                "1",
                "--loops",
                loops,
                "--db",
                str(db),
                "--no-report",
                *extra,
            ]
        )
        == 0
    )


def test_identical_runs_are_reported_and_skipped_unless_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    _run(db, "1,2")
    assert [r[1] for r in _runs(db)] == [1, 2]
    capsys.readouterr()

    _run(db, "1,2")
    out = capsys.readouterr().out
    assert "all 2 runs identical to finished runs 1-2" in out and "--rerun runs them again" in out
    assert len(_runs(db)) == 2, "nothing stored again"
    ranking = out.split("└")[0]  # the first table: the ranking, whose last column is the runs
    assert [line.split("│")[-2].strip() for line in ranking.splitlines() if line.startswith("│")] == [
        "1",
        "2",
    ]  # their results

    _run(db, "2,3")
    assert "1 of 2 runs identical to finished run 2" in capsys.readouterr().out
    assert [r[1] for r in _runs(db)] == [1, 2, 3]

    for extra, limit in ((["--seed", "1"], "1"), ([], "2"), (["--rerun"], "1")):  # a new seed, a new set, or asked for
        _run(db, "1", *extra, limit=limit)
        assert "identical to finished" not in capsys.readouterr().out, extra
    assert [(r[1], r[2], r[3]) for r in _runs(db)[3:]] == [(1, 1, 1), (1, 0, 2), (1, 0, 1)]
    assert all(r[4] == "finished" for r in _runs(db))
