"""Opening the results database: URL resolution, safety checks, SQLite tuning and automatic migration.

This module is the one door to the database: `open_engine()` for the writers (the run store),
`open_existing()` for readers (dashboards, reports; read-only where the file cannot be written) and `--resume`,
which never creates anything. It resolves the URL (`--db`, else `LOOPEVAL_DB`,
else `results/loopeval.sqlite` under the working directory), refuses files it must not touch
(not SQLite, unwritable, on a network filesystem, written by a newer loopeval) *before* anything
writes to them, tunes SQLite for several writers (WAL, busy timeout, `BEGIN IMMEDIATE`) and upgrades
the schema to Alembic head. Postgres is the store that several machines share: a `postgresql://`
URL uses psycopg 3 (the `postgres` extra), and writers that open a database at once take turns to
migrate it. The Alembic config is built in code so that migrations work from an installed package,
with no alembic.ini on disk.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sqlite3
import tempfile
import weakref
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection, ExceptionContext
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from db import DB_ENV, ResultsError
from db.filesystems import network_filesystem

if TYPE_CHECKING:  # for the annotation; alembic itself is imported where a migration needs it
    from alembic.config import Config

DEFAULT_DB_PATH = Path("results") / "loopeval.sqlite"
BUSY_TIMEOUT_MS = 60_000  # a writer waits this long for another process's transaction
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_SQLITE_HEADER = b"SQLite format 3\x00"
POSTGRES_DRIVER = "postgresql+psycopg"
# Key of the Postgres advisory lock that writers opening one database at once migrate under.
_MIGRATION_LOCK = zlib.crc32(b"loopeval schema migration")
# How long a server database may keep loopeval waiting, in seconds: to connect (a host that accepts the
# connection and never answers), and for one statement (a lock another session holds). A dead server in
# the middle of a statement is noticed by TCP keepalives after about four connect timeouts.
CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT = "LOOPEVAL_DB_CONNECT_TIMEOUT", 10
STATEMENT_TIMEOUT_ENV, DEFAULT_STATEMENT_TIMEOUT = "LOOPEVAL_DB_STATEMENT_TIMEOUT", 300


def resolve_db_url(url: str | None = None) -> str:
    """The database URL to use: the argument, else $LOOPEVAL_DB, else the default SQLite file.

    A plain path (no `://`) is taken as a SQLite file, so `--db runs.sqlite` works.
    """
    url = url or os.environ.get(DB_ENV) or str(DEFAULT_DB_PATH)
    if "://" not in url:
        url = f"sqlite:///{Path(url).expanduser()}"
    return url


def display_url(url: str | URL) -> str:
    """`url` as loopeval prints it: its password, in the user part or a `password=` parameter, shown as ***.

    A string that does not parse as a URL shows its scheme only, since where its password is cannot be told.
    """
    try:
        text = make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return f"{str(url).split('://')[0]}://..." if "://" in str(url) else str(url)
    return re.sub(r"(?i)(password=)[^&]*", r"\1***", text)


def engine_url(url: str) -> URL:
    """The SQLAlchemy URL to connect with: `postgres://` and `postgresql://` get the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername=POSTGRES_DRIVER)
    return parsed


def alembic_config() -> Config:
    """An Alembic `Config` pointing at the packaged migrations (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL; None for other backends and in-memory databases; ResultsError for a bad URL."""
    parsed = _parse(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _check_sqlite_header(path: Path) -> None:
    """Refuse a path that is not a file, or a file that is not SQLite (an empty file is a new database)."""
    if not path.is_file():
        raise ResultsError(f"database {path} is not a file")
    with path.open("rb") as fh:
        header = fh.read(len(_SQLITE_HEADER))
    if header and header != _SQLITE_HEADER:
        raise ResultsError(f"database {path} is not a SQLite database (left untouched)")


def _check_sqlite_file(path: Path) -> None:
    """Refuse a path loopeval cannot write, a file that is not SQLite, or one on a network filesystem; never writes it."""
    kind = network_filesystem(path)
    if kind is not None:
        raise ResultsError(
            f"database {path} is on a network filesystem ({kind}), where SQLite's locking is not safe; use a local "
            f"path, or a Postgres URL for a store shared between machines (--db postgresql://USER@HOST/DATABASE)"
        )
    if path.exists():
        _check_sqlite_header(path)
        problem = _unwritable(path)
        if problem:
            raise ResultsError(problem)
    else:
        directory = path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ResultsError(f"cannot create the database directory {directory}: a file is in the way") from None
        except OSError as exc:
            raise ResultsError(f"cannot create the database directory {directory}: {exc.strerror or exc}") from None
        # WAL keeps -wal and -shm files beside the database, so the directory must be writable too.
        if not os.access(directory, os.W_OK):
            raise ResultsError(f"database directory {directory} is not writable")


def _revision(engine: Engine, where: str) -> str | None:
    """`_revision_on` a new connection of `engine`."""
    with engine.connect() as conn:
        return _revision_on(conn, where)


def _revision_on(conn: Connection, where: str) -> str | None:
    """The loopeval schema revision of a database; None for an empty one (no tables yet).

    Refuses what is not loopeval's: a database holding another application's tables, or a revision
    this loopeval does not know (written by a newer loopeval). Reads only; on a server it runs inside
    the migration's transaction (see `_upgrade`).
    """
    from alembic.runtime.migration import MigrationContext

    heads = MigrationContext.configure(conn).get_current_heads()
    if len(heads) > 1:
        raise ResultsError(
            f"database {where} records {len(heads)} schema revisions ({', '.join(sorted(heads))}) where loopeval keeps "
            "one: it was damaged or changed by another program; restore it from a copy, or use another --db"
        )
    current = heads[0] if heads else None
    tables = sorted(set(inspect(conn).get_table_names()) - {"alembic_version"})
    if current is None and tables:
        shown = ", ".join(tables[:4]) + (", ..." if len(tables) > 4 else "")
        raise ResultsError(
            f"database {where} is not a loopeval database (it holds tables {shown}); "
            "it is left untouched: use another --db"
        )
    if current is not None and current not in _known_revisions():
        raise ResultsError(
            f"database {where} has schema revision {current}, which this loopeval does not know (head {head_revision()}): "
            "written by a newer loopeval, or not a loopeval database"
        )
    if current == head_revision():
        from db.models import Base

        missing = sorted(set(Base.metadata.tables) - set(tables))
        if missing:
            raise ResultsError(
                f"database {where} lacks table(s) {', '.join(missing)} of its schema revision {current}: "
                "it was damaged or changed by another program; restore it from a copy, or use another --db"
            )
    return current


def _readonly_engine(path: Path, where: str) -> Engine:
    """A connection to a SQLite file that cannot write it: neither the file nor anything beside it changes."""
    # Without a -wal file no process has the database open and every commit is in the main file: read it as
    # immutable, which creates no -wal and -shm beside it (a read-only folder could not hold them, and a file
    # that is then refused stays byte-identical). With one, another process may be writing: read through its
    # WAL (whose files exist already).
    # the engine's URL stays the file's own (what every message names); its connections come from the URI
    engine = create_engine(f"sqlite:///{path}", creator=functools.partial(_readonly_connection, path))
    _one_line_errors(engine, where)
    return engine


def _readonly_connection(path: Path) -> sqlite3.Connection:
    """A connection that cannot write the SQLite file `path` (`_readonly_engine`)."""
    immutable = "" if path.with_name(f"{path.name}-wal").exists() else "&immutable=1"
    uri = f"file:{quote(str(path.resolve()))}?mode=ro{immutable}"
    return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)


def _upgraded_copy(path: Path, where: str) -> Engine:
    """An engine reading a copy of the SQLite file `path`, which cannot be written and has an older schema, upgraded
    to head: the file stays as it is, and every message names it. The copy lives in a temporary folder removed with
    the engine (or at exit); a copy that cannot be made (no room there) is one ResultsError."""
    folder = Path(tempfile.mkdtemp(prefix="loopeval-upgraded-"))
    copy = folder / path.name
    try:
        source, target = _readonly_connection(path), sqlite3.connect(copy)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
    except sqlite3.Error as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ResultsError(f"{database_problem(where, exc)}: copying it to read it upgraded failed") from None
    engine = create_engine(
        f"sqlite:///{path}",
        creator=lambda: sqlite3.connect(copy, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False),
    )
    weakref.finalize(engine, shutil.rmtree, folder, ignore_errors=True)
    _one_line_errors(engine, where)
    _tune_sqlite(engine)
    _upgrade(engine)
    _restore(engine)
    return engine


def _readonly_revision(path: Path) -> str | None:
    """`_revision` of a SQLite file through a read-only connection: a refused file stays byte-identical."""
    readonly = _readonly_engine(path, str(path))
    try:
        return _revision(readonly, str(path))
    finally:
        readonly.dispose()


def _unwritable(path: Path) -> str | None:
    """Why loopeval cannot write the existing SQLite file `path` (the file, or the folder its WAL files go in), or None.

    `os.access` asks the kernel, so a read-only mount or an immutable file (`chattr +i`) says no even to root.
    """
    if not os.access(path, os.W_OK):
        return f"database {path} is not writable"
    if not os.access(path.parent, os.W_OK):  # WAL keeps -wal and -shm files beside the database
        return f"database directory {path.parent} is not writable"
    return None


def _tune_sqlite(engine: Engine) -> None:
    """WAL, busy timeout, foreign keys; and real transactions that take the write lock up front.

    `synchronous = NORMAL` is SQLite's recommended setting under WAL: commits stay atomic and the
    file cannot be corrupted, but a commit no longer waits for an fsync (only a power cut could
    roll back the last few), which is most of a batch's write time on a tiny model.

    pysqlite's own transaction handling begins lazily and would let two processes both read then
    both try to write, which SQLite resolves with an immediate "database is locked" instead of
    waiting. Disabling it and emitting `BEGIN IMMEDIATE` ourselves (SQLAlchemy's documented recipe)
    makes every writer queue behind the busy timeout, and lets migrations run in one transaction.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _upgrade(engine: Engine, where: str | None = None) -> None:
    """Bring the schema to Alembic head inside one transaction (a no-op when it is already there).

    `where` names a server database, whose revision is checked first in the same transaction. On
    Postgres, writers that open a new database at once would all create the tables and all but one
    fail; an advisory lock held to the end of the transaction makes them take turns (SQLite's
    `BEGIN IMMEDIATE` does the same there). The check must come after the lock: outside it, a writer
    could read "no revision" and then see the tables another writer has just committed.
    """
    from alembic import command

    config = alembic_config()
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
        if where is not None:
            _revision_on(conn, where)
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


def _parse(url: str) -> URL:
    try:
        parsed = engine_url(url)
        port_ok = parsed.port is None or 1 <= parsed.port <= 65535
    except (ArgumentError, ValueError):
        parsed, port_ok = None, False
    if parsed is None or not port_ok:
        raise ResultsError(
            f"--db {display_url(url)!r} is not a database URL: give sqlite:///PATH, a file path, or "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (PORT a number from 1 to 65535, an IPv6 HOST in brackets)"
        )
    return parsed


def _seconds(env: str, default: int) -> int:
    raw = os.environ.get(env)
    if raw is None:
        return default
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ResultsError(f"{env} must be a whole number of seconds >= 1, got {raw!r}")
    return int(raw)


def _server_arguments(parsed: URL) -> dict[str, Any]:
    """psycopg connection settings that bound every wait on the server (a URL's own query settings win)."""
    connect, statement = (
        _seconds(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT),
        _seconds(STATEMENT_TIMEOUT_ENV, DEFAULT_STATEMENT_TIMEOUT),
    )
    settings = {
        "connect_timeout": connect,
        "options": f"-c statement_timeout={statement * 1000}",
        "keepalives": 1,
        "keepalives_idle": connect,
        "keepalives_interval": connect,
        "keepalives_count": 3,
    }
    return {key: value for key, value in settings.items() if key not in parsed.query}


# What a driver's message means to the user: (a piece of the message, lower case) -> what to do.
_DAMAGED = "the file is damaged: restore it from a copy, or use another --db"
_SCHEMA = "part of its schema is missing: it was damaged or changed by another program; restore it from a copy, or use another --db"
_FULL = (
    "the disk is full: the write was rolled back and everything stored before it is intact; free space, then continue "
    "(`loopeval run --resume RUN_ID` for a run)"
)
_PROBLEMS = (
    ("database or disk is full", _FULL),
    ("no space left on device", _FULL),
    ("could not extend file", _FULL),
    ("database disk image is malformed", _DAMAGED),
    ("file is not a database", _DAMAGED),
    ("no such table", _SCHEMA),
    ("no such column", _SCHEMA),
    ("undefinedtable", _SCHEMA),
    ("undefinedcolumn", _SCHEMA),
    (
        "not json compliant",
        "a value to store is NaN or infinite, which standard JSON (and so Postgres) cannot hold; nothing was stored",
    ),
    (
        "statement timeout",
        f"no answer within the statement timeout (${STATEMENT_TIMEOUT_ENV}, default {DEFAULT_STATEMENT_TIMEOUT} s)",
    ),
    (
        "connection timeout expired",
        f"no answer within the connect timeout (${CONNECT_TIMEOUT_ENV}, default {DEFAULT_CONNECT_TIMEOUT} s)",
    ),
)


def database_problem(where: str, exc: BaseException) -> str:
    """One line naming the database and what went wrong, with what to do where the driver's message says."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    key = f"{type(exc).__name__} {text}".lower()
    meaning = next((meaning for needle, meaning in _PROBLEMS if needle in key), None)
    return f"database {where}: {meaning} ({text})" if meaning else f"database {where}: {text}"


def _one_line_errors(engine: Engine, where: str) -> None:
    """Every error of `engine`'s statements and connections surfaces as a ResultsError naming the database,
    which the CLI prints as one line (exit 2). Pre-ping checks are left alone: the pool handles those; so are
    Ctrl-C and SIGTERM landing inside a statement, which must stop a run as interrupted, not fail it."""

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        if not context.is_pre_ping and isinstance(context.original_exception, Exception):
            raise ResultsError(database_problem(where, context.original_exception)) from None


def _create(parsed: URL) -> Engine:
    """An engine for `parsed`: JSON without NaN or infinity (standard JSON, which Postgres requires), and on a
    server database connections checked before use (a sweep keeps them open for hours and servers drop idle
    ones) and every wait bounded (`_server_arguments`)."""
    server = parsed.get_backend_name() != "sqlite"
    arguments = _server_arguments(parsed) if parsed.get_backend_name() == "postgresql" else {}
    try:
        engine = create_engine(
            parsed,
            pool_pre_ping=server,
            connect_args=arguments,
            json_serializer=functools.partial(json.dumps, allow_nan=False),
        )
    except (NoSuchModuleError, ImportError):
        extra = " (pip install 'loopeval[postgres]')" if parsed.get_backend_name() == "postgresql" else ""
        raise ResultsError(f"--db {parsed.drivername!r}: no SQLAlchemy driver installed for it{extra}") from None
    _one_line_errors(engine, display_url(parsed))
    return engine


def _create_engine(url: str) -> Engine:
    engine = _create(_parse(url))
    if engine.url.get_backend_name() == "sqlite":
        _tune_sqlite(engine)
    return engine


def open_engine(url: str | None = None) -> Engine:
    """Open (creating or upgrading as needed) the results database for writing; ResultsError on anything unusable.

    Only a loopeval database, an empty one or a new file is ever written; anything else is refused
    before the first write, through a read-only connection.
    """
    url = resolve_db_url(url)
    where = display_url(_parse(url))
    path = sqlite_path(url)
    if path is not None:
        _check_sqlite_file(path)
        if path.exists() and path.stat().st_size > 0:
            _readonly_revision(path)
    engine = _create_engine(url)  # from here on every database error is a ResultsError (`_one_line_errors`)
    _upgrade(engine, where if path is None else None)
    _restore(engine)
    return engine


def _restore(engine: Engine) -> None:
    """What an upgrade could not finish on a value damaged then and corrected since (`db.stored.restore_set_ids`)."""
    from db.stored import restore_set_ids  # db.stored reads through this module: imported where it is used

    restore_set_ids(engine)


def open_existing(url: str | None = None, write: bool = False) -> Engine:
    """Open an existing loopeval database: never creates a file, a folder or a table.

    A missing SQLite file, an empty database or another application's database is one clear
    ResultsError. To `write` (`--resume`), an older loopeval schema is upgraded first (it is loopeval's own
    file) and a file loopeval cannot write is refused. To read, a SQLite file loopeval cannot write (a
    read-only mount, no write permission) is opened read-only and read as it is if its schema is current, else
    read through an upgraded copy of it (`_upgraded_copy`).
    """
    url = resolve_db_url(url)
    where = display_url(_parse(url))
    path = sqlite_path(url)
    if path is not None:
        if not path.exists():
            raise ResultsError(f"no results database at {path}; run `loopeval run` first")
        _check_sqlite_header(path)
    unwritable = _unwritable(path) if path is not None else None
    if unwritable and write:
        raise ResultsError(unwritable)
    revision = _readonly_revision(path) if path is not None else None
    if path is not None and unwritable and revision not in (None, head_revision()):
        return _upgraded_copy(path, where)
    engine = _readonly_engine(path, where) if path is not None and unwritable else _create_engine(url)
    if path is None:
        revision = _revision(engine, where)
    if revision is None:
        raise ResultsError(f"the database {where} holds no loopeval results; run `loopeval run` first")
    if revision != head_revision():
        _upgrade(engine)
    if not unwritable:
        _restore(engine)
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded rows readable after commit (the store hands plain values out)."""
    return sessionmaker(engine, expire_on_commit=False)
