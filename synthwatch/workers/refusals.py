"""Which write errors are worth retrying, and what a record the store refuses is recorded as.

The writer retries a failed transaction only when the error is transient (a locked or busy SQLite file, a
full disk, an I/O error, a lost PostgreSQL connection, a serialization failure or deadlock): waiting fixes
those, and the worker shows a "writes stalled" state while it waits. Every other error is permanent, and
retrying it would loop forever; the writer then writes the batch again record by record
(workers/writer.py) and each record the store refuses becomes that record's own error, kind
``store_refused``, with a reason that names the field and the class of value, never the value itself.
"""

from __future__ import annotations

import errno
import sqlite3
from typing import Any

from ..redact import redact
from .results import Outcome

STORE_REFUSED = "store_refused"

# sqlite3 primary result codes that waiting can fix: BUSY, LOCKED, IOERR, FULL, CANTOPEN, PROTOCOL
_SQLITE_TRANSIENT = {5, 6, 10, 13, 14, 15}
# PostgreSQL SQLSTATE classes (and codes) that waiting can fix: connection exceptions, transaction rollback
# (serialization failure, deadlock), insufficient resources (disk full, out of memory), operator
# intervention (admin shutdown, crash recovery), system errors (I/O), lock not available
_PG_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
_PG_TRANSIENT_CODES = {"55P03", "55006"}
_OS_TRANSIENT = {errno.ENOSPC, errno.EIO, errno.EAGAIN, errno.EDQUOT, errno.EBUSY}

# what stands for NUL in a text column, on every backend: U+2400 SYMBOL FOR NUL (␀) reads as what it replaces,
# where U+FFFD would look like an invalid byte; the exact text is kept in extra_json.nul_text (series.py)
NUL_STAND_IN = "\u2400"
# the largest integer a BIGINT column (and SQLite's INTEGER) holds
INT64_MAX = 2**63 - 1


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


def describe_stall(exc: BaseException) -> str:
    """The worker's visible state while a transient write error is retried (dashboard, CLI status line)."""
    msg = _message(exc)
    low = msg.lower()
    if "disk" in low and "full" in low or "no space" in low:
        what = "database disk is full"
    elif "locked" in low or "busy" in low:
        what = "database is busy"
    elif "connection" in low or "server closed" in low or "terminating" in low:
        what = "database connection lost"
    else:
        what = "database write failed"
    return f"writes stalled: {what} ({msg}); the worker paused and will continue when it clears, retrying"


def refusal_reason(exc: BaseException, where: str, row: dict[str, Any] | None = None) -> str:
    """A refused record's error message: where it failed, the class of value, never the value (redacted)."""
    fields = suspect_fields(row) if row else []
    msg = f"the store refused this record ({where}): {value_class(exc)}"
    if fields:
        msg += f" in {', '.join(fields)}"
    return redact(f"{msg} [{type(exc).__name__}: {_message(exc)[:300]}]")


def value_class(exc: BaseException) -> str:
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


def suspect_fields(row: dict[str, Any]) -> list[str]:
    """The row's columns holding a value a backend may refuse: integers beyond BIGINT, text with NUL."""
    out = []
    for k, v in row.items():
        if type(v) is int and not -INT64_MAX - 1 <= v <= INT64_MAX or type(v) is str and "\x00" in v:
            out.append(k)
    return sorted(out)


def storable_text(s: str | None) -> str | None:
    """Text every backend can store: NUL (which PostgreSQL text cannot hold) becomes NUL_STAND_IN."""
    if s is None or "\x00" not in s:
        return s
    return s.replace("\x00", NUL_STAND_IN)


def refuse(o: Outcome, reason: str) -> None:
    """Turn a finished record into its refused error: no server value of it is stored (record_writes)."""
    if o.status == "pending":
        return
    own = f"; its own error was {o.error_kind}: {(o.error or '')[:500]}" if o.error_kind else ""
    o.status, o.error_kind, o.error, o.extracted = "error", STORE_REFUSED, reason + own, None
    o.check_flags, o.check_json = 0, None


def _message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return (str(orig) or type(orig).__name__).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
