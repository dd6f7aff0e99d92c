"""Alarm rules: thresholds over the checks' rolling windows, alarm rows, auto-pause, notifications.

One rule per check (same name). A rule fires when, over the last ``window`` records the check
applied to (once at least ``min_records`` were seen), the failing share is at least ``threshold``
(``threshold = 0``: any failure). While it fires, one active ``alarm`` row per (run, rule) is kept
up to date; when it stops firing the row becomes inactive, except for *sticky* rules (field
mismatch, canary, drift, template), which stay until acknowledged or a recompute clears them.
A rule with ``auto_pause`` marks its alarm row ``auto_paused`` (and pauses the run) when the failing share
reaches ``pause_threshold`` over at least ``pause_min_records`` records. From then on the pause is a state,
not an event: the claim itself (synthwatch.store.queue.alarm_gate, which asks windows.claim_gate) refuses
while that alarm is open and not snoozed, whatever resumed the run. An acknowledgement snoozes it: for N records or M minutes
(``acknowledge(..., for_records=, for_minutes=)``, "Acknowledge and resume"), or until the check fails again.
The words of an alarm are in synthwatch.quality.alarm_text.

The web app reads alarms with :func:`banner_alarms` / :func:`list_alarms` and writes only the
acknowledgement (:func:`acknowledge`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ...check_catalog import DEFAULT_RULES, Rule, RuleOverride, extended_rule
from ...store import queue as store
from ...store import rows as store_rows
from ...store.dashboards import dashboard_url
from ..alarm_text import describe, hint_ctx, server_said
from ..selection import UnknownCheck, catalogue
from ..verdicts import configured_checks
from .windows import MAX_ACK_MINUTES, MAX_ACK_RECORDS, Hysteresis, RuleState, load_states, save_state, step

log = logging.getLogger("synthwatch.alarms")

SEVERITIES = ("warning", "error")




# Symptoms of a field mismatch: while that alarm is active they raise no alarm of their own, so the
# banner names the cause once instead of listing its consequences.
MISMATCH_SYMPTOMS = frozenset({"empty_reasoning", "reasoning_tokens_no_text", "think_tags_in_content",
                               "both_empty_with_tokens", "token_count_mismatch"})


# Which alarm explains which: a symptom alarm raised before its cause (or kept sticky) is shown under the cause's
# card and strip entry instead of as a second card describing the same records (#28 item 1).
ALARM_CAUSES: dict[str, tuple[str, ...]] = {
    **{name: ("field_mismatch",) for name in MISMATCH_SYMPTOMS},
    "canary_failed": ("field_mismatch",),
    "truncated_in_reasoning": ("truncated",),
}


def group_alarms(alarms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alarms as causes, each with its open symptom alarms under ``symptoms`` (the input order kept: errors first).

    An alarm whose cause is not open stands on its own; every alarm appears exactly once."""
    by_rule = {a["rule"]: a for a in alarms}
    cause_of: dict[int, str] = {}
    for a in alarms:
        for cause in ALARM_CAUSES.get(a["rule"], ()):
            if cause in by_rule and cause != a["rule"]:
                cause_of[a["id"]] = cause
                break
    out: list[dict[str, Any]] = []
    for a in alarms:
        if a["id"] in cause_of:
            continue
        group = dict(a)
        group["symptoms"] = [s for s in alarms if cause_of.get(s["id"]) == a["rule"]]
        if any(s["severity"] == "error" for s in group["symptoms"]):
            group["worst"] = "error"
        else:
            group["worst"] = a["severity"]
        out.append(group)
    out.sort(key=lambda g: g["worst"] != "error")  # stable: errors first, the input order within
    return out


def worst_severity(alarms: list[dict[str, Any]]) -> str | None:
    if not alarms:
        return None
    return "error" if any(a["severity"] == "error" for a in alarms) else "warning"


def effective_rules(overrides: dict[str, RuleOverride]) -> dict[str, Rule]:
    out = dict(DEFAULT_RULES)
    for name, ov in overrides.items():
        if name not in out:  # an extended check's rule (synthwatch.quality.extended keeps those)
            continue
        changes = {k: v for k, v in ov.model_dump().items() if v is not None}
        if changes:
            out[name] = replace(out[name], **changes)
    return out


def rules_for(names: list[str], overrides: dict[str, RuleOverride]) -> dict[str, Rule]:
    """The rules of extended checks (#30): each one's default rule (check_catalog.extended_rule) with the run's
    overrides, exactly as a built-in rule is changed."""
    out: dict[str, Rule] = {}
    for name in names:
        rule = extended_rule(name)
        ov = overrides.get(name)
        changes = {k: v for k, v in ov.model_dump().items() if v is not None} if ov is not None else {}
        out[name] = replace(rule, **changes) if changes else rule
    return out


def fires(rule: Rule, fail: int, total: int) -> bool:
    return total >= rule.min_records and fail >= 1 and fail >= rule.threshold * total


def should_pause(rule: Rule, fail: int, total: int) -> bool:
    return (rule.auto_pause and total >= max(rule.pause_min_records, 1) and fail >= 1
            and fail >= rule.pause_threshold * total)


# ------------------------------------------------------------------------------------ evaluation


@dataclass(slots=True)
class ActiveAlarm:
    id: int
    count: int
    auto_paused: bool
    message: str
    acked_at: float | None = None
    bounded: bool = False  # acknowledged for N records or M minutes: the claim ends the snooze, not a failure


# Alarms about the data itself: a run that ends with one of these open is not a plain "completed".
TRANSPORT_RULES = frozenset({"timeout", "error"})


class AlarmKeeper:
    """Keeps the alarm rows of one run in step with the rules; used inside the writer's transaction."""

    def __init__(self, run_id: int, run_name: str, notifier: Any = None, dashboard_url: str = "") -> None:
        self.run_id = run_id
        self.run_name = run_name
        self.notifier = notifier
        self.dashboard_url = dashboard_url.rstrip("/")
        self.found_url = ""  # without a configured base: the running dashboard's (store.dashboards), at refresh
        self.active: dict[str, ActiveAlarm] = {}
        self.no_pause: set[str] = set()  # checks whose auto-pause a person turned off (pause_override)
        self.loaded = False
        self.paused = False  # set when an evaluation paused the run (the writer tells its worker at once)
        self.hysteresis = Hysteresis()  # the run's [checks] alarm_pending_records / alarm_clear_records

    def read_active(self, conn: Connection) -> None:
        """The run's open alarms as stored: whichever worker raised them (every worker of a run shares them)."""
        self.active = {}
        for aid, rule, count, paused, msg, acked, until, upto in conn.execute(
            text("SELECT id, rule, count, auto_paused, message, acked_at, snooze_until, snooze_records FROM alarm"
                 " WHERE run_id = :r AND active ORDER BY id"), {"r": self.run_id},
        ):
            self.active[rule] = ActiveAlarm(aid, count, bool(paused), msg, acked,
                                            until is not None or upto is not None)

    def load(self, conn: Connection) -> None:
        self.read_active(conn)
        self.no_pause = active_overrides(conn, self.run_id)
        self.found_url = "" if self.dashboard_url else (dashboard_url(conn) or "")
        self.loaded = True

    def refresh(self, conn: Connection) -> None:
        """Acknowledgements, snoozes and auto-pause overrides are written by the dashboard, the CLI and the claim
        (a snooze that is over): read them again."""
        rows = {r[0]: r for r in conn.execute(
            text("SELECT id, acked_at, snooze_until, snooze_records FROM alarm WHERE run_id = :r AND active"),
            {"r": self.run_id})}
        for cur in self.active.values():
            r = rows.get(cur.id)
            if r is not None:
                cur.acked_at, cur.bounded = r[1], r[2] is not None or r[3] is not None
        self.no_pause = active_overrides(conn, self.run_id)
        self.found_url = "" if self.dashboard_url else (dashboard_url(conn) or "")

    def evaluate(
        self,
        conn: Connection,
        t: float,
        rules: dict[str, Rule],
        windows: dict[str, tuple[int, int]],
        run_stats: dict[str, tuple[int, int, int | None]],
        details: dict[str, dict[str, Any]],
        *,
        allow_pause: bool = True,
        clear_sticky: bool = False,
        only: set[str] | None = None,
        new_fail: dict[str, float] | None = None,
    ) -> list[str]:
        """Raise, update or clear alarms; returns the names of rules that raised a new alarm.

        windows: rule -> (fail, total) over the rule's window; run_stats: check -> (n_fail, n_total,
        example_record_id) for the whole run; details: check -> latest failure's details; new_fail: check ->
        the latest finish time of a failing record written in this flush.

        An acknowledgement is a snooze: when a rule of an acknowledged alarm still fires and a record that
        finished after the acknowledgement fails it again, that alarm row ends and a new one is raised (banner,
        webhook, and auto-pause again), pointing back at the acknowledged one.
        """
        if not self.loaded:
            self.load(conn)
        else:
            self.read_active(conn)
            if new_fail:
                self.refresh(conn)
        new_fail = new_fail or {}
        raised: list[str] = []
        states = load_states(conn, self.run_id)  # hysteresis, shared by every worker of the run (detection.py)
        for name, rule in rules.items():
            if only is not None and name not in only:
                continue
            fail, total = windows.get(name, (0, 0))
            n_fail, n_total, example = run_stats.get(name, (0, 0, None))
            cur = self.active.get(name)
            firing = rule.enabled and fires(rule, fail, total)
            st = states.get(name) or RuleState()
            before = (st.pending_from, st.clear_from)
            if not firing:
                end = False
                if cur is not None and (not rule.enabled or clear_sticky):
                    end, st.pending_from, st.clear_from = True, None, None
                elif cur is not None and not rule.sticky and total >= rule.min_records:
                    end = step(self.hysteresis, st, firing=False, active=True, n=n_total, immediate=False) == "clear"
                else:
                    st.pending_from = None
                if end and cur is not None:
                    conn.execute(text("UPDATE alarm SET active = false, updated_at = :t WHERE id = :i"),
                                 {"t": t, "i": cur.id})
                    del self.active[name]
                if (st.pending_from, st.clear_from) != before:
                    save_state(conn, self.run_id, name, st)
                continue
            if cur is None and name in MISMATCH_SYMPTOMS and "field_mismatch" in self.active:
                continue
            # one failure is proof (threshold 0), or the pause line is reached: no pending period
            # (a whole re-check, clear_sticky, is settled evidence; a share at least twice the threshold is no flap:
            # no pending period either)
            immediate = clear_sticky or rule.threshold <= 0 or fail >= 2 * rule.threshold * total or (allow_pause and name not in self.no_pause
                                                and should_pause(rule, fail, total))
            act = step(self.hysteresis, st, firing=True, active=cur is not None, n=n_total, immediate=immediate)
            if (st.pending_from, st.clear_from) != before:
                save_state(conn, self.run_id, name, st)
            if act == "hold":
                continue
            ctx = dict(details.get(name) or {})
            if name in TRANSPORT_RULES:
                said = self._server_said(conn, name)
                if said:
                    ctx["server_said"] = said
            # without the evidence (a reload after a settings change or a repair dropped the latest details) a
            # field mismatch keeps the words it has: describing it from nothing proposed "auto (or auto)"
            if name == "field_mismatch" and not ctx.get("fields") and example is not None:
                ctx = {"fields": self._example_fields(conn, example)} if cur is None else ctx
            keep = name == "field_mismatch" and not ctx.get("fields")
            message, fix = describe(rule, fail, total, n_fail, n_total,
                                    {**ctx, **hint_ctx(self.run_name, conn)})
            ev = None if keep else orjson.dumps(
                {"ctx": {k: v for k, v in ctx.items() if isinstance(v, (str, int, float, list)) or v is None},
                 "counts": [fail, total, n_fail, n_total]}).decode()
            count = n_fail or fail
            pause = allow_pause and name not in self.no_pause and should_pause(rule, fail, total)
            reraised_from = None
            if (cur is not None and cur.acked_at is not None and not cur.bounded
                    and new_fail.get(name, 0.0) > cur.acked_at):
                # the snooze is over: the condition came back in records finished after the acknowledgement
                conn.execute(text("UPDATE alarm SET active = false, updated_at = :t WHERE id = :i"),
                             {"t": t, "i": cur.id})
                store.add_event(conn, self.run_id, "alarm_reraised", cur.id, actor="alarm",
                                detail=f"{name}: failing again after the acknowledgement")
                reraised_from, cur = cur.id, None
                del self.active[name]
            if cur is None:
                # its message and evidence may quote a check's or a judge's words: the store's one way in
                aid = int(store_rows.write(conn, "alarm", [
                    {"r": self.run_id, "rule": name, "sev": rule.severity, "title": rule.title, "msg": message,
                     "fix": fix, "count": count, "ex": example, "t": t, "prev": reraised_from, "ev": ev}])[0])
                cur = self.active[name] = ActiveAlarm(aid, count, False, message)
                raised.append(name)
                self._notify("alarm", rule, cur.id, message, fix, fail, total, n_fail, n_total, example)
            elif keep and cur.count != count:
                conn.execute(text("UPDATE alarm SET count = :count, example_record_id = COALESCE(:ex,"
                                  " example_record_id), updated_at = :t WHERE id = :i"),
                             {"count": count, "ex": example, "t": t, "i": cur.id})
                cur.count = count
            elif not keep and (cur.count != count or cur.message != message):
                conn.execute(
                    text("UPDATE alarm SET count = :count, message = :msg, fix = :fix, severity = :sev,"
                         " example_record_id = COALESCE(:ex, example_record_id), updated_at = :t,"
                         " evidence_json = :ev WHERE id = :i"),
                    store_rows.clean("alarm", {"count": count, "msg": message, "fix": fix, "sev": rule.severity,
                                               "ex": example, "t": t, "ev": ev, "i": cur.id}),
                )
                cur.count, cur.message = count, message
            if pause and not cur.auto_paused:
                cur.auto_paused = True
                conn.execute(text("UPDATE alarm SET auto_paused = true WHERE id = :i"), {"i": cur.id})
                paused = conn.execute(
                    text("UPDATE run SET desired = 'pause', updated_at = :t WHERE id = :r AND desired = 'run'"),
                    {"t": t, "r": self.run_id},
                ).rowcount
                if paused:
                    self.paused = True
                    store.add_event(conn, self.run_id, "pause", None, actor="alarm",
                                    detail=f"{name}: {rule.title}. {message}")
                    self._notify("auto_pause", rule, cur.id, message, fix, fail, total, n_fail, n_total, example)
        return raised

    def would_pause(self, rules: dict[str, Rule], windows: dict[str, tuple[int, int]],
                    new_fail: dict[str, float]) -> bool:
        """Whether evaluating now could pause the run (checked before a claim is answered: True writes the
        records at once, so that the alarm lands before the next claim).

        An alarm that already paused the run counts too when this writer's copy says it is not acknowledged:
        the copy may predate an acknowledgement, and a failure after it re-raises the alarm. Only a bounded
        snooze (the claim ends it) or an acknowledgement older than none of these failures is left alone."""
        for name in new_fail:
            rule = rules.get(name)
            if rule is None or not rule.enabled or name in self.no_pause:
                continue
            fail, total = windows.get(name, (0, 0))
            if not (fires(rule, fail, total) and should_pause(rule, fail, total)):
                continue
            cur = self.active.get(name)
            if cur is None or not cur.auto_paused or cur.acked_at is None:
                return True
            if not cur.bounded and new_fail[name] > cur.acked_at:
                return True
        return False

    def _example_fields(self, conn: Connection, record_id: int) -> list[str]:
        """The fields a field mismatch found in its example record (the evidence, when a repair's reload has none)."""
        row = conn.execute(text("SELECT check_json FROM record WHERE id = :i"), {"i": record_id}).first()
        try:
            det = orjson.loads(row[0]) if row is not None and row[0] else {}
        except orjson.JSONDecodeError:
            return []
        fm = det.get("field_mismatch") if isinstance(det, dict) else None
        fields = fm.get("fields") if isinstance(fm, dict) else None
        return sorted(str(f) for f in fields) if isinstance(fields, list) else []

    def _server_said(self, conn: Connection, name: str) -> str:
        """The latest final failure's own text (HTTP status and the server's message), redacted and bounded."""
        kinds = "IN" if name == "timeout" else "NOT IN"
        row = conn.execute(text(f"SELECT message FROM error_event WHERE run_id = :r AND final AND kind {kinds}"
                                " ('timeout', 'idle_timeout', 'connect_timeout') ORDER BY id DESC LIMIT 1"),
                           {"r": self.run_id}).first()
        return server_said(row[0]) if row is not None and row[0] else ""

    def _notify(self, event: str, rule: Rule, alarm_id: int, message: str, fix: str, fail: int, total: int,
                n_fail: int, n_total: int, example: int | None) -> None:
        base = self.dashboard_url or self.found_url
        link = f"{base}/runs/{self.run_id}" if base else f"/runs/{self.run_id}"
        payload = {
            "event": event,
            "run": {"id": self.run_id, "name": self.run_name},
            "alarm": {"id": alarm_id, "rule": rule.name, "severity": rule.severity, "title": rule.title,
                      "message": message, "fix": fix, "auto_pause": rule.auto_pause},
            "counts": {"window_fail": fail, "window_total": total, "run_fail": n_fail, "run_total": n_total},
            "example_record_id": example,
            "example_link": f"{link}/records/{example}" if example is not None else None,
            "link": link,
            "t": time.time(),
        }
        if self.notifier is not None:
            self.notifier.send(payload)
        else:
            log.warning("ALARM run %r: %s. %s", self.run_name, rule.title, message)


# ------------------------------------------------------------------------------------ web side

_ALARM_COLS = ("id, run_id, rule, severity, title, message, fix, count, example_record_id, raised_at, updated_at,"
               " acked_at, acked_by, active, auto_paused, reraised_from, evidence_json")


def banner_alarms(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """Active, unacknowledged alarms: errors first, newest first (indexed by ix_alarm_run)."""
    rows = conn.execute(
        text(f"SELECT {_ALARM_COLS} FROM alarm WHERE run_id = :r AND active AND acked_at IS NULL"
             " ORDER BY id DESC LIMIT 50"), {"r": run_id},
    ).mappings().all()
    out = [dict(r) for r in rows]
    out.sort(key=lambda a: (a["severity"] != "error", -a["id"]))
    return out


def list_alarms(conn: Connection, run_id: int, limit: int = 200) -> list[dict[str, Any]]:
    rows = conn.execute(
        text(f"SELECT {_ALARM_COLS} FROM alarm WHERE run_id = :r ORDER BY id DESC LIMIT :n"),
        {"r": run_id, "n": limit},
    ).mappings().all()
    return [dict(r) for r in rows]


class AlarmNotFound(LookupError):
    pass


def acknowledge(engine: Engine, run_id: int, alarm_id: int, actor: str = "ui", *, for_records: int | None = None,
                for_minutes: float | None = None) -> dict[str, Any]:
    """Snooze an alarm. Without a bound the banner hides it until its check fails again in records finished after
    now (a new alarm is raised then, pausing again); with ``for_records`` / ``for_minutes`` the claim lets that
    many more records (or minutes) through and then pauses again if the check failed since. Returns what was
    snoozed and until when (``until``: words)."""
    if for_records is not None and for_minutes is not None:
        raise store.ControlError("acknowledge for a number of records or a number of minutes, not both")
    with engine.connect() as conn, store.write_begin(conn):
        store.lock_run(conn, run_id)
        row = conn.execute(text("SELECT id, rule, acked_at, acked_by, active, title, auto_paused FROM alarm WHERE id = :i"
                                " AND run_id = :r"), {"i": alarm_id, "r": run_id}).first()
        if row is None:
            raise AlarmNotFound(f"run {run_id} has no alarm {alarm_id}")
        t = time.time()
        total, pending = conn.execute(text("SELECT total, n_pending FROM run WHERE id = :r"), {"r": run_id}).one()
        claimed = int(total or 0) - int(pending or 0)
        until = upto = None
        if for_minutes is not None:
            if not 0 < float(for_minutes) <= MAX_ACK_MINUTES:
                raise store.ControlError(f"acknowledge for more than 0 and at most {MAX_ACK_MINUTES:,} minutes,"
                                         f" got {for_minutes}")
            until = t + float(for_minutes) * 60
        if for_records is not None:
            if not 1 <= int(for_records) <= MAX_ACK_RECORDS:
                raise store.ControlError(f"acknowledge for 1 to {MAX_ACK_RECORDS:,} records, got {for_records}")
            upto = claimed + int(for_records)
        already = row[2] is not None and until is None and upto is None
        if not already:
            conn.execute(text("UPDATE alarm SET acked_at = :t, acked_by = :a, snooze_until = :u, snooze_records = :n"
                              " WHERE id = :i"), {"t": t, "a": actor, "u": until, "n": upto, "i": alarm_id})
        info = {"id": alarm_id, "rule": row[1], "title": row[5], "active": bool(row[4]), "auto_paused": bool(row[6]),
                "acked_at": row[2] if already else t, "acked_by": row[3] if already else actor,
                "snooze_until": until, "snooze_records": upto, "already": already}
        info["until"] = snooze_words(info, claimed)
        if not already:
            store.add_event(conn, run_id, "ack_alarm", alarm_id, actor=actor,
                            detail=f"{row[1]}: snoozed {info['until']}")
    return info


def snooze_words(alarm: dict[str, Any], claimed: int | None = None) -> str:
    """Until when an acknowledged alarm is snoozed, in words."""
    if alarm.get("snooze_until") is not None:
        left = max(0.0, float(alarm["snooze_until"]) - time.time())
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(alarm["snooze_until"])))
        return f"until {at} ({left / 60:.0f} min from now), then it holds the run again if it is still open"
    if alarm.get("snooze_records") is not None:
        n = int(alarm["snooze_records"])
        more = f", {max(0, n - claimed):,} to go" if claimed is not None else ""
        return (f"until the run has claimed {n:,} records{more}, then it holds the run again if it is still open")
    if alarm.get("auto_paused"):
        return ("off the banner only: it paused the run, and an acknowledgement without a number of records or"
                " minutes does not let the run go on")
    return "until its check fails again in a record finished after the acknowledgement (a new alarm then)"


def snoozed_alarms(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """Open alarms a person acknowledged: still open (export still asks about them), not on the banner."""
    rows = conn.execute(
        text(f"SELECT {_ALARM_COLS}, snooze_until, snooze_records FROM alarm WHERE run_id = :r AND active"
             " AND acked_at IS NOT NULL ORDER BY id DESC LIMIT 50"), {"r": run_id}).mappings().all()
    total, pending = conn.execute(text("SELECT total, n_pending FROM run WHERE id = :r"), {"r": run_id}).one()
    out = []
    for r in rows:
        a = dict(r)
        a["until"] = snooze_words(a, int(total or 0) - int(pending or 0))
        out.append(a)
    return out


# ------------------------------------------------------------------------------------ auto-pause overrides


class OverrideError(ValueError):
    pass


MIN_REASON_CHARS = 5


def active_overrides(conn: Connection, run_id: int) -> set[str]:
    return {r[0] for r in conn.execute(
        text("SELECT check_name FROM pause_override WHERE run_id = :r AND ended_at IS NULL"), {"r": run_id})}


def list_overrides(conn: Connection, run_id: int, *, active_only: bool = True) -> list[dict[str, Any]]:
    where = " AND ended_at IS NULL" if active_only else ""
    return [dict(r) for r in conn.execute(
        text("SELECT id, check_name, reason, actor, created_at, ended_at, ended_by FROM pause_override"
             f" WHERE run_id = :r{where} ORDER BY id DESC"), {"r": run_id}).mappings()]


def set_auto_pause(engine: Engine, run_id: int, check: str, on: bool, *, reason: str | None = None,
                   actor: str = "ui") -> dict[str, Any]:
    """Turn auto-pause off (with a typed reason) or back on for one check of a run; both go to the audit log."""
    if check not in DEFAULT_RULES:
        with engine.connect() as conn:
            cfg = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
            cat = catalogue(conn, run_id)
            conn.rollback()
        known = [*DEFAULT_RULES, *configured_checks(cfg)]  # the run's extended checks have rules too (#30)
        try:  # the run's one catalogue of names (#38): aliases such as verify:math, and "did you mean"
            check = cat.resolve(check)
        except UnknownCheck as exc:
            raise OverrideError(str(exc)) from None
        if check not in known:
            raise OverrideError(f"{check} has no alarm rule in this run, so no auto-pause to turn on or off (checks "
                                f"with one: {', '.join(known)})")
    reason = (reason or "").strip()
    if not on and len(reason) < MIN_REASON_CHARS:
        raise OverrideError(f"turning auto-pause off for {check} needs a reason of at least {MIN_REASON_CHARS}"
                            " characters (it is kept in the audit log and shown on the run page)")
    with engine.connect() as conn, store.write_begin(conn):
        if conn.execute(text("SELECT id FROM run WHERE id = :r"), {"r": run_id}).first() is None:
            raise store.NotFound(f"no run {run_id}")
        open_ids = [r[0] for r in conn.execute(
            text("SELECT id FROM pause_override WHERE run_id = :r AND check_name = :c AND ended_at IS NULL"),
            {"r": run_id, "c": check})]
        t = time.time()
        if on:
            if open_ids:
                conn.execute(text("UPDATE pause_override SET ended_at = :t, ended_by = :a WHERE run_id = :r AND"
                                  " check_name = :c AND ended_at IS NULL"), {"t": t, "a": actor, "r": run_id, "c": check})
                store.add_event(conn, run_id, "auto_pause_on", check, actor=actor, detail=reason or None)
            return {"check": check, "auto_pause": True, "changed": bool(open_ids)}
        if open_ids:
            raise OverrideError(f"auto-pause is already off for {check} on this run")
        conn.execute(text("INSERT INTO pause_override (run_id, check_name, reason, actor, created_at)"
                          " VALUES (:r, :c, :why, :a, :t)"), {"r": run_id, "c": check, "why": reason[:2000],
                                                               "a": actor, "t": t})
        store.add_event(conn, run_id, "auto_pause_off", check, actor=actor, detail=reason[:2000])
    return {"check": check, "auto_pause": False, "changed": True, "reason": reason}
