"""Alembic environment: runs on the connection `db.session` hands over (config.attributes).

There is no alembic.ini: `db.session.alembic_config()` builds the config in code. For a developer
generating a new revision, a URL may be given in `LOOPEVAL_DB` instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from db.models import Base
from db.session import resolve_db_url

target_metadata = Base.metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:  # `alembic revision --autogenerate` from the command line
        with create_engine(resolve_db_url()).connect() as conn:
            _run(conn)
            conn.commit()
    else:
        _run(connection)


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds tables instead.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
