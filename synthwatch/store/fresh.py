"""A brand-new SQLite database made from one recorded script instead of the whole migration chain (#25).

Applying the migrations to an empty file cost ~0.25 CPU-s plus ~0.08 s importing Alembic, on every first
`synthwatch run` of a database. ``fresh_sqlite.json`` holds what the chain leaves in a new file: every schema
statement as SQLite stored it (``sqlite_master.sql``, in creation order, so triggers fire in the same order) and every
row the migrations wrote (``alembic_version`` among them, so Alembic sees the file at head). It is applied in one
transaction only to a file with no schema at all; any other file goes through Alembic as before.

tests/test_fresh_schema.py proves the two paths give the same file (schema text and order, rows, persistent
pragmas) and that the recorded script matches the chain: after adding a migration, regenerate it with
``python -m synthwatch.store.fresh`` (the test says so). PostgreSQL always migrates.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("fresh_sqlite.json")


def sqlite_path(url: str) -> str | None:
    """The file of a plain ``sqlite:///path`` URL; None for memory databases, URI options or other URLs."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):]
    return None if not path or "?" in path or path == ":memory:" else path


def create_fresh(path: str) -> bool:
    """Write the recorded schema into ``path`` if it holds no schema yet (a missing or empty file); True if it did.

    Called under the migration lock (store/db.py); the emptiness is checked again inside the write transaction.
    False (nothing written) when the file holds anything, is not a database, or the script is missing."""
    try:
        script = json.loads(SCRIPT.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            conn.execute("ROLLBACK")
            return False
        for stmt in script["statements"]:
            conn.execute(stmt)
        for table, rows in script["rows"].items():
            for row in rows:
                conn.execute(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(row))})', row)
        conn.execute("COMMIT")
        return True
    except sqlite3.DatabaseError:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return False
    finally:
        conn.close()


def record(path: str) -> dict[str, Any]:
    """What a migrated file holds, as the script: schema statements in creation order, then the rows of its tables.

    Objects SQLite makes by itself are left out: automatic indexes (no SQL), ``sqlite_*`` tables, and the shadow
    tables a full-text table creates (found by replaying the statements into a scratch database)."""
    src = sqlite3.connect(path)
    scratch = sqlite3.connect(":memory:")
    try:
        statements: list[str] = []
        for name, sql in src.execute(
                "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid").fetchall():
            if name.startswith("sqlite_"):
                continue
            if scratch.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone():
                continue  # made by an earlier statement (an FTS5 table's shadow tables)
            scratch.execute(sql)
            statements.append(sql)
        shadow = _shadow_tables(statements, src)
        rows: dict[str, list[list[Any]]] = {}
        for (table,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE TABLE%'"
                                    " AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid").fetchall():
            if table in shadow:
                continue
            # in insertion order (a WITHOUT ROWID table has no rowid: it is kept in its key's order anyway)
            without_rowid = "WITHOUT ROWID" in (src.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                                                            (table,)).fetchone()[0] or "").upper()
            order = "" if without_rowid else " ORDER BY rowid"
            data = [list(r) for r in src.execute(f'SELECT * FROM "{table}"{order}')]
            if data:
                rows[table] = data
        return {"statements": statements, "rows": rows}
    finally:
        src.close()
        scratch.close()


def _shadow_tables(statements: list[str], src: sqlite3.Connection) -> set[str]:
    """Tables in ``src`` that no recorded statement creates: made, and filled, by a virtual table."""
    made = {n for (n,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    recorded = set(statements)
    named = {n for (n, sql) in src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
             if sql in recorded}
    return made - named


def main() -> None:
    """Regenerate fresh_sqlite.json from the migration chain applied to an empty file."""
    import tempfile

    from alembic import command
    from alembic.config import Config

    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/chain.db"
        cfg = Config()  # as db.alembic_config (not imported: db imports this module)
        cfg.set_main_option("script_location", str(Path(__file__).parent.parent / "migrations"))
        cfg.set_main_option("sqlalchemy.url", f"sqlite:///{path}".replace("%", "%%"))
        cfg.attributes["configure_logger"] = False
        command.upgrade(cfg, "head")
        SCRIPT.write_text(json.dumps(record(path), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {SCRIPT}")  # noqa: T201


if __name__ == "__main__":
    main()
