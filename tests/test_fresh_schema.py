"""A brand-new SQLite file gets the migration chain's recorded result (store/fresh.py, #25): the same file as the
chain makes, schema text and order, rows and persistent pragmas; any other file still goes through Alembic."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory

from synthwatch.store import fresh
from synthwatch.store.db import DatabaseError, alembic_config, open_engine

PRAGMAS = ("user_version", "application_id", "auto_vacuum", "page_size", "encoding", "journal_mode")


def _contents(path: Path) -> dict[str, object]:
    """Everything a file holds that a schema can differ by: sqlite_master in order, every table's rows, pragmas."""
    conn = sqlite3.connect(path)
    try:
        master = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid").fetchall()
        rows = {}
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE "
                                    "'CREATE VIRTUAL%' ORDER BY rowid").fetchall():
            rows[name] = sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
        pragmas = {p: conn.execute(f"PRAGMA {p}").fetchone()[0] for p in PRAGMAS}
        return {"master": master, "rows": rows, "pragmas": pragmas}
    finally:
        conn.close()


def _chain(path: Path, revision: str = "head") -> None:
    command.upgrade(alembic_config(f"sqlite:///{path}"), revision)


def test_a_new_file_is_the_file_the_migration_chain_makes(tmp_path: Path) -> None:
    chain, new = tmp_path / "chain.db", tmp_path / "new.db"
    _chain(chain)
    open_engine(str(chain)).dispose()  # the same pragmas on open (WAL) for both
    open_engine(str(new)).dispose()
    a, b = _contents(chain), _contents(new)
    assert a["master"] == b["master"]
    assert a["rows"] == b["rows"]
    assert a["pragmas"] == b["pragmas"]
    assert len(a["master"]) > 40 and any(t == "trigger" for t, *_ in a["master"])  # the comparison saw the schema


def test_the_recorded_script_is_the_chains_result(tmp_path: Path) -> None:
    chain = tmp_path / "chain.db"
    _chain(chain)
    recorded = json.loads(fresh.SCRIPT.read_text(encoding="utf-8"))
    assert fresh.record(str(chain)) == recorded, (
        "store/fresh_sqlite.json is not what the migrations make: run `python -m synthwatch.store.fresh`")
    head = ScriptDirectory.from_config(alembic_config("sqlite:///x")).get_current_head()
    assert recorded["rows"]["alembic_version"] == [[head]]


def test_a_new_file_is_made_without_importing_alembic(tmp_path: Path) -> None:
    code = ("import sys; from synthwatch.store.db import open_engine; open_engine(sys.argv[1]).dispose(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "n.db")], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_file_with_anything_in_it_goes_through_the_chain(tmp_path: Path) -> None:
    # an older database: the chain brings it to head, its rows kept
    old = tmp_path / "old.db"
    script = ScriptDirectory.from_config(alembic_config("sqlite:///x"))
    head = script.get_current_head()
    before = script.get_revision(head).down_revision
    assert isinstance(before, str)
    _chain(old, before)
    assert not fresh.create_fresh(str(old))
    open_engine(str(old)).dispose()
    with sqlite3.connect(old) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head
    # someone's own table in an otherwise empty file: kept, and the schema added around it by the chain
    own = tmp_path / "own.db"
    with sqlite3.connect(own) as conn:
        conn.execute("CREATE TABLE mine (a)")
        conn.execute("INSERT INTO mine VALUES (1)")
    assert not fresh.create_fresh(str(own))
    open_engine(str(own)).dispose()
    with sqlite3.connect(own) as conn:
        assert conn.execute("SELECT a FROM mine").fetchall() == [(1,)]
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head
    # not a database at all: the same refusal as before, the file untouched
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database, " * 100)
    assert not fresh.create_fresh(str(junk))
    with pytest.raises(DatabaseError, match="cannot open or migrate database"):
        open_engine(str(junk))
    assert junk.read_bytes() == b"not a database, " * 100


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///x.db?mode=ro",
                                 "postgresql+psycopg://u@h/db"])
def test_only_a_plain_sqlite_file_takes_the_script(url: str) -> None:
    assert fresh.sqlite_path(url) is None
