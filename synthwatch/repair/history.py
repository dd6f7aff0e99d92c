"""A repaired record's history, the run's repairs, and undo (see synthwatch.repair.actions for the repairs themselves).

Undo is itself a repair: the output it replaces goes to the history first, so nothing is ever lost."""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..check_catalog import BIT, CHECK_NAMES
from ..quality.checks import applied_bits
from ..review.filters import Filters
from ..store import queue as store
from ..store import search_index
from .actions import (
    CHUNK,
    OUTPUT_COLS,
    RepairError,
    Selection,
    copy_to_history,
    finish,
    record_rows,
    run_info,
    start_repair,
)


def history(conn: Connection, record_id: int) -> list[dict[str, Any]]:
    """A record's earlier outputs, newest first, each with the repair that replaced it."""
    rows = conn.execute(text(
        f"SELECT h.id, h.revision, h.t, h.action, h.repair_id, r.actor, {', '.join('h.' + c for c in OUTPUT_COLS)}"
        " FROM record_history h LEFT JOIN repair r ON r.id = h.repair_id WHERE h.record_id = :i"
        " ORDER BY h.revision DESC, h.id DESC"), {"i": record_id}).mappings().all()
    return [dict(r) for r in rows]


def list_repairs(conn: Connection, run_id: int, limit: int = 50) -> list[dict[str, Any]]:
    out = []
    for r in conn.execute(text(
            "SELECT id, kind, t, actor, selection, config_version, n_selected, n_changed, n_skipped, status,"
            " undone_at, undo_of FROM repair WHERE run_id = :r ORDER BY id DESC LIMIT :n"),
            {"r": run_id, "n": limit}).mappings():
        d = dict(r)
        try:
            d["selection"] = orjson.loads(d["selection"]).get("description")
        except (orjson.JSONDecodeError, AttributeError):
            pass
        d["can_undo"] = d["kind"] in ("rederive", "rerun") and d["status"] == "done" and not d["undone_at"]
        out.append(d)
    return out


def undo(engine: Engine, run_id: int, repair_id: int, *, actor: str = "cli") -> dict[str, Any]:
    """Undo a re-derive (or a re-run whose records were not generated again yet): each record the repair changed,
    and that nothing changed since, gets its earlier output back. The current output goes to history first."""
    with engine.connect() as conn:
        rep = conn.execute(text("SELECT kind, status, undone_at, config_version FROM repair WHERE id = :i"
                                " AND run_id = :r"), {"i": repair_id, "r": run_id}).first()
        conn.rollback()
    if rep is None:
        raise RepairError(f"run {run_id} has no repair {repair_id}")
    kind, status, undone_at, _version = rep
    if kind not in ("rederive", "rerun") or status != "done":
        raise RepairError(f"repair {repair_id} is a {status} {kind}: only a finished re-derive or re-run can be"
                          " undone")
    if undone_at:
        raise RepairError(f"repair {repair_id} was already undone")
    sel = Selection(f"undo of repair #{repair_id}", Filters(), 0)
    with engine.connect() as conn, store.write_begin(conn):
        _run, _cfg, version = run_info(conn, run_id)
        undo_id = start_repair(conn, run_id, "undo", sel, version, actor, undo_of=repair_id)
    fail_d = dict.fromkeys(CHECK_NAMES, 0)
    total_d = dict.fromkeys(CHECK_NAMES, 0)
    restored = skipped = 0
    last = 0
    expects = True
    while True:
        with engine.connect() as conn:
            hist = [dict(r) for r in conn.execute(text(
                f"SELECT h.id AS hid, h.record_id, h.revision AS hrev, {', '.join('h.' + c for c in OUTPUT_COLS)}"
                " FROM record_history h WHERE h.repair_id = :rep AND h.id > :last ORDER BY h.id LIMIT :n"),
                {"rep": repair_id, "last": last, "n": CHUNK}).mappings()]
            expects = bool(conn.execute(text("SELECT expects_reasoning FROM run WHERE id = :r"),
                                        {"r": run_id}).scalar())
            conn.rollback()
        if not hist:
            break
        last = hist[-1]["hid"]
        t = time.time()
        with engine.connect() as conn, store.write_begin(conn):
            store.lock_run(conn, run_id)
            cur = {r["id"]: r for r in record_rows(conn, [h["record_id"] for h in hist])}
            ok_ids = []
            for h in hist:
                c = cur.get(h["record_id"])
                # only a record still as this repair left it: one revision later, and for a re-run still queued
                if c is None or c["revision"] != h["hrev"] + 1 or (kind == "rerun" and c["status"] != "pending"):
                    skipped += 1
                    continue
                ok_ids.append(h["record_id"])
            if not ok_ids:
                continue
            copy_to_history(conn, ok_ids, "undo", undo_id, t)
            search_index.unindex(conn, ok_ids)
            by = {"ok": 0, "error": 0, "timeout": 0}
            turns_d = 0
            for h in hist:
                if h["record_id"] not in ok_ids:
                    continue
                c = cur[h["record_id"]]
                cols = {k: h[k] for k in OUTPUT_COLS}
                if cols["turns_done"] is None:  # kept before turns were counted: one turn, done when ok
                    cols["turns_done"] = int(cols["status"] == "ok")
                turns_d += cols["turns_done"] - (c["turns_done"] or 0)
                conn.execute(text(
                    f"UPDATE record SET {', '.join(f'{k} = :{k}' for k in OUTPUT_COLS)}, revision = revision + 1,"
                    " rerun = 0, rnd = CASE WHEN rnd < 0 THEN :rnd ELSE rnd END WHERE id = :id"),
                    {**cols, "id": h["record_id"], "rnd": random.random()})
                for name in CHECK_NAMES:
                    b = BIT[name]
                    fail_d[name] += bool((h["check_flags"] or 0) & b) - bool((c["check_flags"] or 0) & b)
                    if kind == "rerun":
                        total_d[name] += bool(applied_bits(h["status"], h["reasoning_tokens"], expects) & b)
                if kind == "rerun":
                    by[h["status"]] += 1
            if kind == "rerun":
                k = sum(by.values())
                conn.execute(text(
                    "UPDATE run SET n_ok = n_ok + :ok, n_error = n_error + :err, n_timeout = n_timeout + :to,"
                    " n_pending = n_pending - :k, n_rerun = n_rerun - :k, updated_at = :t WHERE id = :r"),
                    {"ok": by["ok"], "err": by["error"], "to": by["timeout"], "k": k, "t": t, "r": run_id})
            if turns_d:
                conn.execute(text("UPDATE run SET n_turns_done = n_turns_done + :d WHERE id = :r"),
                             {"d": turns_d, "r": run_id})
            search_index.enqueue(conn, ok_ids)
            restored += len(ok_ids)
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE repair SET undone_at = :t WHERE id = :i"), {"t": time.time(), "i": repair_id})
    out: dict[str, Any] = {"selected": restored + skipped, "changed": restored, "cannot": skipped,
                           "selection": f"undo of repair #{repair_id}"}
    finish(engine, run_id, undo_id, "undo", out, fail_d, actor, total_d)
    return {"repair_id": undo_id, "undid": repair_id, "restored": restored,
            "skipped": skipped, "skipped_why": "changed again since" if skipped else None}
