"""The models and the migrations describe the same schema; opening a database migrates it."""

from __future__ import annotations

from pathlib import Path

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
