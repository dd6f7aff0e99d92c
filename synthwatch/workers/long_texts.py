"""Long texts go into the store in pieces (#39): a 60 MB answer costs the worker about twice its size, not three times.

Writing a text through the driver holds it three times at once: the worker's string and two copies the driver
makes (SQLite: its copy of the bound value and the row built from it; psycopg: the encoded parameter and libpq's
message). So a reasoning or a content longer than ``long_text_spool_chars`` (docs/settings.md) is spooled, once the
flush's checks have read it, to an anonymous temporary file (beside the database for SQLite), in 1 MiB pieces, and
the worker drops its string. Inside the flush's transaction the record's row is written with that field empty,
then the field is filled from the spool a piece at a time:

- SQLite: the field is given a placeholder text of the same byte length (SQLite's ``printf``: the row is built
  once, with no string of ours alive) and the spooled bytes are written over it through SQLite's incremental blob
  I/O. Building the row still takes SQLite two copies of the placeholder, with no string of ours alive.
- PostgreSQL: the pieces go into a temporary table of the session, and one UPDATE joins them on the server
  (``string_agg`` in their order); the worker holds one piece at a time.

The stored value is the same text a plain UPDATE would have stored (tests/test_long_texts.py reads it back on both
backends). Measured in docs/limits.md: ~2x a 60 MB reply, streamed or not, where it was 3x: what reading the
reply took (its text and the bytes or pieces it came from); the allocator settings that return such texts' memory
at once are in workers/gc_tuning.py.

A spool that cannot be written (a full disk) keeps the text in memory and the plain path writes it: nothing is
lost, only the memory saving. A retried flush writes the same spool again; the file goes when its outcome is
written (or the process ends: the file has no name on disk).
"""

from __future__ import annotations

import codecs
import logging
import tempfile
from pathlib import Path
from typing import IO, Any

from sqlalchemy.engine import Connection, Engine

from .gc_tuning import release_freed_memory
from .series import record_columns

log = logging.getLogger("synthwatch.writer")

FIELDS = ("reasoning", "content")
PIECE_CHARS = 1 << 20  # characters encoded at a time (at most 4 MiB of UTF-8 alive while spooling)
PIECE_BYTES = 1 << 20  # bytes read back and written into the row at a time


class LongText:
    """One spooled field: its UTF-8 bytes in an anonymous file."""

    __slots__ = ("file", "n_bytes")

    def __init__(self, text: str, spool_dir: str | None) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="synthwatch-text-", dir=spool_dir)
        try:
            for i in range(0, len(text), PIECE_CHARS):
                # strict: a text the driver would refuse (a lone surrogate) is not spooled, and is refused as before
                self.file.write(text[i: i + PIECE_CHARS].encode())
            self.file.flush()
            self.n_bytes = self.file.tell()
        except BaseException:
            self.file.close()
            raise

    def write_into(self, conn: Connection, record_id: int, column: str) -> None:
        """Give the stored row's ``column`` this text, a piece at a time."""
        if column not in FIELDS:  # a column name goes into SQL text below: only ours
            raise ValueError(f"not a long-text column: {column!r}")
        if conn.dialect.name == "sqlite":
            self._into_sqlite(conn, record_id, column)
        else:
            self._into_postgresql(conn, record_id, column)

    def _into_sqlite(self, conn: Connection, record_id: int, column: str) -> None:
        """A placeholder of the text's byte length, then the bytes over it through the incremental blob I/O."""
        conn.exec_driver_sql(f"UPDATE record SET {column} = printf('%.*c', ?, ' ') WHERE id = ?",
                             (self.n_bytes, record_id))
        raw = conn.connection.driver_connection
        self.file.seek(0)
        with raw.blobopen("record", column, record_id) as blob:  # type: ignore[union-attr]
            while piece := self.file.read(PIECE_BYTES):
                blob.write(piece)

    def _into_postgresql(self, conn: Connection, record_id: int, column: str) -> None:
        """The pieces into the session's temporary table, joined by the server in one UPDATE."""
        conn.exec_driver_sql(_PG_PIECES)
        decode = codecs.getincrementaldecoder("utf-8")().decode  # a piece may end inside a character
        self.file.seek(0)
        n = 0
        while True:
            raw = self.file.read(PIECE_BYTES)
            piece = decode(raw, final=not raw)
            if piece:
                conn.exec_driver_sql("INSERT INTO synthwatch_text_piece (n, piece) VALUES (%s, %s)", (n, piece))
                n += 1
            if not raw:
                break
        conn.exec_driver_sql(
            f"UPDATE record SET {column} = (SELECT coalesce(string_agg(piece, '' ORDER BY n), '')"
            " FROM synthwatch_text_piece) WHERE id = %s", (record_id,))
        # the next long text of this transaction starts empty (a failed fill's pieces go with its savepoint)
        conn.exec_driver_sql("DELETE FROM synthwatch_text_piece")

    def close(self) -> None:
        self.file.close()


# the session's own table (no other connection sees it); its rows go at the end of the transaction whatever happens
_PG_PIECES = ("CREATE TEMPORARY TABLE IF NOT EXISTS synthwatch_text_piece (n integer PRIMARY KEY, piece text NOT NULL)"
              " ON COMMIT DELETE ROWS")


def spool_dir_of(engine: Engine) -> str | None:
    """The database's folder (a spool there is on the same disk as the text's destination); None: the system's."""
    if engine.dialect.name != "sqlite":
        return None
    db = engine.url.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return str(Path(db).resolve().parent)


def spool(outcomes: list[Any], over_chars: int, spool_dir: str | None) -> int:
    """Spool the long fields of finished outcomes (after their checks read them); the number spooled.

    The outcome keeps its record's columns (``columns``), with a :class:`LongText` for each long field, and lets
    go of its parsed reply (``extracted``), the only other holder of the text once the record is submitted."""
    n = 0
    if over_chars <= 0:
        return 0
    for o in outcomes:
        ex = o.extracted
        if ex is None or o.columns is not None or o.status == "pending":
            continue
        if len(ex.reasoning) <= over_chars and len(ex.content) <= over_chars:
            continue
        spooled: list[LongText] = []
        try:
            cols = record_columns(ex)
            for f in FIELDS:
                v = cols[f]
                if isinstance(v, str) and len(v) > over_chars:
                    spooled.append(LongText(v, spool_dir))
                    cols[f] = spooled[-1]
        except Exception as exc:  # a full disk: this record keeps its text in memory and is written as before
            for lt in spooled:
                lt.close()
            log.warning("record %s: its long text could not be spooled (%s: %s); written from memory",
                        o.record_id, type(exc).__name__, exc)
            continue
        o.columns, o.extracted = cols, None
        n += len(spooled)
    if n:  # the texts' memory goes back to the system before SQLite builds their rows (2 MB of 60, measured)
        release_freed_memory()
    return n


def long_fields(row: dict[str, Any]) -> list[tuple[str, LongText]]:
    """The row's spooled fields."""
    return [(f, row[f]) for f in FIELDS if isinstance(row.get(f), LongText)]


def bound(row: dict[str, Any]) -> dict[str, Any]:
    """The row to bind: its spooled fields empty (fill writes them); the row itself when none is spooled."""
    long = long_fields(row)
    return {**row, **dict.fromkeys(f for f, _ in long)} if long else row


def fill(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Write the spooled fields of ``rows`` (already updated with those fields empty)."""
    for r in rows:
        for f, lt in long_fields(r):
            lt.write_into(conn, r["id"], f)


def release(outcomes: list[Any]) -> None:
    """Close the spools of written outcomes (their files go with them)."""
    for o in outcomes:
        cols = o.columns
        if cols is not None:
            for f in FIELDS:
                v = cols.get(f)
                if isinstance(v, LongText):
                    v.close()
