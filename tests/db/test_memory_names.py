"""Migration 0007 on a database made by the code before it: the figures read the same values under today's names.

`data/made-by-4ad3e07.sqlite` was made by the code of commit 4ad3e07 (schema 0006), with the real commands:

    loopeval run --model preset:ouro-tiny --model preset:melt-tiny --limit 2 --max-new-tokens 4 --loops 1,2 \
        --samples 1 --tasks addition,chain2 --db made-by-4ad3e07.sqlite --no-report
    loopeval profile preset:melt-tiny --lengths 16,32 --loops 1,2 --db made-by-4ad3e07.sqlite

and `data/made-by-4ad3e07.json` holds what that code read from it through `figure_data` below (the accuracy-per-GB
ranking for every selectable measure, each run's memory series, the profile points, the peaks), under its names
(`kv_bytes_peak`, `rss_peak`, `weights_bytes + kv_bytes_peak`, ...).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from alembic import command
from sqlalchemy import Engine, create_engine

import measures
from analysis.points import accuracy_points
from analysis.ranking import ranked
from db import queries
from db.session import alembic_config, open_existing
from db.store import Store

DATA = Path(__file__).parent / "data"
OLD = DATA / "made-by-4ad3e07.sqlite"
RANKED = ["model", "loops", "accuracy", "memory", "per_gb", "frontier"]


def _records(frame: pd.DataFrame) -> dict[str, list[Any]]:
    return json.loads(
        json.dumps(frame.astype(object).where(frame.notna(), None).to_dict("list"), default=lambda v: v.item())
    )


def figure_data(engine: Engine) -> dict[str, Any]:
    """What the figures read: the ranking per selectable measure, each run's memory series, the profile points, the peaks."""
    set_id = queries.latest_set(engine)
    points = accuracy_points(engine, set_id)
    return {
        "set_id": set_id,
        "ranked": {m: _records(ranked(points, m)[RANKED]) for m in measures.MEMORY_MEASURES},
        "series": {
            str(r): _records(queries.memory_series(engine, int(r))) for r in queries.runs(engine, kind=None)["run_id"]
        },
        "profile": _records(queries.profile_points(engine)),
        "peaks": _records(queries.memory_peaks(engine)),
    }


def _renamed(columns: dict[str, Any]) -> dict[str, Any]:
    return {measures.canonical(name): values for name, values in columns.items()}


@pytest.fixture()
def upgraded(tmp_path: Path) -> str:
    """A copy of the old database, upgraded to head by opening it as every writer does."""
    path = tmp_path / "old.sqlite"
    shutil.copy(OLD, path)
    Store.open(str(path)).close()
    return f"sqlite:///{path}"


def test_the_figures_read_the_same_values_after_0007(upgraded: str) -> None:
    before = json.loads((DATA / "made-by-4ad3e07.json").read_text())
    engine = open_existing(upgraded)
    after = figure_data(engine)
    assert after["set_id"] == before["set_id"]
    assert after["ranked"] == _renamed(before["ranked"])  # every measure, its old name now an alias
    assert after["series"] == before["series"]
    assert after["profile"] == _renamed(before["profile"])
    old_peaks = before["peaks"]
    expected = _renamed({k: v for k, v in old_peaks.items() if k != "kv_bytes_allocated"})  # the exact peak replaces it
    assert after["peaks"] == {name: expected[name] for name in after["peaks"]} and set(after["peaks"]) == set(expected)
    assert not [name for name in after["peaks"] if name.endswith("_peak")]
    assert any(
        a < p for a, p in zip(old_peaks["kv_bytes_allocated"], old_peaks["kv_bytes_peak"])
    )  # the case that matters is here


@pytest.mark.slow  # starts a Postgres server
def test_postgres_carries_the_same_database_over(postgres_url: str) -> None:
    """The old file's rows copied into a Postgres database at 0006, then upgraded: the same figures' values."""
    engine = create_engine(postgres_url)
    config = alembic_config()
    source = sqlite3.connect(OLD)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
        for table in (
            "runs",
            "samples",
            "task_metrics",
            "memory_samples",
            "memory_peaks",
            "profile_points",
            "probe_values",
        ):
            cursor = source.execute(f"SELECT * FROM {table}")
            names = ", ".join(f'"{d[0]}"' for d in cursor.description)  # quoted: `limit` is a keyword
            marks = ", ".join(["%s"] * len(cursor.description))
            rows = cursor.fetchall()
            if rows:
                conn.exec_driver_sql(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)
    source.close()
    engine.dispose()
    Store.open(postgres_url).close()
    before = json.loads((DATA / "made-by-4ad3e07.json").read_text())
    reader = open_existing(postgres_url)
    after = figure_data(reader)
    reader.dispose()
    assert after["ranked"] == _renamed(before["ranked"]) and after["series"] == before["series"]
    assert after["profile"] == _renamed(before["profile"])


def test_peak_rows_say_whether_they_are_a_peak_or_a_fixed_size(upgraded: str) -> None:
    engine = create_engine(upgraded)
    with engine.connect() as conn:
        kinds = dict(conn.exec_driver_sql("SELECT DISTINCT measure, kind FROM memory_peaks").all())
    assert kinds == {name: measures.BY_NAME[name].stored_as for name in kinds}
    assert kinds["weights_bytes"] == "fixed" and kinds["rss"] == "peak"


def test_downgrade_gives_the_old_names_back(upgraded: str) -> None:
    before = json.loads((DATA / "made-by-4ad3e07.json").read_text())["peaks"]
    engine = create_engine(upgraded)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0006")
        peaks = conn.exec_driver_sql("SELECT run_id, measure, value FROM memory_peaks").all()
        profile = [row[0] for row in conn.exec_driver_sql("SELECT rss_peak FROM profile_points ORDER BY id").all()]
    wide = {measure: {run: value for run, m, value in peaks if m == measure} for measure in {m for _, m, _ in peaks}}
    for name in (
        "kv_bytes_peak",
        "rss_peak",
        "weights_bytes",
        "kv_bytes_used",
        "kv_bytes_reserved",
        "nvml_process_peak",
    ):
        assert [wide[name].get(run) for run in before["run_id"]] == [
            None if v is None else int(v) for v in before[name]
        ]
    assert len(profile) == 4 and all(v > 0 for v in profile)


def test_new_runs_store_their_peaks_under_the_series_names(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "r.sqlite"))
    run_id = store.create_run(sweep_id="s", model_spec="m", adapter="preset", suite="synthetic")
    store.merge_memory_peaks(run_id, {"weights_bytes": 10, "kv_bytes_allocated": 5, "rss": None})
    store.merge_memory_peaks(run_id, {"weights_bytes": 8, "kv_bytes_allocated": 3, "rss": 7})
    assert store.memory_peaks(run_id) == {
        "weights_bytes": 8,
        "kv_bytes_allocated": 5,
        "rss": 7,
    }  # a size is replaced, a peak kept
    store.close()
