"""Opening the database: URL resolution, SQLite pragmas, and migrations on open.

Any command that opens the database calls :func:`open_engine`, which applies pending Alembic
migrations first, so the schema is always the migrations' schema (a brand-new SQLite file gets their recorded
result at once: store/fresh.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# sqlalchemy's create_engine, not sqlmodel's re-export of it: importing sqlmodel cost the worker's process its ORM (#39)
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url

from ..settings import get_settings
from .fresh import create_fresh, sqlite_path

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
_migrated: set[str] = set()
_migrate_lock = threading.Lock()


class DatabaseError(Exception):
    """A database that cannot be opened or migrated; the message names the URL."""


def resolve_url(db: str | None = None) -> str:
    """A SQLite path or any SQLAlchemy URL -> a SQLAlchemy URL string.

    ``postgresql://`` means psycopg 3 (the driver we ship in the ``postgres`` extra).
    """
    raw = (db or os.environ.get("SYNTHWATCH_DB") or get_settings().db).strip()
    if not raw:
        raise DatabaseError("empty database URL")
    if "://" not in raw:
        if raw == ":memory:":
            raise DatabaseError("an in-memory SQLite database cannot be shared between worker and dashboard")
        return "sqlite:///" + str(Path(raw).expanduser().resolve())
    if raw.startswith("postgresql://") or raw.startswith("postgres://"):
        raw = "postgresql+psycopg://" + raw.split("://", 1)[1]
    try:
        make_url(raw)
    except Exception as exc:  # sqlalchemy raises ArgumentError with a terse text
        raise DatabaseError(f"not a database URL or path: {raw!r} ({exc})") from exc
    return raw


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _sqlite_pragmas(readonly: bool, busy_timeout_ms: int):  # type: ignore[no-untyped-def]
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # pysqlite's implicit BEGIN breaks BEGIN IMMEDIATE; transactions are begun explicitly.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        if not readonly:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        else:
            cur.execute("PRAGMA query_only=1")
        cur.close()

    return on_connect


def _sqlite_begin(conn: Any) -> None:
    # Writers ask for BEGIN IMMEDIATE (see store.write_begin): the lock is taken up front.
    conn.exec_driver_sql(conn.get_execution_options().get("sqlite_begin", "BEGIN"))


def make_engine(url: str, *, readonly: bool = False, pool_size: int = 5) -> Engine:
    settings = get_settings()
    if is_sqlite(url):
        path = url.split("sqlite:///", 1)[-1]
        if path and not readonly:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas(readonly, settings.busy_timeout_ms))
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "pool_size": pool_size, "max_overflow": 10}
    if readonly:
        kwargs["execution_options"] = {"postgresql_readonly": True}
    engine = create_engine(url, **kwargs)
    if make_url(url).get_driver_name() == "psycopg":
        event.listen(engine, "connect", _pg_numbers)
    return engine


def _pg_numbers(dbapi_conn: Any, _record: Any) -> None:
    """NUMERIC results as int (or float) on PostgreSQL, as SQLite gives them: SUM over a BIGINT column (the token
    counts, migration 0012_bigint_tokens) is NUMERIC there, which psycopg reads as Decimal, and readers mix it with floats."""
    from psycopg.types.numeric import NumericLoader

    class NumberLoader(NumericLoader):
        def load(self, data: Any) -> Any:
            d = super().load(data)
            return int(d) if d.is_finite() and d == d.to_integral_value() else float(d)

    dbapi_conn.adapters.register_loader("numeric", NumberLoader)


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def migrate(url: str) -> None:
    """Bring the schema to head (idempotent, once per process per URL)."""
    with _migrate_lock:
        if url in _migrated:
            return
        try:
            with _migration_lock(url):
                # a new SQLite file gets the chain's recorded result in one transaction (fresh.py; #25)
                path = sqlite_path(url)
                if path is None or not create_fresh(path):
                    from alembic import command

                    command.upgrade(alembic_config(url), "head")
        except Exception as exc:
            raise DatabaseError(f"cannot open or migrate database {safe_url(url)}: {exc}") from exc
        _migrated.add(url)


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    """One migrating process at a time per SQLite file (a worker and the dashboard often start together).

    Alembic runs SQLite DDL outside a transaction, so two processes would both create the tables.
    PostgreSQL takes an advisory lock in migrations/env.py instead."""
    if not is_sqlite(url):
        yield
        return
    path = url.split("sqlite:///", 1)[-1]
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    # the lock is on the database's folder, not on a file of its own: a lock file was left beside every database
    # (#37), and removing it after use would let a waiting process and a new one lock two different files
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def safe_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<database>"


def open_engine(db: str | None = None, *, readonly: bool = False) -> Engine:
    url = resolve_url(db)
    migrate(url)
    return make_engine(url, readonly=readonly)
