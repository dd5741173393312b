"""Results files as an older loopeval left them, for the migration tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import create_engine

from db.session import alembic_config


def older_database(path: Path, revision: str, model: str = "m", tasks: str = "[]", sampling: str = "{}") -> None:
    """A SQLite file at schema `revision` holding one finished eval run, as an older loopeval wrote it."""
    engine = create_engine(f"sqlite:///{path}")
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        conn.exec_driver_sql(
            "INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks, sampling, seed,"
            " versions, host, status, started_at) VALUES ('old', 'eval', ?, 'preset', '{}', 'synthetic', ?,"
            " ?, 0, '{}', '{}', 'finished', '2026-11-30 00:00:00')", (model, tasks, sampling)
        )
    engine.dispose()
