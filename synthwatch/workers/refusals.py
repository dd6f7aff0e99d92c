"""Which write errors are worth retrying, and what a record the store refuses is recorded as.

The writer retries a failed transaction only when the error is transient (a locked or busy SQLite file, a
full disk, an I/O error, a lost PostgreSQL connection, a serialization failure or deadlock): waiting fixes
those, and the worker shows a "writes stalled" state while it waits. Every other error is permanent, and
retrying it would loop forever; the writer then writes the batch again record by record
(workers/writer.py) and each record the store refuses becomes that record's own error, kind
``store_refused``, with a reason that names the field and the class of value, never the value itself.
"""

from __future__ import annotations

from typing import Any

from ..redact import redact
from ..store.rows import INT64_MAX, NUL_STAND_IN, is_transient, storable_text, value_class
from ..store.rows import error_message as _message
from .results import Outcome

STORE_REFUSED = "store_refused"
# the sanitiser and the error classes live in store/rows.py (#34: one way into the store for every table)
__all__ = ["INT64_MAX", "NUL_STAND_IN", "STORE_REFUSED", "describe_stall", "is_transient", "refusal_reason", "refuse",
           "storable_text", "suspect_fields", "value_class"]


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


def suspect_fields(row: dict[str, Any]) -> list[str]:
    """The row's columns holding a value a backend may refuse: integers beyond BIGINT, text with NUL."""
    out = []
    for k, v in row.items():
        if type(v) is int and not -INT64_MAX - 1 <= v <= INT64_MAX or type(v) is str and "\x00" in v:
            out.append(k)
    return sorted(out)


def refuse(o: Outcome, reason: str) -> None:
    """Turn a finished record into its refused error: no server value of it is stored (record_writes)."""
    if o.status == "pending":
        return
    own = f"; its own error was {o.error_kind}: {(o.error or '')[:500]}" if o.error_kind else ""
    o.status, o.error_kind, o.error, o.extracted = "error", STORE_REFUSED, reason + own, None
    o.check_flags, o.check_json = 0, None
