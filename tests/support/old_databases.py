"""Results files as an older loopeval left them, for the migration tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import Connection, Engine, create_engine, text

from db.session import alembic_config
from db.sets import run_key, run_set, set_label


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
            " ?, 0, '{}', '{}', 'finished', '2026-11-30 00:00:00')",
            (model, tasks, sampling),
        )
    engine.dispose()


def older_run_key(sampling: dict[str, Any], model: str = "m") -> str:
    """The identity (`run_key`) of the run `older_database` stores with `sampling` as JSON: what it must keep through
    every later migration."""
    columns = dict(model_spec=model, loops=None, suite="synthetic", tasks=[], limit=None, sampling=sampling)
    return run_key(columns | dict(data_fingerprint=None, seed=0, spec={}))


# Eval runs of several evaluation sets as an older loopeval stored them, plus a profile (no set): what migration 0011
# gives a stored set id. The first two differ only in their seed, so they are one set.
_SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 4, "stop": ["\n", "Q:"]}
SET_RUNS = (
    dict(
        kind="eval",
        suite="synthetic",
        tasks=["chain4", "chain3"],
        limit=50,
        sampling=_SAMPLING | {"seed": 0},
        data_fingerprint="ab" * 32,
    ),
    dict(
        kind="eval",
        suite="synthetic",
        tasks=["chain3", "chain4"],
        limit=50,
        sampling=_SAMPLING | {"seed": 3},
        data_fingerprint="ab" * 32,
    ),
    dict(
        kind="eval",
        suite="paper",
        tasks=["aime24", "mmlu_redux:anatomy"],
        limit=None,
        sampling={"n": 1, "temperature": 0.6},
        data_fingerprint=None,
    ),
    dict(kind="eval", suite="synthetic", tasks=[], limit=None, sampling={}, data_fingerprint=None),
    dict(kind="profile", suite="profile", tasks=[], limit=None, sampling={}, data_fingerprint=None),
)


def add_set_runs(conn: Connection) -> None:
    """`SET_RUNS` written as an older loopeval (schema 0004 to 0010) wrote them, on SQLite or Postgres."""
    conn.execute(
        text(
            'INSERT INTO runs (sweep_id, kind, model_spec, adapter, model_config, suite, tasks, "limit", sampling,'
            " data_fingerprint, seed, versions, host, status, started_at) VALUES ('old', :kind, 'm', 'preset', '{}',"
            " :suite, :tasks, :limit, :sampling, :data_fingerprint, :seed, '{}', '{}', 'finished', '2026-12-01 00:00:00')"
        ),
        [
            run
            | {
                "tasks": json.dumps(run["tasks"]),
                "sampling": json.dumps(run["sampling"]),
                "seed": run["sampling"].get("seed", 0),
            }
            for run in SET_RUNS
        ],
    )


def sets_read_before(engine: Engine) -> dict[int, tuple[str, str]]:
    """Eval run id -> (set id, set label), as readers made them before migration 0011: hashed from the set's columns
    on every read (`db.sets.run_set`)."""
    with engine.connect() as conn:
        rows = (
            conn.execute(
                text("SELECT id, suite, tasks, \"limit\", sampling, data_fingerprint FROM runs WHERE kind = 'eval'")
            )
            .mappings()
            .all()
        )
    sets = {
        row["id"]: run_set({**row, "tasks": _json(row["tasks"]), "sampling": _json(row["sampling"])}) for row in rows
    }
    return {run_id: (evaluation.id, set_label(evaluation.id, evaluation)) for run_id, evaluation in sets.items()}


def _json(raw: Any) -> Any:
    """A JSON column read raw: text on SQLite, already parsed by a server's driver."""
    return json.loads(raw) if isinstance(raw, str) else raw
