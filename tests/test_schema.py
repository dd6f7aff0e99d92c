"""The models and the migrations describe the same schema; opening a database migrates it."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlmodel import SQLModel

from synthwatch.store import models  # noqa: F401
from synthwatch.store.db import open_engine, resolve_url


def _diff(url: str) -> list:
    eng = create_engine(url)
    with eng.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": _include})
        diff = compare_metadata(ctx, SQLModel.metadata)
    eng.dispose()
    return diff


def _include(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    if type_ == "index" and name == "ix_record_fts":  # PostgreSQL-only search index (0003_pg_search)
        return False
    return not (type_ == "table" and name and (name.startswith("record_fts") or name.startswith("sqlite_")))


def test_models_and_migrations_agree(tmp_path: Path) -> None:
    engine = open_engine(str(tmp_path / "a.db"))
    engine.dispose()
    assert _diff(resolve_url(str(tmp_path / "a.db"))) == []


def test_open_applies_migrations_and_sets_wal(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    engine = open_engine(str(path))
    assert path.exists()
    names = set(inspect(engine).get_table_names())
    assert {"run", "record", "series", "control_event", "worker", "alarm", "flag", "alembic_version"} <= names
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 1000
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    engine.dispose()


def test_env_var_selects_database(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SYNTHWATCH_DB", str(tmp_path / "env.db"))
    assert resolve_url(None) == "sqlite:///" + str(tmp_path / "env.db")
    assert resolve_url("postgresql://u:p@127.0.0.1/x").startswith("postgresql+psycopg://")


def test_models_and_migrations_agree_on_postgresql(pg_server) -> None:  # type: ignore[no-untyped-def]
    db = pg_server.new_database()
    open_engine(db).dispose()
    assert _diff(resolve_url(db)) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_open_items_migration_backfills_earlier_runs(backend: str, tmp_path: Path, request) -> None:  # type: ignore[no-untyped-def]
    """A database made before open items: each (run, check) that had an alarm gets an open item (#26)."""
    from alembic import command

    from synthwatch.store.db import alembic_config

    db = str(tmp_path / "old.db") if backend == "sqlite" else request.getfixturevalue("pg_server").new_database()
    url = resolve_url(db)
    command.upgrade(alembic_config(url), "0012_bigint_tokens")  # the revision before open items
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO run (id, name, kind, status, desired, config_json, expects_reasoning, created_at,"
                          " updated_at, total, n_pending, n_in_flight, n_ok, n_error, n_timeout, n_cancelled,"
                          " concurrency) VALUES (1, 'old', 'generate', 'completed', 'run', '{}', true, 1, 1, 5, 0, 0,"
                          " 5, 0, 0, 0, 1)"))
        for aid, rule, t, count in ((1, "empty_reasoning", 10.0, 3), (2, "empty_reasoning", 20.0, 4),
                                    (3, "truncated", 15.0, 1)):
            conn.execute(text("INSERT INTO alarm (id, run_id, rule, severity, title, message, count, raised_at,"
                              " updated_at, active, auto_paused) VALUES (:i, 1, :rule, 'error', 't', 'm', :c, :t, :t,"
                              " false, false)"), {"i": aid, "rule": rule, "t": t, "c": count})
    command.upgrade(alembic_config(url), "head")
    with eng.connect() as conn:
        rows = conn.execute(text("SELECT check_name, alarm_id, state, opened_at, n_records FROM open_item"
                                 " ORDER BY check_name")).all()
    eng.dispose()
    assert [tuple(r) for r in rows] == [("empty_reasoning", 1, "open", 10.0, 4), ("truncated", 3, "open", 15.0, 1)]
