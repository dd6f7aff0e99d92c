"""Alembic environment: SQLModel metadata, batch mode for SQLite, URL passed in by synthwatch.db."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool
from sqlmodel import SQLModel, create_engine

from synthwatch.store import models  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    # Full-text search tables are created by hand-written SQL (FTS5 / tsvector), not from models.
    if type_ == "table" and name and (name.startswith("record_fts") or name.startswith("sqlite_")):
        return False
    return True


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        compare_type=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url
    connectable = config.attributes.get("connection")
    if connectable is None:
        engine = create_engine(url, poolclass=pool.NullPool)
        with engine.connect() as connection:
            _run(connection, url)
        engine.dispose()
    else:
        _run(connectable, url)


def _run(connection, url: str) -> None:  # type: ignore[no-untyped-def]
    if url.startswith("postgresql"):
        # Two processes opening one database at once must not both run the DDL.
        connection.exec_driver_sql("SELECT pg_advisory_lock(727274)")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()
    if url.startswith("postgresql"):
        connection.exec_driver_sql("SELECT pg_advisory_unlock(727274)")
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
