"""Flags: a reviewer's verdict on one record or a bulk selection, its history and its undo."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine

from ..quality.detection import open_items
from ..store import queue as store
from . import idset
from .filters import BULK_CHUNK, REASON_CODES, VERDICTS, Filters, NotFound, ReviewError, index_hint, resolve
from .queries import Cursor, select_ids

# ------------------------------------------------------------------------------------------- flags


def validate_flag(verdict: str, reason: str | None, note: str | None) -> tuple[str | None, str | None]:
    if verdict not in VERDICTS:
        raise ReviewError(f"verdict: must be good or bad (got {str(verdict)[:40]!r})")
    reason = reason or None
    if reason is not None and reason not in REASON_CODES:
        raise ReviewError(f"reason: unknown reason {reason[:40]!r} (one of {', '.join(REASON_CODES)})")
    if reason is not None and verdict == "good":
        raise ReviewError("reason: a reason goes with a bad verdict only")
    note = (note or "").strip() or None
    if note is not None and len(note) > 2000:
        raise ReviewError("note: longer than 2000 characters")
    return reason, note


def flag(engine: Engine, run_id: int, record_id: int, verdict: str, reason: str | None = None,
         note: str | None = None) -> dict[str, Any]:
    """Record a verdict (history row + the record's denormalised latest verdict) in one short transaction."""
    reason, note = validate_flag(verdict, reason, note)
    t = store.now()
    with engine.connect() as conn, store.write_begin(conn):
        found = conn.execute(text("SELECT 1 FROM record WHERE id = :i AND run_id = :r"),
                             {"i": record_id, "r": run_id}).first()
        if found is None:
            raise NotFound(f"no record {record_id} in run {run_id}")
        flag_id = conn.execute(
            text("INSERT INTO flag (run_id, record_id, verdict, reason, note, created_at)"
                 " VALUES (:r, :i, :v, :reason, :note, :t) RETURNING id"),
            {"r": run_id, "i": record_id, "v": verdict, "reason": reason, "note": note, "t": t},
        ).scalar_one()
        conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                     {"v": verdict, "reason": reason, "t": t, "i": record_id})
        open_items.sync(conn, run_id, actor="review")  # a record flagged bad is excluded from its open item
    return {"id": int(flag_id), "record_id": record_id, "verdict": verdict, "reason": reason, "note": note,
            "created_at": t}


def _restore(conn: Connection, record_id: int) -> dict[str, Any] | None:
    prev = conn.execute(
        text("SELECT verdict, reason, created_at FROM flag WHERE record_id = :i AND undone_at IS NULL"
             " ORDER BY id DESC LIMIT 1"), {"i": record_id}).mappings().first()
    conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                 {"v": prev["verdict"] if prev else None, "reason": prev["reason"] if prev else None,
                  "t": prev["created_at"] if prev else None, "i": record_id})
    return dict(prev) if prev else None


def undo(engine: Engine, run_id: int, record_id: int | None = None) -> dict[str, Any]:
    """Undo the latest flag on a record (or, without a record, the run's latest flag action: a whole bulk
    flag counts as one action). The record gets its previous verdict back."""
    with engine.connect() as conn:
        if record_id is not None:
            latest = conn.execute(
                text("SELECT id, record_id, bulk_id FROM flag WHERE run_id = :r AND record_id = :i"
                     " AND undone_at IS NULL ORDER BY id DESC LIMIT 1"), {"r": run_id, "i": record_id}).first()
        else:
            latest = conn.execute(
                text("SELECT id, record_id, bulk_id FROM flag WHERE run_id = :r AND undone_at IS NULL"
                     " ORDER BY id DESC LIMIT 1"), {"r": run_id}).first()
    if latest is None:
        raise ReviewError("nothing to undo" + (f" on record {record_id}" if record_id is not None else ""))
    if record_id is None and latest[2]:
        n = undo_bulk(engine, run_id, str(latest[2]))
        return {"undone": n, "bulk_id": latest[2], "record_id": None, "review": None}
    t = store.now()
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE flag SET undone_at = :t WHERE id = :f"), {"t": t, "f": latest[0]})
        prev = _restore(conn, int(latest[1]))
        open_items.sync(conn, run_id, actor="review")
    return {"undone": 1, "record_id": int(latest[1]), "review": prev}


def undo_bulk(engine: Engine, run_id: int, bulk_id: str) -> int:
    done = 0
    while True:
        t = store.now()
        with engine.connect() as conn, store.write_begin(conn):
            rows = conn.execute(
                text("SELECT id, record_id FROM flag WHERE run_id = :r AND bulk_id = :b AND undone_at IS NULL"
                     " LIMIT :n"), {"r": run_id, "b": bulk_id, "n": BULK_CHUNK}).all()
            if not rows:
                open_items.sync(conn, run_id, actor="review")
                return done
            conn.execute(text("UPDATE flag SET undone_at = :t WHERE id = :f"), [{"t": t, "f": r[0]} for r in rows])
            for r in rows:
                _restore(conn, int(r[1]))
            done += len(rows)


def latest_bulk(conn: Connection, run_id: int) -> dict[str, Any] | None:
    """The run's latest bulk flag while any of its flags still stands: its Undo stays on the records page."""
    row = conn.execute(text("SELECT bulk_id, verdict, created_at FROM flag WHERE run_id = :r AND bulk_id IS NOT NULL"
                            " ORDER BY created_at DESC LIMIT 1"), {"r": run_id}).first()
    if row is None:
        return None
    n = int(conn.execute(text("SELECT COUNT(*) FROM flag WHERE run_id = :r AND bulk_id = :b AND undone_at IS NULL"),
                         {"r": run_id, "b": row[0]}).scalar_one())
    return {"bulk_id": row[0], "verdict": row[1], "created_at": row[2], "flagged": n} if n else None


def max_record_id(conn: Connection, run_id: int) -> int:
    return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM record WHERE run_id = :r"),
                            {"r": run_id}).scalar_one())


def bulk_preview(conn: Connection, run_id: int, f: Filters) -> dict[str, Any]:
    """The records a bulk flag would touch, pinned: `ids` (idset text) is the set applying it flags, whatever
    finishes or changes meanwhile (#37: a max id let records pending at the preview in)."""
    by_id = replace(f, sort="id", order="asc")
    ids: list[int] = []
    after: Cursor | None = None
    while True:
        chunk = select_ids(conn, run_id, by_id, after=after, limit=BULK_CHUNK)
        if not chunk:
            break
        ids.extend(chunk)
        if len(ids) > idset.MAX_IDS:
            raise ReviewError(f"more than {idset.MAX_IDS:,} records match: narrow the filter")
        after = Cursor(None, chunk[-1])
    return {"count": len(ids), "max_id": max(ids, default=0), "ids": idset.encode(ids)}


def bulk_flag_ids(write: Engine, run_id: int, ids: list[int], verdict: str, reason: str | None,
                  note: str | None, selected: str | None = None, actor: str = "ui") -> dict[str, Any]:
    """Flag exactly the records `ids` names (a preview's pinned set; ids of another run are left alone), in short
    transactions of BULK_CHUNK records; `flagged` is how many. The audit log gets one `bulk_flag` event naming
    ``selected`` (the filter that chose them, its expression normalised), through the store's one way in."""
    reason, note = validate_flag(verdict, reason, note)
    bulk_id = uuid.uuid4().hex[:12]
    n = 0
    for k in range(0, len(ids), BULK_CHUNK):
        t = store.now()
        with write.connect() as conn, store.write_begin(conn):
            mine = [int(i) for (i,) in conn.execute(
                text("SELECT id FROM record WHERE run_id = :r AND id IN :ids").bindparams(
                    bindparam("ids", expanding=True)), {"r": run_id, "ids": ids[k:k + BULK_CHUNK]})]
            if not mine:
                continue
            conn.execute(
                text("INSERT INTO flag (run_id, record_id, verdict, reason, note, created_at, bulk_id)"
                     " VALUES (:r, :i, :v, :reason, :note, :t, :b)"),
                [{"r": run_id, "i": i, "v": verdict, "reason": reason, "note": note, "t": t, "b": bulk_id}
                 for i in mine],
            )
            conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                         [{"v": verdict, "reason": reason, "t": t, "i": i} for i in mine])
        n += len(mine)
    with write.connect() as conn, store.write_begin(conn):
        open_items.sync(conn, run_id, actor="review")
        if n:
            store.add_event(conn, run_id, "bulk_flag", bulk_id, actor=actor,
                            detail=f"{n:,} records flagged {verdict}" + (f": {selected}" if selected else ""))
    return {"bulk_id": bulk_id, "flagged": n, "verdict": verdict, "reason": reason}


def selection_words(conn: Connection, run_id: int, f: Filters) -> str:
    """A filter in words for the audit log: its parameters, with canonical check names and the expression's
    normalised text (filters.resolve); a filter that does not resolve is described as given."""
    try:
        f = resolve(conn, run_id, f)
    except ReviewError:
        pass
    return ", ".join(f"{k}={v}" for k, v in f.params().items() if k not in ("sort", "order")) or "every record"


def bulk_flag(read: Engine, write: Engine, run_id: int, f: Filters, verdict: str, reason: str | None,
              note: str | None, max_id: int) -> dict[str, Any]:
    """Flag every record matching `f` (with id <= max_id), in short transactions of BULK_CHUNK records."""
    reason, note = validate_flag(verdict, reason, note)
    bulk_id = uuid.uuid4().hex[:12]
    by_id = replace(f, sort="id", order="desc")
    after: Cursor | None = None
    n = 0
    while True:
        with read.connect() as conn:
            ids = select_ids(conn, run_id, by_id, after=after, limit=BULK_CHUNK, max_id=max_id)
        if not ids:
            break
        after = Cursor(None, ids[-1])
        t = store.now()
        with write.connect() as conn, store.write_begin(conn):
            conn.execute(
                text("INSERT INTO flag (run_id, record_id, verdict, reason, note, created_at, bulk_id)"
                     " VALUES (:r, :i, :v, :reason, :note, :t, :b)"),
                [{"r": run_id, "i": i, "v": verdict, "reason": reason, "note": note, "t": t, "b": bulk_id}
                 for i in ids],
            )
            conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                         [{"v": verdict, "reason": reason, "t": t, "i": i} for i in ids])
        n += len(ids)
    with write.connect() as conn, store.write_begin(conn):
        open_items.sync(conn, run_id, actor="review")
    return {"bulk_id": bulk_id, "flagged": n, "verdict": verdict, "reason": reason}


def review_counts(conn: Connection, run_id: int) -> dict[str, int]:
    """Flag counts of a run (walks only flagged entries of ix_record_review)."""
    rows = conn.execute(
        text(f"SELECT review, count(*) FROM record{index_hint(conn, 'ix_record_review')}"
             " WHERE run_id = :r AND status IN ('ok', 'error', 'timeout') AND review IN ('good', 'bad')"
             " GROUP BY review"), {"r": run_id}).all()
    return {str(r[0]): int(r[1]) for r in rows}
