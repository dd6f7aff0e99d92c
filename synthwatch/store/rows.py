"""One way into the store (#34): every row carrying a server's, a check's, a judge's or a person's text is
sanitised, redacted and isolated on its way in.

A value no backend can store (a NUL, which PostgreSQL text refuses; a lone surrogate, which is not UTF-8; an
integer beyond BIGINT; a float that is not finite) or a text too long is made storable here, before any SQL:

- NUL becomes :data:`NUL_STAND_IN` (U+2400, it reads as what it replaces), a lone surrogate U+FFFD;
- every text is redacted (synthwatch.redact: registered keys in any form, base64 and hex included) and cut to
  its column's bound (:class:`Guard` ``texts``), redacting before cutting;
- an integer beyond BIGINT and a float that is not finite become NULL.

Then :func:`write` writes the batch in a SAVEPOINT. If the database still refuses it with a permanent error
(a transient one, a locked file or a lost connection, is raised for the caller to retry), each row goes in a
savepoint of its own, and a row refused on its own is replaced by its table's *refused row* (``Guard.refused``):
the same row with the server's text taken out and the reason (the class of value, never the value) in its place,
e.g. a verdict becomes that check's ``error`` verdict on the record. A bad value is that row's recorded error:
never a lost batch, never a stopped thread.

:data:`GUARDS` lists every table and column guarded, with the writers that go through it; the records
themselves are written by workers/record_writes.py with the same sanitiser (:func:`storable_text`) and the same
per-row savepoints, and are listed too, so a test can enumerate every table.
"""

from __future__ import annotations

import errno
import logging
import math
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from ..redact import redact

log = logging.getLogger("synthwatch.store")

# what stands for NUL in a text column, on every backend: U+2400 SYMBOL FOR NUL (␀) reads as what it replaces,
# where U+FFFD would look like an invalid byte; the exact text of a record is kept in extra_json.nul_text
NUL_STAND_IN = "\u2400"
# the largest integer a BIGINT column (and SQLite's INTEGER) holds
INT64_MAX = 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
_REDACT_SLACK = 4096  # characters kept past a bound before redacting (a key across the cut is still found)

# sqlite3 primary result codes that waiting can fix: BUSY, LOCKED, IOERR, FULL, CANTOPEN, PROTOCOL
_SQLITE_TRANSIENT = {5, 6, 10, 13, 14, 15}
# PostgreSQL SQLSTATE classes (and codes) that waiting can fix: connection exceptions, transaction rollback
# (serialization failure, deadlock), insufficient resources (disk full, out of memory), operator
# intervention (admin shutdown, crash recovery), system errors (I/O), lock not available
_PG_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
_PG_TRANSIENT_CODES = {"55P03", "55006"}
_OS_TRANSIENT = {errno.ENOSPC, errno.EIO, errno.EAGAIN, errno.EDQUOT, errno.EBUSY}


# ------------------------------------------------------------------------------------------ values


def storable_text(s: str | None) -> str | None:
    """Text every backend can store: NUL (which PostgreSQL text cannot hold) becomes NUL_STAND_IN, a lone
    surrogate (not UTF-8) U+FFFD. Not redacted, not cut: a record's own text (workers/record_writes.py)."""
    if s is None:
        return s
    if "\x00" in s:
        s = s.replace("\x00", NUL_STAND_IN)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = _SURROGATE.sub("\ufffd", s)
    return s


def clean_text(value: Any, limit: int, *, redacted: bool = True) -> str | None:
    """A text as stored: storable (:func:`storable_text`), redacted, at most ``limit`` characters (``…`` ends a
    cut one). Anything that is not a str is stored as its str()."""
    if value is None:
        return None
    try:
        s = value if isinstance(value, str) else str(value)
    except Exception as exc:  # noqa: BLE001 - a user check's object whose __str__ raises
        s = f"[a value whose text could not be read: {type(exc).__name__}]"
    if len(s) > limit + _REDACT_SLACK:
        s = s[: limit + _REDACT_SLACK]
    s = storable_text(s) or ""
    if redacted:
        s = redact(s)
    return s if len(s) <= limit else s[: max(0, limit - 1)] + "…"


INT32_MAX = 2**31 - 1


def clean_int(value: Any, top: int = INT64_MAX) -> int | None:
    """An integer the column holds (BIGINT by default; ``top=INT32_MAX`` for an INTEGER column), else None (a bool
    stays a bool)."""
    if value is None or isinstance(value, bool):
        return value
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if -top - 1 <= v <= top else None


def clean_float(value: Any) -> float | None:
    """A finite float, else None (NaN and infinities are refused or turned to NULL differently by backends)."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


# ------------------------------------------------------------------------------------------ errors


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same write later can succeed."""
    if getattr(exc, "connection_invalidated", False):
        return True
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in _SQLITE_TRANSIENT
        low = str(orig).lower()
        return any(w in low for w in ("locked", "busy", "disk", "i/o", "unable to open"))
    if isinstance(orig, OSError):
        return orig.errno in _OS_TRANSIENT
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        return state.startswith(_PG_TRANSIENT_CLASSES) or state in _PG_TRANSIENT_CODES
    # psycopg: a lost connection is an OperationalError without a SQLSTATE (the server never answered)
    return type(orig).__name__ == "OperationalError" and type(orig).__module__.startswith("psycopg")


def value_class(exc: BaseException) -> str:
    """The class of value a database refused, for a message that never quotes the value."""
    orig = getattr(exc, "orig", None) or exc
    low = str(orig).lower()
    if isinstance(orig, OverflowError) or "out of range" in low or "too large" in low:
        return "an integer out of the column's range"
    if "nul" in low and ("0x00" in low or "character" in low or "byte" in low):
        return "text holding a NUL character the database cannot store"
    if any(w in low for w in ("recursion limit", "json serializable", "64-bit range", "dict key must")):
        # orjson's refusals (its JSONEncodeError is TypeError itself: told apart by message)
        return "a value that cannot be serialised as JSON (nested too deep, or not JSON)"
    if isinstance(orig, UnicodeError) or "surrogate" in low or "utf-8" in low:
        return "text that is not valid UTF-8"
    return "a value the database refused"


def error_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return (str(orig) or type(orig).__name__).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__


# ------------------------------------------------------------------------------------------ the guards


@dataclass(frozen=True)
class Guard:
    """One guarded table: its INSERT (named parameters), the bound of each text parameter, its integer and
    float parameters, and the row written in place of a row the database refuses (None: logged, not written)."""

    table: str
    sql: str
    texts: Mapping[str, int]
    ints: tuple[str, ...] = ()  # parameters of INTEGER columns (32-bit on PostgreSQL)
    floats: tuple[str, ...] = ()
    refused: Callable[[dict[str, Any], str], dict[str, Any] | None] | None = None
    writers: tuple[str, ...] = ()  # the modules that write it (documentation; tests list them)
    # a valid row of this table for run ``r`` and record ``i`` (creating what it needs): what the property test
    # writes drawn values into (tests/test_store_properties.py), so a table added here is fuzzed without new code
    example: Callable[[Any, int, int], dict[str, Any]] | None = None
    plain: frozenset[str] = field(default_factory=frozenset)  # text parameters not redacted (none today)
    not_null: tuple[str, ...] = ()  # parameters of NOT NULL columns: a missing value is stored as "" (or 0)
    run_column: str = "run_id"  # the column naming a row's run (tests read a run's rows back by it)

    def clean(self, row: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for k, limit in self.texts.items():
            if k in out:
                out[k] = clean_text(out[k], limit, redacted=k not in self.plain)
        for k in self.ints:  # INTEGER columns (32-bit on PostgreSQL)
            if k in out:
                out[k] = clean_int(out[k], INT32_MAX)
        for k in self.floats:
            if k in out:
                out[k] = clean_float(out[k])
        for k in self.not_null:
            if out.get(k) is None:
                out[k] = "" if k in self.texts else 0
        return out


REASON_MAX = 500
LABEL_MAX = 100
MESSAGE_MAX = 4000
DETAIL_MAX = 4000


def _verdict_refused(row: dict[str, Any], reason: str) -> dict[str, Any]:
    return {**row, "s": "error", "sc": None, "l": None, "re": reason[:REASON_MAX]}


def _event_refused(row: dict[str, Any], reason: str) -> dict[str, Any]:
    return {**row, "ep": None, "msg": reason[:MESSAGE_MAX]}


def _audit_refused(row: dict[str, Any], reason: str) -> dict[str, Any]:
    return {**row, "v": None, "d": reason[:DETAIL_MAX]}


def _alarm_refused(row: dict[str, Any], reason: str) -> dict[str, Any]:
    return {**row, "msg": reason[:MESSAGE_MAX], "fix": None, "ev": None}


def _open_item_example(conn: Any, r: int, i: int) -> dict[str, Any]:
    item = conn.execute(text(
        "INSERT INTO open_item (run_id, check_name, state, opened_at, updated_at, n_records, n_excluded, n_queued,"
        " n_peak) VALUES (:r, 'empty_reasoning', 'open', 1.0, 1.0, 1, 0, 0, 1) RETURNING id"), {"r": r}).scalar()
    return {"t": 2.0, "a": "ui", "why": "a reason", "i": item}


GUARDS: dict[str, Guard] = {g.table: g for g in (
    Guard("check_verdict",
          "INSERT INTO check_verdict (run_id, record_id, check_name, state, score, label, reason, cost_ms,"
          " created_at) VALUES (:r, :i, :c, :s, :sc, :l, :re, :ms, :t)",
          texts={"c": 200, "l": LABEL_MAX, "re": REASON_MAX}, floats=("sc", "ms"), refused=_verdict_refused,
          not_null=("c",),
          writers=("quality/verdicts.py (append: user checks, verifiers, rules, language, near-duplicates)",
                   "quality/extended.py", "workers/judge.py (the judge's verdicts)"),
          example=lambda c, r, i: {"r": r, "i": i, "c": "user:x", "s": "fail", "sc": 0.5, "l": "l", "re": "why",
                                   "ms": 1.0, "t": 1.0}),
    Guard("error_event",
          "INSERT INTO error_event (run_id, t, record_id, endpoint, kind, status_code, final, message)"
          " VALUES (:r, :t, :rec, :ep, :k, :sc, :final, :msg)",
          texts={"ep": 2000, "k": 200, "msg": MESSAGE_MAX}, ints=("sc",), refused=_event_refused, not_null=("k", "msg"),
          writers=("workers/writer.py (each failed attempt)",),
          example=lambda c, r, i: {"r": r, "t": 1.0, "rec": i, "ep": "http://x/v1", "k": "http_500", "sc": 500,
                                   "final": True, "msg": "m"}),
    Guard("control_event",
          "INSERT INTO control_event (run_id, t, action, value, actor, detail) VALUES (:r, :t, :a, :v, :actor, :d)",
          texts={"a": 200, "v": 2000, "actor": 200, "d": DETAIL_MAX}, refused=_audit_refused, not_null=("a", "actor"),
          writers=("store/queue.py (add_event: the audit log of every control, repair, open item and alarm)",),
          example=lambda c, r, i: {"r": r, "t": 1.0, "a": "pause", "v": "1", "actor": "ui", "d": "d"}),
    Guard("alarm",
          "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, example_record_id, raised_at,"
          " updated_at, active, auto_paused, reraised_from, evidence_json) VALUES (:r, :rule, :sev, :title, :msg,"
          " :fix, :count, :ex, :t, :t, true, false, :prev, :ev) RETURNING id",
          texts={"rule": 200, "sev": 40, "title": 400, "msg": MESSAGE_MAX, "fix": MESSAGE_MAX, "ev": 20_000},
          ints=("count",), refused=_alarm_refused, not_null=("rule", "sev", "title", "msg", "count"),
          writers=("quality/detection/alarms.py (AlarmKeeper: a check's or the judge's alarm, with its evidence)",),
          example=lambda c, r, i: {"r": r, "rule": "judge", "sev": "error", "title": "t", "msg": "m", "fix": "f",
                                   "count": 1, "ex": i, "t": 1.0, "prev": None, "ev": "{}"}),
    Guard("run",
          "UPDATE run SET status_message = :m, updated_at = :t WHERE id = :r",
          texts={"m": MESSAGE_MAX}, run_column="id",
          writers=("store/queue.py (set_status: a run's status message, e.g. its last error)",),
          example=lambda c, r, i: {"m": "m", "t": 1.0, "r": r}),
    Guard("open_item",
          "UPDATE open_item SET state = 'accepted', closed_at = :t, closed_by = :a, reason = :why, updated_at = :t"
          " WHERE id = :i",
          texts={"a": 200, "why": 2000},
          writers=("quality/detection/open_items.py (accept: the person's typed reason)",), example=_open_item_example),
)}
"""Every guarded table, by name. ``record`` is guarded by workers/record_writes.py (RECORD_TEXT below)."""

FTS_PREFIX_CHARS = 40_000
"""Characters of each of a record's reasoning, answer and prompt that PostgreSQL's full-text index reads
(migration 0019_store; docs/limits.md): beyond them a word is not found by a search, and the text is stored whole."""

RECORD_TEXT = ("reasoning", "content", "error", "turns_json", "attempts_json", "extra_json", "usage_json",
               "logprobs_json")
"""The record's text columns: NUL and lone surrogates made storable by workers/record_writes.py, each record in a
savepoint of its own when its batch is refused (a refused record is kind store_refused)."""


def clean(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """One row's parameters as the guard of ``table`` stores them."""
    return GUARDS[table].clean(row)


def write(conn: Any, table: str, rows: Iterable[Mapping[str, Any]], sql: str | None = None) -> list[Any]:
    """Write ``rows`` into a guarded table: sanitised, in a savepoint, row by row if the batch is refused.

    Returns, per row written, the first column of what the statement returned (its id with RETURNING) or None.
    A transient database error is raised (the caller retries); a permanent one costs only the rows refused,
    each replaced by the guard's refused row (its reason recorded) or, with none, left out and logged."""
    g = GUARDS[table]
    stmt = text(sql or g.sql)
    returning = " RETURNING " in (sql or g.sql).upper()
    cleaned = [g.clean(r) for r in rows]
    if not cleaned:
        return []
    sp = conn.begin_nested()
    try:
        out = _execute(conn, stmt, cleaned, returning)
        sp.commit()
        return out
    except Exception as exc:
        sp.rollback()
        if is_transient(exc):
            raise
        log.warning("the store refused a batch of %d %s rows (%s): writing them one by one", len(cleaned), table,
                    value_class(exc))
    out = []
    for row in cleaned:
        ok, res = _one(conn, stmt, row, returning)
        if ok:
            out.append(res)
            continue
        assert isinstance(res, BaseException)
        reason = redact(f"the store refused this {table} row: {value_class(res)} [{type(res).__name__}]")
        log.warning("%s", reason)
        stand_in = g.refused(row, reason) if g.refused is not None else None
        if stand_in is not None:
            ok, res2 = _one(conn, stmt, g.clean(stand_in), returning)
            if ok:
                out.append(res2)
                continue
            log.error("the store refused the refused row of %s too: %s", table, value_class(res2))  # type: ignore[arg-type]
    return out


def _execute(conn: Any, stmt: Any, rows: list[dict[str, Any]], returning: bool) -> list[Any]:
    if returning:
        return [conn.execute(stmt, r).scalar() for r in rows]
    conn.execute(stmt, rows)
    return [None] * len(rows)


def _one(conn: Any, stmt: Any, row: dict[str, Any], returning: bool) -> tuple[bool, Any]:
    sp = conn.begin_nested()
    try:
        res = conn.execute(stmt, row)
        val = res.scalar() if returning else None
        sp.commit()
        return True, val
    except Exception as exc:
        sp.rollback()
        if is_transient(exc):
            raise
        return False, exc


__all__ = ["DETAIL_MAX", "GUARDS", "INT32_MAX", "INT64_MAX", "LABEL_MAX", "MESSAGE_MAX", "NUL_STAND_IN", "REASON_MAX",
           "RECORD_TEXT", "Guard", "clean", "clean_float", "clean_int", "clean_text", "error_message", "write",
           "is_transient", "storable_text", "value_class"]
