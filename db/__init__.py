"""The results store: SQLAlchemy models, engine/session setup, Alembic migrations and queries."""

DB_ENV = "LOOPEVAL_DB"  # the results database's URL; here, not in session.py, so hints name it without sqlalchemy


class ResultsError(ValueError):
    """A results-database problem the user can fix (bad URL, not a SQLite file, newer schema, no results).

    Defined here rather than in the harness so that db/ imports only sqlalchemy and alembic; the CLI
    prints it as one line and exits 2.
    """
