"""Building the SQLite full-text index (record_fts) outside the worker.

Whoever writes a record's text queues its id (:func:`enqueue`, in the same transaction; migration
0004_fts_queue says why there is no trigger for it): tokenizing kilobytes of reasoning cost the worker
0.3-3 ms per record inside its write transaction. Here the queue is drained in short write transactions
(each bounded in time, so a worker waiting for the write lock waits at most that long):

- ``serve`` drains it in the background (:class:`BackgroundIndexer`);
- a search drains it first, for a bounded time (:func:`catch_up`), then reports what is still queued, so a
  search never silently misses records.

PostgreSQL needs none of this: its GIN index is maintained by the server (0003_pg_search).
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import queue as store

log = logging.getLogger(__name__)

_HAS_TEXT = "(r.reasoning IS NOT NULL OR r.content IS NOT NULL)"
_FIRST = "SELECT record_id FROM record_fts_queue ORDER BY record_id LIMIT :n"
# an id already indexed is skipped: its text was rewritten without unindex(), and indexing it twice would
# corrupt the index (search_index.rebuild() repairs that case)
_INSERT = text(
    "INSERT INTO record_fts(rowid, prompt_json, reasoning, content)"
    f" SELECT r.id, r.prompt_json, r.reasoning, r.content FROM record r WHERE r.id IN ({_FIRST}) AND {_HAS_TEXT}"
    " AND r.id NOT IN (SELECT id FROM record_fts_docsize)"
)
_ENQUEUE = "INSERT OR IGNORE INTO record_fts_queue(record_id) VALUES ({mark})"
_DEQUEUE = text(f"DELETE FROM record_fts_queue WHERE record_id IN ({_FIRST})")


def applies(conn_or_engine: Connection | Engine) -> bool:
    return conn_or_engine.dialect.name == "sqlite"


def enqueue(conn: Connection, ids: list[int]) -> None:
    """Queue records whose text was just written (inside the writer's transaction; SQLite only).

    Goes through the driver directly: this runs in the worker's hot path."""
    if ids and applies(conn):
        conn.exec_driver_sql(_ENQUEUE.format(mark="?"), [(i,) for i in ids])


def unindex(conn: Connection, ids: list[int]) -> None:
    """Before rewriting the text of finished records: take the indexed ones out of the index (it can only
    delete an entry given the text it indexed), then write, then :func:`enqueue` them."""
    if not ids or not applies(conn):
        return
    for marks in store.int_lists(ids):
        conn.execute(text(
            "INSERT INTO record_fts(record_fts, rowid, prompt_json, reasoning, content)"
            f" SELECT 'delete', r.id, r.prompt_json, r.reasoning, r.content FROM record r WHERE r.id IN ({marks})"
            # EXISTS, not IN (SELECT id ...): IN built the list of every indexed record for each call (90-160 ms
            # at 100,000 indexed records, most of a 100,000-record re-derive); EXISTS is one lookup per row
            f" AND {_HAS_TEXT} AND EXISTS (SELECT 1 FROM record_fts_docsize d WHERE d.id = r.id)"))
        conn.execute(text(f"DELETE FROM record_fts_queue WHERE record_id IN ({marks})"))


def backlog(conn: Connection, limit: int = 1_000_000) -> int:
    """Finished records not yet searchable (counting stops at ``limit``)."""
    if not applies(conn):
        return 0
    return int(conn.execute(text("SELECT count(*) FROM (SELECT 1 FROM record_fts_queue LIMIT :n)"),
                            {"n": limit}).scalar_one())


def index_some(engine: Engine, lock_ms: float = 100.0) -> tuple[int, bool]:
    """One write transaction of at most ~lock_ms: index queued records in id order.

    Returns (records dequeued, whether the queue is now empty). Both statements select the same first ids:
    nothing else can write between them, the transaction holds SQLite's write lock.
    """
    done = 0
    batch = 8
    deadline = time.perf_counter() + lock_ms / 1000
    with engine.connect() as conn:
        # a read first: an empty queue (the usual case for a search, and for the background indexer between
        # bursts) must not take the write lock the workers need
        if conn.execute(text("SELECT 1 FROM record_fts_queue LIMIT 1")).first() is None:
            return 0, True
        conn.rollback()
    with engine.connect() as conn, store.write_begin(conn):
        while True:
            t = time.perf_counter()
            conn.execute(_INSERT, {"n": batch})
            n = conn.execute(_DEQUEUE, {"n": batch}).rowcount
            done += n
            if n < batch:
                return done, True
            now = time.perf_counter()
            if now >= deadline:
                return done, False
            # aim the next batch at the time left; records vary from a line to 8,000 tokens
            per = (now - t) / n
            batch = int(max(1, min(batch * 4, (deadline - now) / max(per, 1e-6))))


def catch_up(engine: Engine, budget_ms: float = 300.0, lock_ms: float = 100.0) -> bool:
    """Drain the queue for up to ~budget_ms in transactions of ~lock_ms; True when it is empty."""
    if not applies(engine):
        return True
    if budget_ms <= 0:
        return False  # the caller counts what is queued
    end = time.perf_counter() + budget_ms / 1000
    while True:
        _, empty = index_some(engine, lock_ms=min(lock_ms, max(1.0, (end - time.perf_counter()) * 1000)))
        if empty or time.perf_counter() >= end:
            return empty


def rebuild(conn: Connection) -> None:
    """Index every finished record from scratch (inside the caller's write transaction)."""
    conn.execute(text("INSERT INTO record_fts(record_fts) VALUES ('delete-all')"))
    conn.execute(text("DELETE FROM record_fts_queue"))
    conn.execute(text("INSERT INTO record_fts(rowid, prompt_json, reasoning, content)"
                      f" SELECT r.id, r.prompt_json, r.reasoning, r.content FROM record r WHERE {_HAS_TEXT}"))


class BackgroundIndexer:
    """A daemon thread that drains the queue while there is one; idle checks every ``interval_ms``."""

    def __init__(self, engine: Engine, interval_ms: int = 1000, lock_ms: float = 100.0) -> None:
        self.engine = engine
        self.interval_s = interval_ms / 1000
        self.lock_ms = lock_ms
        self.indexed = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="synthwatch-search-index", daemon=True)

    def start(self) -> BackgroundIndexer:
        if applies(self.engine):
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                n, empty = index_some(self.engine, self.lock_ms)
                self.indexed += n
                self.error = None
            except DBAPIError as exc:  # busy, disk full, a database from before 0004: try again later
                empty = True
                msg = str(getattr(exc, "orig", exc))
                if msg != self.error:
                    log.warning("search index: %s", msg)
                self.error = msg
            # between batches, leave the write lock to the workers for a moment
            self._stop.wait(self.interval_s if empty else self.lock_ms / 1000)
