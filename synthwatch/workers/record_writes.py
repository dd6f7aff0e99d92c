"""A flush's finished records written to the ``record`` table (the writer thread's SQL, workers/writer.py).

The common path builds every row in Python, then runs one UPDATE through the driver for all of them. A record
whose row cannot be built (a value the series code or JSON cannot take) is refused on its own, before any SQL.
When the database itself refuses the batch with a permanent error, the writer calls :meth:`RecordWrites.write`
again with ``isolate=True``: each record then goes in a SAVEPOINT of its own, and a record the store refuses is
written as an error of kind ``store_refused`` (workers/refusals.py) while the rest of its batch commits. The
isolation costs nothing on the common path: a ``try`` with no exception is free (Python >= 3.11) and the
savepoints exist only on the rare second pass.
"""

from __future__ import annotations

import logging
import operator
import random
import time
from collections.abc import Callable
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store import queue as store
from ..store import search_index
from . import long_texts
from .refusals import STORE_REFUSED, is_transient, refusal_reason, storable_text
from .results import Outcome
from .series import record_columns

log = logging.getLogger("synthwatch.writer")


class RecordWrites:
    """The record rows of one worker (run_id, worker_id); ``refused`` collects the flush's refused records
    (as error_event rows) for the writer to insert with the failed attempts."""

    def __init__(self, run_id: int, worker_id: int) -> None:
        self.run_id = run_id
        self.worker_id = worker_id
        self.rnd: Callable[[], float] = random.Random().random
        self.refused: list[dict[str, Any]] = []

    def rows(self, outcomes: list[Outcome]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(final rows, rows going back to pending); a record whose row cannot be built is a refused row."""
        final_rows: list[dict[str, Any]] = []
        back_rows: list[dict[str, Any]] = []
        for o in outcomes:
            try:
                row, back = self._row(o)
            except Exception as exc:  # one record's value: that record's error, never its batch's
                final_rows.append(self._refused(o, None, refusal_reason(exc, "building its row")))
                continue
            (back_rows if back else final_rows).append(row)
            if o.error_kind == STORE_REFUSED:  # refused before its row (workers/writer.refuse): its error event
                self.refused.append({"r": self.run_id, "t": o.finished_at or time.time(), "rec": o.record_id,
                                     "ep": o.endpoint, "k": STORE_REFUSED, "sc": None, "final": True,
                                     "msg": (storable_text(o.error) or "")[:4000]})
        return final_rows, back_rows

    def _row(self, o: Outcome) -> tuple[dict[str, Any], bool]:
        attempts_json = orjson.dumps(o.attempts).decode() if o.attempts else None
        n_attempts = len(o.attempts) + o.prior_attempts
        if o.status == "pending":
            return {"id": o.record_id, "w": self.worker_id, "attempts": n_attempts, "attempts_json": attempts_json,
                    "error_kind": o.error_kind, "error": storable_text(o.error)}, True
        row: dict[str, Any] = {
            "id": o.record_id, "w": self.worker_id, "status": o.status, "attempts": n_attempts,
            "attempts_json": attempts_json, "error_kind": o.error_kind, "error": storable_text(o.error),
            "endpoint": o.endpoint, "latency_s": o.latency_s, "ttft_s": o.ttft_s, "n_chunks": o.n_chunks,
            "finished_at": o.finished_at, "check_flags": o.check_flags, "check_json": o.check_json,
            "rnd": self.rnd(),  # the sampling key, drawn now (see store.insert_prompts)
            "gen_version": o.config_version, "derive_version": o.config_version, "rerun": 0,
            "was_rerun": o.rerun,
            "turns_json": orjson.dumps(o.turns, option=orjson.OPT_NON_STR_KEYS).decode() if o.turns else None,
            "turns_done": len(o.turns or ()) + (o.status == "ok"),
            "billed_prompt_tokens": o.billed[0], "billed_completion_tokens": o.billed[1], "billed_estimated": o.billed[2],
        }
        row.update(o.columns if o.columns is not None else record_columns(o.extracted))
        return row, False

    def _refused(self, o: Outcome | None, row: dict[str, Any] | None, reason: str) -> dict[str, Any]:
        """The row that records a refused record as an error (no server value in it), and its error event."""
        if o is not None:
            rid, endpoint, fin, attempts = o.record_id, o.endpoint, o.finished_at, len(o.attempts) + o.prior_attempts
            version, rerun, own = o.config_version, o.rerun, (o.error_kind, o.error)
        else:
            assert row is not None
            rid, endpoint, fin, attempts = row["id"], row["endpoint"], row["finished_at"], row["attempts"]
            version, rerun, own = row["gen_version"], row["was_rerun"], (row["error_kind"], row["error"])
        if own[0]:
            reason += f"; its own error was {own[0]}: {(storable_text(own[1]) or '')[:500]}"
        log.warning("record %s refused by the store: %s", rid, reason)
        self.refused.append({"r": self.run_id, "t": fin or time.time(), "rec": rid, "ep": endpoint,
                             "k": STORE_REFUSED, "sc": None, "final": True, "msg": reason[:4000]})
        return {"id": rid, "w": self.worker_id, "status": "error", "error_kind": STORE_REFUSED, "error": reason,
                "endpoint": endpoint, "finished_at": fin or time.time(), "attempts": attempts, "rnd": self.rnd(),
                "gen_version": version, "was_rerun": rerun, "reasoning": None, "content": None, "refused": True}

    def write(self, conn: Connection, outcomes: list[Outcome], isolate: bool = False) -> int:
        """Write the outcomes' rows and the run's counters; the number of records this worker still held."""
        final_rows, back_rows = self.rows(outcomes)
        # Claims taken over after an expired lease belong to another worker now: their results are dropped.
        # The UPDATEs only touch rows this worker still holds; on SQLite the final UPDATE's summed row count
        # says whether all of them were (the usual case, no query needed), elsewhere a SELECT asks first.
        n_results = len(final_rows) + len(back_rows)
        sqlite = conn.dialect.name == "sqlite"
        refused = [r for r in final_rows if "refused" in r]
        if refused:
            final_rows = [r for r in final_rows if "refused" not in r]
        if back_rows or refused or not sqlite or isolate:
            owned = self._owned(conn, [r["id"] for r in final_rows] + [r["id"] for r in back_rows]
                                + [r["id"] for r in refused])
            final_rows = [r for r in final_rows if r["id"] in owned]
            back_rows = [r for r in back_rows if r["id"] in owned]
            refused = [r for r in refused if r["id"] in owned]
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        spooled = any(o.columns is not None for o in outcomes)  # a long text goes in pieces (workers/long_texts)
        if final_rows and not isolate:
            done = conn.exec_driver_sql(FINAL_UPDATE.format(m=mark), [
                FINAL_ROW(long_texts.bound(r)) for r in final_rows] if spooled else [
                FINAL_ROW(r) for r in final_rows])
            if sqlite and done.rowcount != len(final_rows):
                final_rows = self._written_by_us(conn, final_rows)
            if spooled:
                long_texts.fill(conn, final_rows)
        elif final_rows:
            final_rows, more = self._one_by_one(conn, final_rows, FINAL_UPDATE.format(m=mark))
            refused += more
        if refused:
            conn.execute(_REFUSED_UPDATE, refused)
            final_rows += refused
        if back_rows:
            if isolate:
                back_rows = self._back_one_by_one(conn, back_rows)
            else:
                conn.execute(_BACK_UPDATE, back_rows)
        if len(final_rows) + len(back_rows) != n_results:
            log.warning("%d results discarded: their claims had been taken over",
                        n_results - len(final_rows) - len(back_rows))
        by_status = {"ok": 0, "error": 0, "timeout": 0}  # the last turn of an ok record is a turn done too
        reruns = 0
        for r in final_rows:
            by_status[r["status"]] += 1
            reruns += bool(r["was_rerun"])
        if final_rows:
            search_index.enqueue(conn, [r["id"] for r in final_rows
                                        if r["reasoning"] is not None or r["content"] is not None])
        conn.execute(
            text("UPDATE run SET n_ok = n_ok + :ok, n_error = n_error + :err, n_timeout = n_timeout + :to,"
                 " n_in_flight = n_in_flight - :fin, n_pending = n_pending + :back, n_rerun = n_rerun - :rr,"
                 " n_turns_done = n_turns_done + :ok, updated_at = :t WHERE id = :r"),
            {"ok": by_status["ok"], "err": by_status["error"], "to": by_status["timeout"],
             "fin": len(final_rows) + len(back_rows), "back": len(back_rows), "rr": reruns, "t": time.time(),
             "r": self.run_id},
        )
        return len(final_rows) + len(back_rows)

    def _one_by_one(self, conn: Connection, rows: list[dict[str, Any]],
                    sql: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Each row in a SAVEPOINT of its own: (rows written, refused rows standing in for those refused)."""
        written: list[dict[str, Any]] = []
        refused: list[dict[str, Any]] = []
        for r in rows:
            sp = conn.begin_nested()
            try:
                conn.exec_driver_sql(sql, FINAL_ROW(long_texts.bound(r)))
                long_texts.fill(conn, [r])
                sp.commit()
                written.append(r)
            except Exception as exc:
                sp.rollback()
                if is_transient(exc):
                    raise
                refused.append(self._refused(None, r, refusal_reason(exc, "writing its row", r)))
        return written, refused

    def _back_one_by_one(self, conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        written = []
        for r in rows:
            sp = conn.begin_nested()
            try:
                conn.execute(_BACK_UPDATE, r)
                sp.commit()
                written.append(r)
            except Exception as exc:
                sp.rollback()
                if is_transient(exc):
                    raise
                # back to pending without what the store refused (its attempts' details)
                log.warning("record %s: attempts not stored: %s", r["id"], refusal_reason(exc, "returning it", r))
                conn.execute(_BACK_UPDATE, {**r, "attempts_json": None, "error": None})
                written.append(r)
        return written

    def _written_by_us(self, conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows the final UPDATE changed: theirs now hold our finish time and no worker."""
        ours: set[int] = set()
        finished = {r["id"]: r["finished_at"] for r in rows}
        for chunk in store.int_lists(list(finished)):
            ours.update(rid for rid, fin in conn.execute(text(
                f"SELECT id, finished_at FROM record WHERE id IN ({chunk}) AND worker_id IS NULL")) if fin == finished[rid])
        return [r for r in rows if r["id"] in ours]

    def _owned(self, conn: Connection, ids: list[int]) -> set[int]:
        owned: set[int] = set()
        for chunk in store.int_lists(ids):
            owned.update(r[0] for r in conn.execute(
                text(f"SELECT id FROM record WHERE id IN ({chunk}) AND worker_id = :w AND status = 'in_flight'"),
                {"w": self.worker_id},
            ))
        return owned


FINAL_COLS = (
    "status", "reasoning", "content", "content_null", "reasoning_source", "reasoning_len", "content_len",
    "finish_reason", "prompt_tokens", "completion_tokens", "reasoning_tokens", "reasoning_tokens_source",
    "usage_json", "token_ids_json", "latency_s", "ttft_s", "n_chunks", "attempts", "attempts_json", "error_kind",
    "error", "endpoint", "model", "system_fingerprint", "response_id", "extra_json", "finished_at", "check_flags",
    "check_json", "rnd",
    "gen_version", "derive_version", "rerun", "turns_json", "turns_done", "billed_prompt_tokens",
    "billed_completion_tokens", "billed_estimated", "logprobs_json",
)
FINAL_ROW = operator.itemgetter(*FINAL_COLS, "id", "w")  # a row's parameters, in C
# run through the driver (exec_driver_sql, positional parameters): SQLAlchemy's processing of ~30 named
# parameters per row cost more than SQLite's UPDATE itself (measured ~35 us vs ~25 us per record)
FINAL_UPDATE = (
    "UPDATE record SET " + ", ".join(f"{c} = {{m}}" for c in FINAL_COLS)
    + ", worker_id = NULL, lease_until = NULL WHERE id = {m} AND status = 'in_flight' AND worker_id = {m}"
)
_BACK_UPDATE = text(
    "UPDATE record SET status = 'pending', attempts = :attempts, attempts_json = :attempts_json,"
    " error_kind = :error_kind, error = :error, worker_id = NULL, lease_until = NULL"
    " WHERE id = :id AND status = 'in_flight' AND worker_id = :w"
)
# a refused record: an error with no server value in it; turns_json (earlier turns, stored already) is kept
_REFUSED_UPDATE = text(
    "UPDATE record SET status = 'error', error_kind = :error_kind, error = :error, endpoint = :endpoint,"
    " finished_at = :finished_at, attempts = :attempts, attempts_json = NULL, rnd = :rnd,"
    " gen_version = :gen_version, derive_version = :gen_version, rerun = 0, check_flags = 0, check_json = NULL,"
    " reasoning = NULL, content = NULL, reasoning_source = NULL, reasoning_len = NULL, content_len = NULL,"
    " finish_reason = NULL, prompt_tokens = NULL, completion_tokens = NULL, reasoning_tokens = NULL,"
    " reasoning_tokens_source = NULL, usage_json = NULL, token_ids_json = NULL, model = NULL, system_fingerprint = NULL, response_id = NULL,"
    " extra_json = NULL, logprobs_json = NULL, latency_s = NULL, ttft_s = NULL, n_chunks = 0, worker_id = NULL,"
    " lease_until = NULL WHERE id = :id AND status = 'in_flight' AND worker_id = :w"
)
