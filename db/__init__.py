"""The results store: SQLAlchemy models, engine/session setup, Alembic migrations and queries."""
