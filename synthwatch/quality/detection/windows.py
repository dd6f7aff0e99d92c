"""Detection state of a run, in one place (#35): the evidence (rolling windows, whole-run counts), the alarms'
hysteresis and episodes, snoozes and acknowledgements (counted at claim time), and the one count of problems every
page reads. The evidence belongs to the run, not to a worker process: everything here is rebuilt from, or kept in,
the database, so a run made by any number of worker processes (one after another, or several at once on
PostgreSQL) alarms exactly as one long one would.

Parts, and who uses them:

- :class:`Window` and :func:`recent_windows`: each check's rolling window. A worker starts from the run's latest
  finished records (``recent_windows``), never from nothing; with other workers live on the run, the writer
  re-reads it from the database every few seconds (one shared view).
- **Observing a verdict** (the API for in-flight evidence, e.g. a streamed answer that is not finished):
  ``window.observe(record_id, failed, final=False)`` counts a *provisional* verdict of check C on record R at
  once; a later observation for the same record replaces it (never counted twice), and the final one
  (``final=True``, or the writer's own count of the finished record, which calls ``window.settle(ids)``) takes
  its place. :meth:`Window.counts` is what alarms are evaluated on: settled plus provisional verdicts, at most
  the window's size. A verdict of ``error`` is not a pass or a fail: see :func:`observe`.
- :class:`Hysteresis` and :func:`step`: a rule's condition must hold over ``alarm_pending_records`` of the
  check's records before its alarm fires (Prometheus' ``for:``), and stop holding over ``alarm_clear_records``
  before it clears (``keep_firing_for``); a re-fire while clearing is the same episode. The periods are counted in
  the check's own records (``check_stat.n_total``: the run's clock, which a pause or a restart neither advances nor
  resets) and their state is in ``check_stat.pending_from`` / ``clear_from``, so every worker sees it. A rule whose
  one failure is proof (threshold 0), a failing share at least twice the threshold (no flap: far from the line), a
  condition that reaches the auto-pause line and a whole re-check (recompute) fire at once.
- :func:`claim_gate`: asked by ``store.queue.claim`` inside the claim's transaction (registered with
  ``store.queue.set_claim_gate`` when this module is imported, with :func:`resume_gate`, which a resume asks in
  its transaction and which records the resume's acknowledgement). An alarm that paused the run holds every claim
  while it is open, unless acknowledged with a bound: **N records** (the next N *claims*, counted when records are
  claimed, not when they finish) or **M minutes**. An acknowledgement without a bound never lets the run go on;
  when the bound is used up the alarm holds the run again, whatever the records in flight turn out to be.
- :func:`problem_counts`: the one count of open alarms, episodes and open items, used by the runs list, the alarm
  strip, the tab title, the charts and the API.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ...check_catalog import BIT, CHECK_NAMES, CheckSettings, Rule
from ...store import queue as store
from ..checks import RecordChecker, applied_bits

# ------------------------------------------------------------------------------------ the evidence


class Window:
    """The last ``size`` settled verdicts of one check (True = failed), plus provisional ones by record."""

    __slots__ = ("size", "buf", "fail", "provisional")

    def __init__(self, size: int, items: Iterable[bool] = ()) -> None:
        self.size = size
        self.buf: deque[bool] = deque(maxlen=size)
        self.fail = 0
        self.provisional: dict[int, bool] = {}
        self.extend(list(items))

    def add(self, failed: bool) -> None:
        if len(self.buf) == self.size and self.buf[0]:
            self.fail -= 1
        self.buf.append(failed)
        if failed:
            self.fail += 1

    def extend(self, items: list[bool]) -> None:
        """add() for each item in order; one flush's records at once (counted in C, not per record)."""
        if not items:
            return
        buf = self.buf
        if len(items) >= self.size:
            buf.clear()
            self.fail = 0
            items = items[-self.size:]
        else:
            overflow = len(buf) + len(items) - self.size
            if overflow > 0:  # the oldest entries leave the window
                self.fail -= sum(itertools.islice(buf, overflow))
        buf.extend(items)
        self.fail += sum(items)

    def observe(self, record_id: int, failed: bool, *, final: bool = False) -> None:
        """A verdict of this check on a record, finished or not. Provisional verdicts replace one another for the
        same record; the final one replaces the provisional one (each record counts once)."""
        if final:
            self.provisional.pop(record_id, None)
            self.add(failed)
        else:
            self.provisional[record_id] = failed

    def settle(self, record_ids: Iterable[int]) -> None:
        """These records' final verdicts were counted (extend): their provisional ones go."""
        if self.provisional:
            for rid in record_ids:
                self.provisional.pop(rid, None)

    def counts(self) -> tuple[int, int]:
        """(failed, total) over the window: settled verdicts and provisional ones, at most ``size`` in all."""
        if not self.provisional:
            return self.fail, len(self.buf)
        prov = list(self.provisional.values())[-self.size:]
        keep = self.size - len(prov)  # the newest settled verdicts that still fit
        settled = list(self.buf)[-keep:] if keep > 0 else []
        return sum(settled) + sum(prov), len(settled) + len(prov)

    @property
    def total(self) -> int:
        return len(self.buf)


def observe(windows: dict[str, Window], record_id: int, check: str, verdict: str, *, final: bool = False) -> None:
    """Observe a verdict ('pass', 'fail' or 'error') of ``check`` for record ``record_id``. Pass and fail go to the
    check's window (provisional unless ``final``); an error is neither (it is counted by the check's error share,
    :func:`error_share_alarm`), and a provisional verdict of the same record is dropped with it."""
    w = windows.get(check)
    if w is None:
        return
    if verdict == "error":
        w.provisional.pop(record_id, None)
        return
    w.observe(record_id, verdict == "fail", final=final)


def recent_windows(conn: Connection, run_id: int, checker: RecordChecker, rules: dict[str, Rule]) -> dict[str, Window]:
    """Each check's rolling window over the run's most recently finished records, from their stored results
    (whichever worker wrote them).

    Which checks applied to a record is not stored: the cheap per-record rules decide it again (status,
    expected reasoning, usage); what failed is the stored check_flags."""
    size = max(rules[n].window for n in CHECK_NAMES)
    rows = conn.execute(
        text("SELECT status, reasoning_tokens, check_flags FROM record WHERE run_id = :r AND finished_at IS NOT NULL"
             " AND status IN ('ok', 'error', 'timeout') ORDER BY finished_at DESC, id DESC LIMIT :n"),
        {"r": run_id, "n": size},
    ).all()
    windows = {n: Window(rules[n].window) for n in CHECK_NAMES}
    en = checker.enabled
    for status, reasoning_tokens, flags in reversed(rows):
        applied = applied_bits(status, reasoning_tokens, checker.ctx.expects)
        if status == "ok":
            applied |= BIT["duplicate_output"] | BIT["server_drift"]
        applied &= en
        for name in CHECK_NAMES:
            if applied & BIT[name]:
                windows[name].add(bool((flags or 0) & BIT[name]))
    return windows


def other_workers_live(conn: Connection, run_id: int, worker_id: int | None) -> bool:
    """Whether another worker is running this run now (its windows then come from the database)."""
    return conn.execute(text("SELECT 1 FROM worker WHERE run_id = :r AND status = 'running' AND id != :w LIMIT 1"),
                        {"r": run_id, "w": worker_id or -1}).first() is not None


# ------------------------------------------------------------------------------------ hysteresis


@dataclass(frozen=True, slots=True)
class Hysteresis:
    pending_records: int = 10
    clear_records: int = 200

    @classmethod
    def of(cls, settings: CheckSettings) -> Hysteresis:
        return cls(settings.alarm_pending_records, settings.alarm_clear_records)

    def words(self) -> str:
        """For the banner: how long a condition holds before an alarm fires, and before it clears."""
        return (f"an alarm fires once its condition held over {self.pending_records:,} more records of its check, "
                f"and clears once it stopped holding over {self.clear_records:,}; a re-fire meanwhile is the same "
                "episode")


@dataclass(slots=True)
class RuleState:
    """One rule's hysteresis state as stored (check_stat.pending_from / clear_from)."""

    pending_from: int | None = None
    clear_from: int | None = None


def load_states(conn: Connection, run_id: int) -> dict[str, RuleState]:
    return {str(r[0]): RuleState(r[1], r[2]) for r in conn.execute(
        text("SELECT check_name, pending_from, clear_from FROM check_stat WHERE run_id = :r"), {"r": run_id})}


def save_state(conn: Connection, run_id: int, name: str, state: RuleState) -> None:
    conn.execute(text("UPDATE check_stat SET pending_from = :p, clear_from = :c WHERE run_id = :r AND check_name = :n"),
                 {"p": state.pending_from, "c": state.clear_from, "r": run_id, "n": name})


def step(h: Hysteresis, state: RuleState, *, firing: bool, active: bool, n: int, immediate: bool) -> str:
    """One evaluation of a rule: 'fire' (raise or keep the alarm), 'hold' (no alarm yet, pending), 'keep' (the
    alarm stays while clearing), 'clear' (end the alarm) or 'none'. Updates ``state`` in place.

    n: the check's records so far (whole run); immediate: the condition fires without a pending period."""
    if firing:
        state.clear_from = None  # a re-fire while clearing: the same episode
        if active:
            state.pending_from = None
            return "fire"
        if immediate or h.pending_records <= 0:
            state.pending_from = None
            return "fire"
        if state.pending_from is None:
            state.pending_from = n
        if n - state.pending_from >= h.pending_records:
            state.pending_from = None
            return "fire"
        return "hold"
    state.pending_from = None
    if not active:
        state.clear_from = None
        return "none"
    if h.clear_records <= 0:
        state.clear_from = None
        return "clear"
    if state.clear_from is None:
        state.clear_from = n
    if n - state.clear_from >= h.clear_records:
        state.clear_from = None
        return "clear"
    return "keep"


# ------------------------------------------------------------------------------------ the claim gate

# Open alarms that paused the run, unless a person turned auto-pause off for their check (pause_override).
# ix_alarm_run (run_id, active) keeps this a few index entries per claim.
_GATE_SQL = text(
    "SELECT a.id, a.rule, a.title, a.acked_at, a.snooze_until, a.snooze_records, a.evidence_json FROM alarm a"
    " WHERE a.run_id = :r AND a.active AND a.auto_paused AND NOT EXISTS (SELECT 1 FROM pause_override p"
    " WHERE p.run_id = a.run_id AND p.check_name = a.rule AND p.ended_at IS NULL) ORDER BY a.id")


def claim_gate(conn: Connection, run_id: int, claimed: int, t: float, *,
               reopen: bool = True) -> tuple[list[dict[str, Any]], int | None]:
    """(blocking alarms, claims still allowed by bounded acknowledgements or None) for a claim now.

    An alarm that paused the run blocks every claim while it is open, unless acknowledged for M minutes that are
    not over or for N records the run has not claimed yet (``claimed`` = total - pending, at claim time: the
    caller claims at most the allowance). An acknowledgement without a bound does not let the run go on. When a
    bound is used up the alarm holds again; with ``reopen`` its acknowledgement ends (the banner shows it again)."""
    blocked: list[dict[str, Any]] = []
    left: int | None = None
    for row in conn.execute(_GATE_SQL, {"r": run_id}).mappings():
        a = dict(row)
        if a["acked_at"] is None:
            blocked.append(a)
            continue
        over = ""
        if a["snooze_until"] is not None:
            if t < a["snooze_until"]:
                continue
            over = "minutes"
        elif a["snooze_records"] is not None:
            n = int(a["snooze_records"]) - claimed
            if n > 0:
                left = n if left is None else min(left, n)
                continue
            over = "records"
        a["snooze_over"] = over or "open-ended"
        blocked.append(a)
        if reopen and over:
            conn.execute(text("UPDATE alarm SET acked_at = NULL, acked_by = NULL, snooze_until = NULL,"
                              " snooze_records = NULL, updated_at = :t WHERE id = :i"), {"t": t, "i": a["id"]})
            store.add_event(conn, run_id, "snooze_over", a["id"], actor="alarm",
                            detail=f"{a['rule']}: the acknowledgement for some {over} is used up and the alarm is"
                                   " still open: no record is claimed until it is acknowledged again or cleared")
            a["acked_at"] = None
    return blocked, left


MAX_ACK_RECORDS = 1_000_000_000
MAX_ACK_MINUTES = 7 * 24 * 60


def ack_bound(records: int | None, minutes: float | None) -> tuple[str, float] | None:
    """An acknowledgement's bound, ("records", N) or ("minutes", M), checked; None when it has none."""
    if records is not None and minutes is not None:
        raise store.ControlError("acknowledge for a number of records or a number of minutes, not both")
    if records is not None:
        if not 1 <= int(records) <= MAX_ACK_RECORDS:
            raise store.ControlError(f"acknowledge for 1 to {MAX_ACK_RECORDS:,} records, got {records}")
        return ("records", float(int(records)))
    if minutes is not None:
        if not 0 < float(minutes) <= MAX_ACK_MINUTES:
            raise store.ControlError(f"acknowledge for more than 0 and at most {MAX_ACK_MINUTES:,} minutes,"
                                     f" got {minutes}")
        return ("minutes", float(minutes))
    return None


def resume_refusal(blocked: list[dict[str, Any]], ack: str) -> str:
    return (f"not resumed: {store.alarm_names(blocked)} paused this run and is still open. Resuming would pause it "
            "again before the next record. Acknowledge it in the same action, for a number of records or minutes "
            f"(`{ack}`, the dashboard's \"Acknowledge and resume\","
            " or the API's ack_records / ack_minutes), or fix the cause first (Settings & repairs).")


def resume_gate(conn: Connection, run_id: int, claimed: int, *, ack_records: int | None, ack_minutes: float | None,
                actor: str) -> list[dict[str, Any]]:
    """A resume, asked in its own write transaction (``store.queue.apply_control``): the alarms holding the run are
    acknowledged for the resume's bound (the next N *claims*: ``claimed`` + N, or M minutes) and returned; with
    none holding it, nothing. A resume without a bound while one holds it raises ``store.AlarmOpen``."""
    bound = ack_bound(ack_records, ack_minutes)
    blocked, _left = claim_gate(conn, run_id, claimed, store.now(), reopen=False)
    if not blocked:
        return []
    if bound is None:
        raise store.AlarmOpen(resume_refusal(blocked, store.ack_hint(conn, run_id, blocked)), blocked)
    t = store.now()
    kind, amount = bound
    until = t + amount * 60 if kind == "minutes" else None
    upto = claimed + int(amount) if kind == "records" else None
    what = f"{int(amount):,} more records" if kind == "records" else f"{amount:g} minutes"
    out = []
    for a in blocked:
        conn.execute(text("UPDATE alarm SET acked_at = :t, acked_by = :a, snooze_until = :u, snooze_records = :n"
                          " WHERE id = :i"), {"t": t, "a": actor, "u": until, "n": upto, "i": a["id"]})
        store.add_event(conn, run_id, "ack_alarm", a["id"], actor=actor,
                        detail=f"{a['rule']}: acknowledged and resumed for {what}")
        out.append({"id": a["id"], "rule": a["rule"], "for": what, "snooze_until": until, "snooze_records": upto})
    return out


store.set_claim_gate(claim_gate, resume_gate)


# ------------------------------------------------------------------------------------ a broken check is an alarm

ERROR_WINDOW = 100  # the error share is over a check's last this many verdicts ...
ERROR_MIN_RECORDS = 20  # ... once it has at least this many
ERROR_SUFFIX = ":error"  # the alarm's rule: "judge:error", "user:my_check:error"


def error_rule(check: str) -> str:
    return check + ERROR_SUFFIX


def run_error_share(conn: Connection, run_id: int) -> float:
    """The run's ``[checks] error_share_threshold`` (its default when the settings cannot be read)."""
    raw = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
    try:
        checks = (orjson.loads(raw or "{}") or {}).get("checks") or {}
        return float(CheckSettings.model_validate(checks).error_share_threshold)
    except (orjson.JSONDecodeError, ValueError, AttributeError, TypeError):
        return float(CheckSettings().error_share_threshold)


def error_share_alarms(conn: Connection, run_id: int, checks: Iterable[str], threshold: float, t: float) -> list[str]:
    """A check or judge whose ``error`` verdicts reach ``threshold`` of its last ERROR_WINDOW verdicts (from
    ERROR_MIN_RECORDS on) raises an alarm of its own (rule ``<check>:error``) that names the latest error; it ends
    when the share is back under the threshold. Run in the verdict writer's transaction, from the stored verdicts
    (whichever process wrote them). Returns the checks whose alarm was raised now."""
    raised: list[str] = []
    for check in sorted(set(checks)):
        rows = conn.execute(text("SELECT state, reason FROM check_verdict WHERE run_id = :r AND check_name = :c"
                                 " ORDER BY id DESC LIMIT :n"), {"r": run_id, "c": check, "n": ERROR_WINDOW}).all()
        n = len(rows)
        errors = [str(r[1] or "") for r in rows if r[0] == "error"]
        rule = error_rule(check)
        cur = conn.execute(text("SELECT id FROM alarm WHERE run_id = :r AND rule = :rule AND active"),
                           {"r": run_id, "rule": rule}).first()
        firing = n >= ERROR_MIN_RECORDS and bool(errors) and len(errors) >= threshold * n
        if not firing:
            if cur is not None and n >= ERROR_MIN_RECORDS:
                conn.execute(text("UPDATE alarm SET active = false, updated_at = :t WHERE id = :i"),
                             {"t": t, "i": cur[0]})
            continue
        latest = " ".join(errors[0].split())[:300] or "no reason given"
        message = (f"{len(errors)} of the last {n} verdicts of {check} are errors, not pass or fail: the check itself"
                   f" fails to run. Latest error: {latest}")
        fix = (f"Fix {check} (its module, its entry point, or the judge's endpoint and prompt), then retry the errored"
               " verdicts; until then its records are not checked.")
        if cur is None:
            conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at, updated_at, active,"
                " auto_paused) VALUES (:r, :rule, 'error', :title, :msg, :fix, :n, :t, :t, true, false)"),
                {"r": run_id, "rule": rule, "title": f"The {check} check fails to run", "msg": message, "fix": fix,
                 "n": len(errors), "t": t})
            store.add_event(conn, run_id, "alarm", rule, actor="alarm", detail=message[:2000])
            raised.append(check)
        else:
            conn.execute(text("UPDATE alarm SET count = :n, message = :msg, updated_at = :t WHERE id = :i"),
                         {"n": len(errors), "msg": message, "t": t, "i": cur[0]})
    return raised


# ------------------------------------------------------------------------------------ the one count


@dataclass(frozen=True, slots=True)
class Problems:
    alarms: int = 0  # open alarms (active rows), acknowledged or not
    unacked: int = 0  # of those, not acknowledged (the banner's)
    episodes: int = 0  # alarm rows ever raised (one per episode)
    items: int = 0  # open items
    failing: int = 0  # records still failing in open items

    @property
    def total(self) -> int:
        """The number a tab title or a runs-list cell shows: open alarms and open items."""
        return self.alarms + self.items


def problem_counts(conn: Connection, run_ids: list[int] | None = None) -> dict[int, Problems]:
    """run id -> its Problems, from the stored alarms and open items (every page reads these, never its own)."""
    where = ""
    params: dict[str, Any] = {}
    if run_ids is not None:
        if not run_ids:
            return {}
        where = f" WHERE run_id IN ({','.join(str(int(r)) for r in run_ids)})"
    acc: dict[int, dict[str, int]] = {}
    for rid, active, unacked, episodes in conn.execute(text(
            "SELECT run_id, SUM(CASE WHEN active THEN 1 ELSE 0 END), SUM(CASE WHEN active AND acked_at IS NULL"
            f" THEN 1 ELSE 0 END), COUNT(*) FROM alarm{where} GROUP BY run_id"), params):
        acc[int(rid)] = {"alarms": int(active or 0), "unacked": int(unacked or 0), "episodes": int(episodes or 0)}
    item_where = where.replace(" WHERE ", " AND ") if where else ""
    for rid, n, failing in conn.execute(text(
            f"SELECT run_id, COUNT(*), SUM(n_records) FROM open_item WHERE state = 'open'{item_where}"
            " GROUP BY run_id"), params):
        acc.setdefault(int(rid), {}).update({"items": int(n or 0), "failing": int(failing or 0)})
    return {rid: Problems(**d) for rid, d in acc.items()}


def run_problems(conn: Connection, run_id: int) -> Problems:
    return problem_counts(conn, [run_id]).get(run_id, Problems())
