"""The checked reader of stored values: what a run's JSON, number and date columns hold, or which run is damaged.

SQLite keeps whatever a hand edit (or another program) writes: invalid JSON in `runs.sampling`, text in
`runs.loops`, a text date. Read through SQLAlchemy's types, one such value raises deep inside a query and
breaks every command on the whole store. So every checked column (`CHECKED`: each JSON, number and date
column of `runs` and of the tables hanging off it, from `db.models`) is read raw here, and `value` tells a
good value from a damaged one. A damaged value makes its run a `DamagedRun`, one line naming the run, the
column and the database:

- a command that needs that one run fails with it (`require_intact`);
- a command that lists many runs shows the others and names it (`hide_damaged`: the run is left out of
  every later read of that engine, whatever query makes it).

An eval run stored with no evaluation set id (migration 0011 met a damaged value in it) is named the same way
while it cannot be given one, and given one by `restore_set_ids`, the only writer here, once it is intact.
"""

from __future__ import annotations

import functools
import json
import math
import weakref
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Engine,
    Float,
    Integer,
    Table,
    case,
    event,
    func,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.types import NullType

from db import ResultsError
from measures import DESCRIBED, Leaf, leaf_problem
from db.models import Base, Run
from db.session import display_url
from db.sets import SET_COLUMNS, run_set

# The JSON columns that hold a list of names; every other JSON column holds an object.
_LISTS = frozenset({"runs.tasks"})
# The JSON columns that hold an object of counts (loops run -> tokens).
_COUNTS = frozenset({"samples.loops_histogram"})
# What loopeval reads inside a JSON column, by key path: the kind of value each holds where present (`leaf_problem`).
_LEAVES: dict[str, Mapping[str, Leaf]] = {
    "runs.model_config": DESCRIBED,
    "runs.sampling": {
        "temperature": "number",
        "top_p": "number",
        "top_k": "integer",
        "max_new_tokens": "integer",
        "n": "integer",
        "seed": "integer",
        "stop": "list",
    },
}
# The JSON column holding a run's spec, whose per-model overrides every reader of run identity opens (`db.sets`).
_SPEC = "runs.spec"


class DamagedRun(ResultsError):
    """A run with a stored value loopeval cannot read: one line naming the run, the column and the database."""

    def __init__(self, run_id: int, column: str, problem: str, where: str) -> None:
        self.run_id, self.column, self.problem, self.where = run_id, column, problem, where
        super().__init__(
            f"run {run_id}: {column} {problem} ({where}); restore the database from a copy, or correct that value"
        )

    @property
    def skipped(self) -> str:
        """The line a command listing many runs prints for it."""
        return f"run {self.run_id} skipped: {self.column} {self.problem} ({self.where})"


def _kind(column: Column[Any]) -> str | None:
    """What a checked column holds: 'object', 'spec', 'list', 'counts', 'integer', 'number' or 'date'; None if
    unchecked."""
    name = f"{column.table.name}.{column.name}"
    if column.primary_key or column.foreign_keys:
        return None
    if isinstance(column.type, JSON):
        return "list" if name in _LISTS else "counts" if name in _COUNTS else "spec" if name == _SPEC else "object"
    if isinstance(column.type, (Integer, BigInteger)):
        return "integer"
    if isinstance(column.type, Float):
        return "number"
    return "date" if isinstance(column.type, DateTime) else None


def _run_column(table: Table) -> Column[Any] | None:
    """The column naming a row's run: `runs.id`, else `run_id`; None for a table of no run (alembic_version)."""
    return table.c.id if table.name == Run.__tablename__ else table.c.get("run_id")


def _checked(table: Table) -> list[tuple[Column[Any], str]]:
    """Each checked column of `table` with what it holds (`_kind`)."""
    return [(column, kind) for column in table.columns if (kind := _kind(column)) is not None]


# (run column, [(checked column, kind)]) per table: every value `damaged_runs` checks.
CHECKED = [
    (run_column, _checked(table))
    for table in Base.metadata.sorted_tables
    if (run_column := _run_column(table)) is not None
]


def _problem(name: str, kind: str, raw: Any) -> str | None:
    """What is wrong with a raw stored value of column `name` (table.column), which holds `kind`, or None when it
    reads as one (NULL always does)."""
    if raw is None:
        return None
    if kind in ("object", "spec", "list", "counts"):
        try:
            parsed = json.loads(raw) if isinstance(raw, (str, bytes)) else raw  # a server's driver parses JSON itself
        except ValueError:
            return "is not valid JSON"
        if parsed is None:  # JSON null, which SQLAlchemy stores for a None and reads back as one
            return None
        if kind == "list" and not (isinstance(parsed, list) and all(isinstance(item, str) for item in parsed)):
            return "is not a JSON list of names"
        if kind != "list" and not isinstance(parsed, dict):
            return "is not a JSON object"
        if kind == "counts" and not all(type(count) is int for count in parsed.values()):
            return "is not a JSON object of counts"
        overrides = (parsed.get("model_overrides") or {}) if kind == "spec" else {}
        if not (isinstance(overrides, dict) and all(isinstance(values, dict) for values in overrides.values())):
            return "holds model_overrides that are not a JSON object of objects"
        return _leaves_problem(name, parsed)
    shown = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:37] + "..."
    if kind == "integer":
        return None if type(raw) is int else f"holds {shown}, not a whole number"
    if kind == "number":
        return None if type(raw) in (int, float) and math.isfinite(raw) else f"holds {shown}, not a finite number"
    if isinstance(raw, datetime):
        return None
    try:
        datetime.fromisoformat(raw)  # what SQLAlchemy's SQLite dialect parses a stored date with
    except (TypeError, ValueError):
        return f"holds {shown}, not a date"
    return None


def _non_finite(value: Any, path: str = "") -> tuple[str, float] | None:
    """The path ("" for the value itself) and value of the first NaN or infinity inside a parsed JSON value, else
    None. Python's parser reads them, but they are not JSON: printed back (`results --json`) they make invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip("."))
        if found is not None:
            return found
    return None


def _leaves_problem(name: str, parsed: dict[str, Any] | list[Any]) -> str | None:
    """What is wrong inside a JSON value of column `name` of the right outer shape: a NaN or infinity anywhere, or a
    value of the wrong kind at a key loopeval computes with (`_LEAVES`)."""
    found = _non_finite(parsed)
    if found is not None:
        path, value = found
        written = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        return f"holds {written} at {path or 'its top'}, which JSON cannot hold"
    return leaf_problem(parsed, _LEAVES[name]) if name in _LEAVES and isinstance(parsed, dict) else None


def _suspect(column: Column[Any], kind: str, dialect: str) -> ColumnElement[bool] | None:
    """A SQL condition true for every damaged value of `column` (and maybe a few good ones, which `_problem`
    lets through), so a table of many rows is checked without reading them all; None where none can be damaged.

    On SQLite any column can hold any type (`typeof`); a server enforces its columns' types, so only a JSON
    value's shape can be wrong there.
    """
    json_type = "array" if kind == "list" else "object"
    if dialect != "sqlite":
        return func.json_typeof(column) != json_type if kind in ("object", "spec", "list", "counts") else None
    stored = {"integer": ["integer"], "number": ["integer", "real"]}.get(kind, ["text"])
    condition = func.typeof(column).not_in([*stored, "null"])
    if kind == "number":
        return condition | (func.abs(column) == float("inf"))
    if kind == "date":
        return condition | (column.is_not(None) & func.datetime(column).is_(None))
    if kind == "integer":
        return condition
    shape = func.json_type(column) != json_type
    if kind == "counts":
        each = func.json_each(column).table_valued("type")
        shape = shape | select(each.c.type).where(each.c.type != "integer").exists()
    return case((func.json_valid(column) == 1, shape), else_=column.is_not(None))  # json_type fails on invalid JSON


def damaged_runs(engine: Engine, run_ids: list[int] | None = None) -> dict[int, DamagedRun]:
    """Every run (of `run_ids`, when given) holding a value `_problem` refuses, in any checked column: run id ->
    its first damaged value. Runs are read whole (a few rows); other tables only where `_suspect` points."""
    where, dialect = display_url(engine.url), engine.dialect.name
    found: dict[int, DamagedRun] = {}
    with engine.connect() as conn:
        for run_column, checked in CHECKED:
            statement = select(run_column, *(type_coerce(column, NullType()) for column, _ in checked))
            if run_column.table.name != Run.__tablename__:
                suspects = [s for s in (_suspect(column, kind, dialect) for column, kind in checked) if s is not None]
                if not suspects:
                    continue
                statement = statement.where(or_(*suspects))
            if run_ids is not None:
                statement = statement.where(run_column.in_(run_ids))
            for run_id, *values in conn.execute(statement.order_by(run_column)):
                for (column, kind), raw in zip(checked, values):
                    name = f"{column.table.name}.{column.name}"
                    problem = run_id not in found and _problem(name, kind, raw)
                    if problem:
                        found[run_id] = DamagedRun(run_id, name, problem, where)
        for run_id in conn.scalars(_without_set(run_ids)):
            found.setdefault(run_id, DamagedRun(run_id, SET_ID, _NO_SET, where))
    return dict(sorted(found.items()))


# The column of an eval run's set id, which an eval run lacks only where migration 0011 met a damaged value.
SET_ID = "runs.set_id"
_NO_SET = (
    "is empty: a value of the run was damaged when the database was upgraded, so it was given no evaluation set; "
    "open the database where it can be written once that value is correct"
)


def _without_set(run_ids: list[int] | None) -> Select[int]:
    """The eval runs (of `run_ids`, when given) with no stored set id."""
    statement = select(Run.id).where(Run.kind == "eval", Run.set_id.is_(None))
    return statement if run_ids is None else statement.where(Run.id.in_(run_ids))


def restore_set_ids(engine: Engine) -> None:
    """Give each eval run without a set id, and otherwise intact, the id of its set (`db.sets.run_set`).

    Migration 0011 hashed every eval run's set once, except a run holding a damaged value then; corrected since
    (as its error line advises), it would be in no set and left out of every view, its other seeds shown alone.
    Called wherever a database is opened for writing (`db.session`); where it cannot be written, `damaged_runs`
    names such a run instead.
    """
    with engine.connect() as conn:
        missing = list(conn.scalars(_without_set(None)))
    if not missing:
        return
    intact = [run_id for run_id, run in damaged_runs(engine, missing).items() if run.column == SET_ID]
    if not intact:
        return
    columns = [Run.__table__.c[name] for name in SET_COLUMNS]
    with engine.begin() as conn:
        for row in conn.execute(select(Run.id, *columns).where(Run.id.in_(intact), Run.set_id.is_(None))).all():
            conn.execute(update(Run).where(Run.id == row.id).values(set_id=run_set(row._mapping).id))


def require_intact(engine: Engine, run_id: int) -> None:
    """Raise the `DamagedRun` of run `run_id` when one of its stored values is damaged (a command needing it)."""
    damaged = damaged_runs(engine, [run_id])
    if damaged:
        raise damaged[run_id]


# engine -> the `DamagedRun.skipped` line of each run it hides, by run id (`hide_damaged`)
_HIDDEN: weakref.WeakKeyDictionary[Engine, dict[int, str]] = weakref.WeakKeyDictionary()


def hide_damaged(engine: Engine) -> list[str]:
    """Leave the damaged runs out of every later read through `engine`; one `DamagedRun.skipped` line for each run
    newly left out. Called again (a served app, when a value is damaged while it runs), it adds the runs damaged since.

    Each new connection gets a temporary view over each table of runs, under the table's own name, without
    the hidden runs' rows; both SQLite and Postgres look a name up among temporary objects first, so every
    query, the ORM's included, reads around them without knowing. Only for an engine that does not write
    (a view cannot be written through).
    """
    damaged = damaged_runs(engine)  # through the views already made: runs hidden before stay hidden
    if not damaged:
        return []
    if engine not in _HIDDEN:
        _HIDDEN[engine] = {}
        event.listen(engine, "connect", functools.partial(_views, _HIDDEN[engine], engine.dialect.name == "sqlite"))
    _HIDDEN[engine].update((run_id, run.skipped) for run_id, run in damaged.items())
    engine.dispose()  # connections opened before have not got these runs' views
    return [run.skipped for run in damaged.values()]


def hidden(engine: Engine) -> list[str]:
    """The `DamagedRun.skipped` line of every run `hide_damaged` left out of `engine`'s reads, by run id."""
    return [line for _, line in sorted(_HIDDEN.get(engine, {}).items())]


def _views(runs: dict[int, str], sqlite: bool, dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    """On a new connection: each table of runs shadowed by a temporary view of itself without `runs`."""
    ids = ", ".join(str(int(run_id)) for run_id in runs)
    cursor = dbapi_connection.cursor()
    schema = "main"
    if not sqlite:
        cursor.execute("SELECT current_schema()")
        row = cursor.fetchone()
        assert row is not None  # a SELECT of one value returns one row
        schema = row[0]
    for run_column, _ in CHECKED:
        table = run_column.table.name
        cursor.execute(
            f'CREATE TEMPORARY VIEW "{table}" AS SELECT * FROM "{schema}"."{table}" '
            f'WHERE "{run_column.name}" NOT IN ({ids})'
        )
    cursor.close()
    if not sqlite:
        dbapi_connection.commit()
