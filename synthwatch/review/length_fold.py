"""A whole run's length histogram folded per finished time bucket, so a live poll never re-scans the run.

The run page polls its length histogram every 10 s. Binning every record of a 20k-record run in SQL on each poll
hit the dashboard's 500 ms limit on busy runs. Records the writer can no longer touch (finished more than
``FINAL_AFTER_S`` ago, the same rule the series buckets follow) are instead read once, through the
``ix_record_finished`` index, into exact counts per token length, kept per process. A poll reads only the records
finished since the last folded bucket (at most ~2.5 minutes of output) and bins the counts in Python, so the bins
can follow a new largest output or a new ``max_tokens`` without reading anything again.

A repair (re-derive, re-run, undo) changes records that were already folded: the fold is keyed by the run's
newest repair id and starts again after one. Watch runs take their records' finish times from the log being
watched, which can lie in the past; they (and any records-table filter) keep the direct query in lengths.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from . import lengths

FINAL_AFTER_S = 150  # the writer stores an outcome well within this of its finish time (as for series buckets)
FOLD_STEP_S = 1800  # history folds in steps of this much run time (one query each) ...
FOLD_BUDGET_S = 0.15  # ... for at most this long per poll, so a long run's first view never stalls

# per record: all output tokens (o) and reasoning tokens (r), split as lengths.py does; grouped, so a step returns
# one row per distinct pair, never one per record
_PAIRS = (
    "SELECT o, r, COUNT(*) AS k FROM (SELECT completion_tokens AS o,"
    " CASE WHEN reasoning_len + content_len > 0"
    " THEN CAST(ROUND(completion_tokens * reasoning_len * 1.0 / (reasoning_len + content_len)) AS INTEGER)"
    " ELSE 0 END AS r FROM record WHERE run_id = :run AND finished_at >= :since {until}"
    " AND completion_tokens IS NOT NULL) AS s GROUP BY o, r"
)


@dataclass
class Counts:
    """Records per exact (output tokens, reasoning tokens) pair; ``rows``: records read to get them."""

    pairs: Counter[tuple[int, int]] = field(default_factory=Counter)
    rows: int = 0

    def add(self, other: Counts) -> None:
        self.pairs.update(other.pairs)
        self.rows += other.rows


@dataclass
class _Fold:
    key: int  # the run's newest repair id when the fold began
    upto: float  # records finished before this are in ``counts``
    counts: Counts


_FOLDS: dict[tuple[str, int], _Fold] = {}
_LOCK = threading.Lock()


def _read(conn: Connection, run_id: int, since: float, until: float | None) -> Counts:
    params: dict[str, Any] = {"run": run_id, "since": since}
    sql = _PAIRS.format(until="AND finished_at < :until" if until is not None else "")
    if until is not None:
        params["until"] = until
    out = Counts()
    for o, r, k in conn.execute(text(sql), params):
        out.pairs[(int(o), int(r))] += int(k)
        out.rows += int(k)
    return out


def _repair_key(conn: Connection, run_id: int) -> int:
    return int(conn.execute(text("SELECT COALESCE(MAX(id), 0) FROM repair WHERE run_id = :r"),
                            {"r": run_id}).scalar_one())


def whole_run(conn: Connection, run_id: int, now: float | None = None) -> tuple[Counts, Counts] | None:
    """(all the run's records with token counts, the part of them this call read), or None while the fold is
    still catching up on a long run's history (the caller falls back to the capped direct query)."""
    now = time.time() if now is None else now
    final = now - FINAL_AFTER_S
    ckey = (str(conn.engine.url), run_id)
    key = _repair_key(conn, run_id)
    with _LOCK:
        fold = _FOLDS.get(ckey)
    if fold is None or fold.key != key:
        first = conn.execute(text("SELECT MIN(finished_at) FROM record WHERE run_id = :r"), {"r": run_id}).scalar()
        fold = _Fold(key, float(first) if first is not None else final, Counts())
    read = Counts()
    started = time.monotonic()
    while fold.upto < final:  # at least one step per poll, then more while the budget lasts
        step_to = min(final, fold.upto + FOLD_STEP_S)
        part = _read(conn, run_id, fold.upto, step_to)
        counts = Counts(Counter(fold.counts.pairs), fold.counts.rows)
        counts.add(part)
        read.add(part)
        fold = _Fold(key, step_to, counts)
        with _LOCK:
            _FOLDS[ckey] = fold
        if time.monotonic() - started >= FOLD_BUDGET_S:
            break
    if fold.upto < final:
        return None
    tail = _read(conn, run_id, fold.upto, None)  # the records the writer may still add to: read on every poll
    read.add(tail)
    whole = Counts(Counter(fold.counts.pairs), fold.counts.rows)
    whole.add(tail)
    return whole, read


def histogram(counts: Counts, max_tokens: int | None) -> dict[str, Any]:
    """The same histogram lengths.histogram bins in SQL, binned here from exact counts."""
    top = max((o for o, _ in counts.pairs), default=0)
    width, n, hi, limit = lengths.layout(top, max_tokens)

    def bin_of(v: int) -> int:
        if v <= 0:
            return 0
        if v >= limit:
            return n + 1
        if v > hi:
            return n
        return min((v - 1) // width + 1, n + 1)

    out = {k: [0] * (n + 2) for k in lengths.KINDS}
    for (o, r), k in counts.pairs.items():
        out["output"][bin_of(o)] += k
        out["reasoning"][bin_of(r)] += k
        out["content"][bin_of(o - r)] += k
    if not max_tokens:
        for kind in lengths.KINDS:
            out[kind].pop()
    return {"max_tokens": max_tokens, "bin_width": width, "bins": lengths.bins_of(width, n, hi, max_tokens),
            "counts": out, "records": counts.rows, "capped": False, "cap": None}


def forget() -> None:
    """Drop every fold (tests; a process that swapped databases)."""
    with _LOCK:
        _FOLDS.clear()
