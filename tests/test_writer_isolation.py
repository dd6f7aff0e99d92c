"""The writer isolates each record (#25): a record the store refuses is that record's error, the rest of its batch
commits, the writer lives on, and only transient errors are retried.

Each test runs the real writer thread on a real SQLite file and a real PostgreSQL database (``any_engine``).
The poisoned records are put into the writer directly, past capture (which now makes server values safe where they
are read, tests/test_hostile_servers.py): this is the writer's own safety net, for whatever capture misses.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from workerkit import create, make_config, records, run_row

from synthwatch.capture.reasoning import extract_response
from synthwatch.store import queue as store
from synthwatch.workers.refusals import STORE_REFUSED, is_transient
from synthwatch.workers.results import Outcome
from synthwatch.workers.writer import Writer


def _reply(i: int, **message: Any) -> dict[str, Any]:
    return {"id": f"r{i}", "object": "chat.completion", "created": 1, "model": "sim-reasoner",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "reasoning": f"think {i}", "content": f"answer {i}",
                                     **message}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}


def _deep(n: int) -> Any:
    v: Any = "bottom"
    for _ in range(n):
        v = [v]
    return v


def _setup(engine: Any, prompts: Any, n: int, **writer_kw: Any) -> tuple[int, Writer, list[store.Claimed]]:
    run_id = create(engine, make_config("http://127.0.0.1:9/v1", prompts(n)))
    with engine.connect() as conn, store.write_begin(conn):
        worker_id = store.register_worker(conn, run_id)
    # a long flush interval: everything submitted below lands in one batch
    writer = Writer(engine, run_id, worker_id, flush_interval_s=0.5, **writer_kw)
    writer.start()
    claimed, why = writer.claim(n).result(30)
    assert len(claimed) == n and why == ""
    return run_id, writer, claimed


def _ok(c: store.Claimed, ex: Any, **kw: Any) -> Outcome:
    return Outcome(c.id, c.idx, "ok", c.messages, extracted=ex, endpoint="e", latency_s=0.1, finished_at=time.time(),
                   **kw)


def test_a_poisoned_record_is_its_own_error_and_its_batch_commits(any_engine: Any, prompts: Any,
                                                                  caplog: Any) -> None:
    run_id, writer, claimed = _setup(any_engine, prompts, 6)
    by_idx = {c.idx: c for c in claimed}
    try:
        with caplog.at_level(logging.WARNING, "synthwatch.writer"):
            for c in claimed:
                ex = extract_response(_reply(c.idx), "auto")
                if c.idx == 1:  # the store refuses it: an integer no column holds (SQLite OverflowError, PG numeric)
                    writer.submit(_ok(c, ex, n_chunks=2**70))
                elif c.idx == 3:  # JSON refuses it: a field 1,000 deep reached the row past capture
                    ex.extra = {"top": {"deep": _deep(1000)}}
                    writer.submit(_ok(c, ex))
                elif c.idx == 4:  # NUL and a count no 4-byte column holds: stored safely, not refused
                    writer.submit(_ok(c, extract_response(
                        {**_reply(c.idx, content="a\u0000b"), "usage": {"prompt_tokens": 3_000_000_000}}, "auto")))
                else:
                    writer.submit(_ok(c, ex))
            deadline = time.monotonic() + 30
            while writer.written < 6 and time.monotonic() < deadline and writer.alive:
                time.sleep(0.05)
            assert writer.alive, "the writer thread died"
    finally:
        writer.stop()
    assert writer.error is None
    assert writer._crashed is None
    recs = {r["idx"]: r for r in records(any_engine, run_id)}
    assert [recs[i]["status"] for i in range(6)] == ["ok", "error", "ok", "error", "ok", "ok"]
    for i in (0, 2, 5):
        assert recs[i]["content"] == f"answer {i}" and recs[i]["worker_id"] is None
    for i, what in ((1, "integer out of the column's range"), (3, "cannot be serialised as JSON")):
        r = recs[i]
        assert r["error_kind"] == STORE_REFUSED and what in r["error"], r["error"]
        assert r["content"] is None and r["worker_id"] is None and r["lease_until"] is None
    assert "n_chunks" in recs[1]["error"]  # the field is named, not its value
    assert str(2**70) not in recs[1]["error"]
    # NUL: the same replacement on both backends, the exact text in extra_json; the count is a problem, not a number
    nul = recs[4]
    assert nul["content"] == "a\u2400b"
    extra = orjson.loads(nul["extra_json"])
    assert extra["nul_text"] == {"content": "a\u0000b"}
    assert nul["prompt_tokens"] is None
    assert any("3000000000 is impossible" in p for p in extra["problems"]), extra["problems"]
    assert any("NUL characters in content" in p for p in extra["problems"])
    with any_engine.connect() as conn:
        events = conn.execute(text("SELECT record_id, kind, final, message FROM error_event WHERE run_id = :r"
                                   " ORDER BY record_id"), {"r": run_id}).all()
    assert [(e[0], e[1]) for e in events] == [(by_idx[1].id, STORE_REFUSED), (by_idx[3].id, STORE_REFUSED)]
    row = run_row(any_engine, run_id)
    assert (row["n_ok"], row["n_error"], row["n_in_flight"]) == (4, 2, 0)


def test_a_checks_failure_on_one_record_refuses_that_record_only(any_engine: Any, prompts: Any) -> None:
    class Broken:
        """A checks hook with a bug that one record triggers (the writer's extension point)."""

        def __init__(self) -> None:
            self.flushes = 0

        def on_outcomes(self, outcomes: list[Outcome]) -> None:
            for o in outcomes:
                if "answer 2" in (o.extracted.content if o.extracted else ""):
                    raise ValueError("a bug in a check")

        def on_flush(self, conn: Any, t: float) -> None:
            self.flushes += 1

        def pause_due(self) -> bool:
            return False

        def take_paused(self) -> bool:
            return False

    hook = Broken()
    run_id, writer, claimed = _setup(any_engine, prompts, 4, hooks=[hook])
    try:
        for c in claimed:
            writer.submit(_ok(c, extract_response(_reply(c.idx), "auto")))
    finally:
        writer.stop()
    assert writer._crashed is None and hook.flushes >= 1
    recs = {r["idx"]: r for r in records(any_engine, run_id)}
    assert [recs[i]["status"] for i in range(4)] == ["ok", "ok", "error", "ok"]
    assert recs[2]["error_kind"] == STORE_REFUSED and "running its checks" in recs[2]["error"]
    assert recs[2]["content"] is None


# ---------------------------------------------------------------- which errors are retried


def test_sqlite_errors_are_classified_by_what_waiting_can_fix(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (n INTEGER, s TEXT)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(db, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("BEGIN IMMEDIATE")
    assert is_transient(locked.value)
    holder.execute("ROLLBACK")
    with pytest.raises(OverflowError) as overflow:
        other.execute("INSERT INTO t (n) VALUES (?)", (2**64 - 1,))
    assert not is_transient(overflow.value)
    with pytest.raises(sqlite3.IntegrityError) as integrity:
        other.execute("CREATE TABLE u (n INTEGER NOT NULL)")
        other.execute("INSERT INTO u (n) VALUES (NULL)")
    assert not is_transient(integrity.value)
    assert is_transient(OSError(28, "No space left on device"))


def test_postgresql_errors_are_classified_by_what_waiting_can_fix(pg_server: Any) -> None:
    from synthwatch.store.db import open_engine

    engine = open_engine(pg_server.new_database())
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE TABLE t (n INTEGER, s TEXT)"))
            conn.commit()
        for sql, params in (("INSERT INTO t (s) VALUES (:v)", {"v": "a\x00b"}),
                            ("INSERT INTO t (n) VALUES (:v)", {"v": 3_000_000_000}),
                            ("INSERT INTO nowhere VALUES (1)", {})):
            with engine.connect() as conn, pytest.raises(DBAPIError) as refused:
                conn.execute(text(sql), params)
            assert not is_transient(refused.value), refused.value
        # a connection the server ends (as a restart or a failover would) is transient
        with engine.connect() as victim, engine.connect() as killer:
            pid = victim.execute(text("SELECT pg_backend_pid()")).scalar()
            victim.commit()
            killer.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            killer.commit()
            with pytest.raises(DBAPIError) as lost:
                victim.execute(text("SELECT 1"))
            assert is_transient(lost.value), lost.value
    finally:
        engine.dispose()


def test_token_sums_read_as_numbers_on_both_backends(any_engine: Any) -> None:
    """The token columns are BIGINT (migration 0012_bigint_tokens); PostgreSQL sums BIGINT as NUMERIC, which readers get as int
    (store/db.py), the same as on SQLite, and a count of 3,000,000,000 fits."""
    with any_engine.connect() as conn:
        conn.execute(text("CREATE TABLE t_sum (n BIGINT)"))
        conn.execute(text("INSERT INTO t_sum (n) VALUES (3000000000), (2147483647)"))
        total, avg = conn.execute(text("SELECT SUM(n), AVG(n) FROM t_sum")).one()
        conn.rollback()
    assert type(total) is int and total == 5_147_483_647
    assert avg == 2_573_741_823.5 and type(avg) is float
