"""Open items: every alarm that fired leaves "N records failed X between T1 and T2" until it is dealt with (#26).

An alarm row describes a rolling window: when the window recovers, a non-sticky alarm ends, and a run whose
server misbehaved for a stretch would look clean afterwards (3,290 of 20,000 records with empty reasoning, an
Empty-reasoning tile green at 0.0 %, "Problems: none"). An open item is what such a stretch leaves behind:

- One item per (run, check) opens when an alarm on that check is raised (:func:`sync`, called by the writer
  after its alarms, at a run's end, after repairs, flag changes and re-checks). Its numbers come from the
  records, not from the alarm: ``n_records`` finished records that fail the check now and are not flagged bad,
  ``first_t`` / ``last_t`` the first and last of their finish times. Records queued for a re-run are pending,
  so they are not counted; records a re-derive fixed no longer fail.
- It closes by itself when no record fails it any more: ``repaired`` (a re-derive or a re-run after which they
  pass) or ``excluded`` (the ones still failing are all flagged bad, so no export includes them by default).
  A person can close it with a typed reason: ``accepted`` (:func:`accept`; dashboard, CLI, API).
- History is appended, never deleted: a closed item stays closed; when its check fails again afterwards
  (an undo, a flag taken back, or new failures in records finished after an acceptance) a new item opens,
  pointing at the one before (``follows``). Each opening and closing is in the audit log with its actor.

An item whose check never marks records (a chat template that drops reasoning is checked once per run) stays
open while its alarm is active, and closes as ``repaired`` when the alarm ends without records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ...check_catalog import BIT, CHECK_INFO
from ...store import queue as store
from ...store import rows as store_rows

STATES = ("open", "repaired", "excluded", "accepted")
# alarms about transport (errors, timeouts): their records are never exported, so an export names these items
# but does not wait for them
TRANSPORT_CHECKS = frozenset({"timeout", "error"})
MIN_REASON_CHARS = 5
MAX_REASON_CHARS = 2000
SYNC_EVERY_S = 2.0  # the writer brings open items up to date at most this often (and whenever an alarm is raised)
SYNC_SHARE = 0.02  # ... and spends at most this share of its time on it: a large run's recount waits longer

_COLS = ("id, run_id, check_name, alarm_id, follows, since, state, opened_at, updated_at, n_records, n_excluded,"
         " n_queued, n_peak, first_t, last_t, closed_at, closed_by, reason")


class OpenItemError(ValueError):
    """An open item that cannot be changed as asked; the message says why."""


@dataclass(slots=True)
class Counted:
    failing: int
    excluded: int
    first_t: float | None
    last_t: float | None
    queued: int = 0  # queued for a re-run: their earlier output failed the check, the new one is not written yet


def _count_failing_verdicts(conn: Connection, run_id: int, check: str, since: float | None) -> Counted:
    """An extended check (#30): records whose verdict in force is 'fail' (history appended: the latest row wins)."""
    params: dict[str, Any] = {"r": run_id, "c": check}
    where = ""
    if since is not None:
        where, params["s"] = " AND r.finished_at > :s", since
    row = conn.execute(text(
        "SELECT COUNT(*), SUM(CASE WHEN r.review = 'bad' THEN 1 ELSE 0 END),"
        " MIN(CASE WHEN r.review = 'bad' THEN NULL ELSE r.finished_at END),"
        " MAX(CASE WHEN r.review = 'bad' THEN NULL ELSE r.finished_at END)"
        " FROM check_verdict v JOIN record r ON r.id = v.record_id WHERE v.run_id = :r AND v.check_name = :c"
        " AND v.state = 'fail' AND r.status = 'ok' AND NOT EXISTS (SELECT 1 FROM check_verdict w"
        f" WHERE w.record_id = v.record_id AND w.check_name = v.check_name AND w.id > v.id){where}"), params).first()
    if row is None:
        return Counted(0, 0, None, None)
    total, bad = int(row[0] or 0), int(row[1] or 0)
    return Counted(total - bad, bad, row[2], row[3])


def count_failing(conn: Connection, run_id: int, check: str, since: float | None = None, *,
                  reruns: bool = True) -> Counted:
    """Finished records of the run failing `check` now (records flagged bad counted apart), with their time span,
    and records queued for a re-run whose earlier output failed it."""
    if check not in BIT:
        return _count_failing_verdicts(conn, run_id, check, since)
    params: dict[str, Any] = {"r": run_id, "b": BIT[check]}
    where = ""
    if since is not None:
        where, params["s"] = " AND finished_at > :s", since
    row = conn.execute(text(
        "SELECT COUNT(*), SUM(CASE WHEN review = 'bad' THEN 1 ELSE 0 END),"
        " MIN(CASE WHEN review = 'bad' THEN NULL ELSE finished_at END),"
        " MAX(CASE WHEN review = 'bad' THEN NULL ELSE finished_at END)"
        " FROM record WHERE run_id = :r AND status IN ('ok', 'error', 'timeout') AND check_flags != 0"
        f" AND (check_flags & :b) != 0{where}"), params).first()
    if row is None:
        return Counted(0, 0, None, None)
    total, bad = int(row[0] or 0), int(row[1] or 0)
    if not reruns:  # the run has no re-run queued: no need to look through its pending records
        return Counted(total - bad, bad, row[2], row[3])
    hist_since = " AND h.finished_at > :s" if since is not None else ""
    # from the re-run repairs' history rows (indexed by repair), not by scanning the run's pending records
    queued = conn.execute(text(
        "SELECT COUNT(*) FROM record_history h JOIN record r ON r.id = h.record_id AND h.revision = r.revision - 1"
        " WHERE h.repair_id IN (SELECT id FROM repair WHERE run_id = :r AND kind = 'rerun') AND h.action = 'rerun'"
        " AND r.rerun = 1 AND r.status IN ('pending', 'in_flight') AND (h.check_flags & :b) != 0"
        f"{hist_since}"), params).scalar_one()
    return Counted(total - bad, bad, row[2], row[3], int(queued or 0))


def _alarms(conn: Connection, run_id: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in conn.execute(text("SELECT id, rule, raised_at, active FROM alarm WHERE run_id = :r ORDER BY id"),
                          {"r": run_id}).mappings():
        out.setdefault(r["rule"], []).append(dict(r))
    return out


def _latest_items(conn: Connection, run_id: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in conn.execute(text(f"SELECT {_COLS} FROM open_item WHERE run_id = :r ORDER BY id"), {"r": run_id}).mappings():
        out[r["check_name"]] = dict(r)
    return out


def _open_new(conn: Connection, run_id: int, check: str, alarm: dict[str, Any], t: float,
              follows: dict[str, Any] | None, since: float | None, actor: str) -> None:
    c = count_failing(conn, run_id, check, since)
    opened = float(alarm["raised_at"]) if follows is None else t
    conn.execute(text(
        "INSERT INTO open_item (run_id, check_name, alarm_id, follows, since, state, opened_at, updated_at, n_records,"
        " n_excluded, n_queued, n_peak, first_t, last_t) VALUES (:r, :c, :a, :f, :s, 'open', :o, :t, :n, :x, :q, :n,"
        " :t1, :t2)"),
        {"r": run_id, "c": check, "a": alarm["id"], "f": follows["id"] if follows else None, "s": since,
         "o": opened, "t": t, "n": c.failing, "x": c.excluded, "q": c.queued, "t1": c.first_t, "t2": c.last_t})
    after = f" (after item #{follows['id']}, {follows['state']})" if follows else ""
    store.add_event(conn, run_id, "open_item_opened", check, actor=actor,
                    detail=f"{check}: {c.failing:,} records failing, from alarm #{alarm['id']}{after}")


def sync(conn: Connection, run_id: int, *, t: float | None = None, actor: str = "alarm") -> None:
    """Open items for alarms that fired, recount open ones from the records, close those with none left.

    Runs inside the caller's write transaction (the writer's flush, a repair, a flag change, a run's end)."""
    t = time.time() if t is None else t
    reruns = bool(conn.execute(text("SELECT n_rerun FROM run WHERE id = :r"), {"r": run_id}).scalar())
    stopped = stopped_checks(conn, run_id)
    alarms = _alarms(conn, run_id)
    items = _latest_items(conn, run_id)
    for check in sorted(set(alarms) | set(items)):
        rows = alarms.get(check, [])
        active = next((a for a in reversed(rows) if a["active"]), None)
        item = items.get(check)
        if item is None:
            if rows:
                _open_new(conn, run_id, check, rows[0], t, None, None, actor)
            continue
        if item["state"] != "open":
            closed = float(item["closed_at"] or 0.0)
            later = next((a for a in rows if float(a["raised_at"]) > closed), None)
            if item["state"] == "accepted":
                # what was accepted stays accepted; failures in records finished afterwards are a new item
                if later is not None or (active is not None
                                         and count_failing(conn, run_id, check, closed, reruns=reruns).failing):
                    _open_new(conn, run_id, check, later or active or rows[-1], t, item, closed, actor)
            elif later is not None or _any(count_failing(conn, run_id, check, item["since"], reruns=reruns)):
                # repaired / excluded, and now failing again (an undo, a flag taken back, a new alarm)
                _open_new(conn, run_id, check, later or active or rows[-1], t, item, item["since"], actor)
            continue
        c = count_failing(conn, run_id, check, item["since"], reruns=reruns)
        peak = max(int(item["n_peak"] or 0), c.failing)
        # a check that stopped running (disabled, its alarm off) fails nothing: that is no repair (#35); such an item
        # closes as accepted with the override's reason (synthwatch.quality.detection.overrides), or stays open
        if c.failing == 0 and c.queued == 0 and (peak > 0 or active is None) and check not in stopped:
            state = "excluded" if c.excluded else "repaired"
            conn.execute(text(
                "UPDATE open_item SET state = :st, n_records = 0, n_excluded = :x, n_queued = 0, n_peak = :p,"
                " updated_at = :t, closed_at = :t, closed_by = :a WHERE id = :i"),
                {"st": state, "x": c.excluded, "p": peak, "t": t, "a": actor, "i": item["id"]})
            why = (f"the {c.excluded:,} still failing are flagged bad" if state == "excluded"
                   else "no record fails it any more")
            store.add_event(conn, run_id, f"open_item_{state}", item["id"], actor=actor, detail=f"{check}: {why}")
            continue
        if (c.failing, c.excluded, c.queued, c.first_t, c.last_t) != (
                item["n_records"], item["n_excluded"], item["n_queued"], item["first_t"], item["last_t"]):
            conn.execute(text(
                "UPDATE open_item SET n_records = :n, n_excluded = :x, n_queued = :q, n_peak = :p, first_t = :t1,"
                " last_t = :t2, updated_at = :t WHERE id = :i"),
                {"n": c.failing, "x": c.excluded, "q": c.queued, "p": peak, "t1": c.first_t, "t2": c.last_t, "t": t,
                 "i": item["id"]})
    _refresh_status(conn, run_id)


def stopped_checks(conn: Connection, run_id: int) -> set[str]:
    """Checks the run's current settings no longer compute, or whose alarm is off, or that were removed."""
    raw = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
    try:
        checks = (orjson.loads(raw or "{}") or {}).get("checks") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return set()
    if not isinstance(checks, dict):
        return set()
    out = {str(n) for n in checks.get("disabled") or () if isinstance(n, str)}
    for name, ov in (checks.get("rules") or {}).items():
        if isinstance(ov, dict) and ov.get("enabled") is False:
            out.add(str(name))
    expects = (orjson.loads(raw or "{}") or {}).get("reasoning", {}) or {}
    if isinstance(expects, dict) and expects.get("expect") is False:
        out.add("empty_reasoning")
    return out


def sync_wait_s(took_s: float) -> float:
    """How long the writer waits before its next recount after one that took ``took_s``: SYNC_EVERY_S, or longer
    when the recount cost more than SYNC_SHARE of that. A recount reads every failing record of the run
    (:func:`count_failing`): ~33 ms of CPU at 19,000 failing records on the benchmark machine, seconds at a
    million, which every SYNC_EVERY_S would have become most of the writer's thread (#25)."""
    return max(SYNC_EVERY_S, max(took_s, 0.0) / SYNC_SHARE)


def _any(c: Counted) -> bool:
    return bool(c.failing or c.queued)


def sync_run(engine: Engine, run_id: int, *, actor: str = "alarm") -> None:
    """:func:`sync` in a short write transaction of its own."""
    with engine.connect() as conn, store.write_begin(conn):
        sync(conn, run_id, actor=actor)


# ------------------------------------------------------------------------------------------ reading


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


def describe(item: dict[str, Any]) -> str:
    """'3,290 records failed empty_reasoning between 2026-12-02 04:01:10 and 04:03:55' (open or closed)."""
    n = int(item["n_records"] or 0)
    if item["state"] != "open" and item["state"] != "accepted":
        n = int(item["n_peak"] or 0)
    span = ""
    if item.get("first_t"):
        a, b = _when(item["first_t"]), _when(item["last_t"])
        same_day = a[:10] == b[:10]
        span = f" between {a} and {b[11:] if same_day else b}"
    head = f"{n:,} record{'' if n == 1 else 's'} failed {item['check_name']}{span}"
    queued = int(item.get("n_queued") or 0) if item["state"] == "open" else 0
    if not n and queued:
        return f"{queued:,} record{'' if queued == 1 else 's'} that failed {item['check_name']} queued for a re-run"
    if not n and not item.get("first_t"):
        head = f"{item['check_name']}: {CHECK_INFO.get(item['check_name'], 'the check failed')}"
    if queued:
        head += f"; {queued:,} more queued for a re-run"
    return head


def items(conn: Connection, run_id: int, *, include_closed: bool = False) -> list[dict[str, Any]]:
    """The run's open items (and closed ones when asked), newest first, each with `text` in words."""
    where = "" if include_closed else " AND state = 'open'"
    out = []
    for r in conn.execute(text(f"SELECT {_COLS} FROM open_item WHERE run_id = :r{where} ORDER BY id DESC"),
                          {"r": run_id}).mappings():
        d = dict(r)
        d["text"] = describe(d)
        d["transport"] = d["check_name"] in TRANSPORT_CHECKS
        out.append(d)
    return out


def any_open(conn: Connection, run_id: int) -> bool:
    return conn.execute(text("SELECT 1 FROM open_item WHERE run_id = :r AND state = 'open' LIMIT 1"),
                        {"r": run_id}).first() is not None


def accepted_since(conn: Connection, run_id: int) -> dict[str, float]:
    """check -> when its latest item was accepted (an alarm raised before that is covered by the acceptance)."""
    return {str(r[0]): float(r[1]) for r in conn.execute(text(
        "SELECT check_name, MAX(closed_at) FROM open_item WHERE run_id = :r AND state = 'accepted'"
        " GROUP BY check_name"), {"r": run_id})}


def open_counts(conn: Connection) -> dict[int, tuple[int, int]]:
    """run id -> (open items, records still failing in them), for the runs list."""
    return {int(r[0]): (int(r[1]), int(r[2] or 0)) for r in conn.execute(text(
        "SELECT run_id, COUNT(*), SUM(n_records) FROM open_item WHERE state = 'open' GROUP BY run_id"))}


def spans(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """Each alarm's time span for the charts: from its records' first to last failure (its item's span), or
    from when it was raised to when it ended (still going: until now)."""
    first_last = {r[0]: (r[1], r[2]) for r in conn.execute(text(
        "SELECT alarm_id, first_t, last_t FROM open_item WHERE run_id = :r"), {"r": run_id})}
    out = []
    for r in conn.execute(text("SELECT id, rule, title, severity, raised_at, updated_at, active FROM alarm"
                               " WHERE run_id = :r ORDER BY id"), {"r": run_id}).mappings():
        t0, t1 = float(r["raised_at"]), (None if r["active"] else float(r["updated_at"]))
        fl = first_last.get(r["id"])
        if fl and fl[0]:
            t0 = min(t0, float(fl[0]))
            t1 = None if r["active"] else max(t1 or 0.0, float(fl[1] or 0.0))
        out.append({"id": r["id"], "rule": r["rule"], "title": r["title"], "severity": r["severity"],
                    "t0": t0, "t1": t1, "active": bool(r["active"])})
    return out


def _completion_text(rows: list[dict[str, Any]]) -> str | None:
    rows = sorted(rows, key=lambda i: (i["transport"], -int(i["n_records"] or 0)))
    parts = [f"{int(i['n_records']):,} record{'' if i['n_records'] == 1 else 's'} failing {i['check_name']}"
             for i in rows if i["n_records"]]
    parts += [f"an open {i['check_name']} problem" for i in rows if not i["n_records"] and not i["n_queued"]]
    for i in rows:  # not failing: their new answers are not written yet
        if i["n_queued"]:
            q = int(i["n_queued"])
            parts.append(f"{q:,} record{'' if q == 1 else 's'} queued for a re-run ({i['check_name']})")
    return "completed with " + ", ".join(parts) if parts else None


def completion_message(conn: Connection, run_id: int) -> str | None:
    """'completed with 3,290 records failing empty_reasoning, …' when open items remain at a run's end (counting
    records still failing: one queued for a re-run is not), else None."""
    sync(conn, run_id, actor="worker")
    return _completion_text(items(conn, run_id))


def open_items_text(conn: Connection, run_id: int) -> str | None:
    """What a completed run's status says of its open items as they are stored (no recount: a reader's call)."""
    return _completion_text(items(conn, run_id))


def _refresh_status(conn: Connection, run_id: int) -> None:
    """A completed run's status message follows its open items (a re-run queued, records repaired, an item
    accepted): it never goes on saying records fail that no longer do. What the run said at its end is kept."""
    row = conn.execute(text("SELECT status, status_message FROM run WHERE id = :r"), {"r": run_id}).first()
    if row is None or row[0] != "completed":
        return
    msg = row[1] or ""
    rest = msg
    if msg.startswith("completed with "):
        _head, _sep, rest = msg.partition(" (")
        rest = rest[:-1] if rest.endswith(")") else rest
    head = _completion_text(items(conn, run_id))
    new = (head + (f" ({rest})" if rest else "")) if head else (rest or None)
    if new != row[1]:
        conn.execute(text("UPDATE run SET status_message = :m WHERE id = :r"), {"m": new, "r": run_id})


# ------------------------------------------------------------------------------------------ accepting


def accept(engine: Engine, run_id: int, item_id: int, reason: str | None, *, actor: str) -> dict[str, Any]:
    """Close an open item with a typed reason (kept on the item and in the audit log with the actor)."""
    why = (reason or "").strip()
    if len(why) < MIN_REASON_CHARS:
        raise OpenItemError(f"accepting an open item needs a reason of at least {MIN_REASON_CHARS} characters"
                            " (it is kept with the item and in the audit log)")
    why = why[:MAX_REASON_CHARS]
    with engine.connect() as conn, store.write_begin(conn):
        sync(conn, run_id, actor=actor)
        row = conn.execute(text(f"SELECT {_COLS} FROM open_item WHERE id = :i AND run_id = :r"),
                           {"i": item_id, "r": run_id}).mappings().first()
        if row is None:
            raise OpenItemError(f"run {run_id} has no open item {item_id}")
        if row["state"] != "open":
            raise OpenItemError(f"open item {item_id} is already closed ({row['state']})")
        t = time.time()
        store_rows.write(conn, "open_item", [{"t": t, "a": actor, "why": why, "i": item_id}])
        why = store_rows.clean("open_item", {"why": why})["why"]
        item = {**dict(row), "state": "accepted", "closed_at": t, "closed_by": actor, "reason": why}
        store.add_event(conn, run_id, "accept_open_item", item_id, actor=actor,
                        detail=f"{describe(item)}: {why}"[:MAX_REASON_CHARS])
        _refresh_status(conn, run_id)
    item["text"] = describe(item)
    return item
