"""Alarm rules: thresholds over the checks' rolling windows, alarm rows, auto-pause, notifications.

One rule per check (same name). A rule fires when, over the last ``window`` records the check
applied to (once at least ``min_records`` were seen), the failing share is at least ``threshold``
(``threshold = 0``: any failure). While it fires, one active ``alarm`` row per (run, rule) is kept
up to date; when it stops firing the row becomes inactive, except for *sticky* rules (field
mismatch, canary, drift, template), which stay until acknowledged or a recompute clears them.
A rule with ``auto_pause`` pauses the run once per alarm row when the failing share reaches
``pause_threshold`` over at least ``pause_min_records`` records.

The web app reads alarms with :func:`banner_alarms` / :func:`list_alarms` and writes only the
acknowledgement (:func:`acknowledge`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..check_catalog import DEFAULT_RULES, Rule, RuleOverride
from ..store import queue as store
from ..store.dashboards import dashboard_url

log = logging.getLogger("synthwatch.alarms")

SEVERITIES = ("warning", "error")




# Symptoms of a field mismatch: while that alarm is active they raise no alarm of their own, so the
# banner names the cause once instead of listing its consequences.
MISMATCH_SYMPTOMS = frozenset({"empty_reasoning", "reasoning_tokens_no_text", "think_tags_in_content",
                               "both_empty_with_tokens", "token_count_mismatch"})


def effective_rules(overrides: dict[str, RuleOverride]) -> dict[str, Rule]:
    out = dict(DEFAULT_RULES)
    for name, ov in overrides.items():
        changes = {k: v for k, v in ov.model_dump().items() if v is not None}
        if changes:
            out[name] = replace(out[name], **changes)
    return out


def fires(rule: Rule, fail: int, total: int) -> bool:
    return total >= rule.min_records and fail >= 1 and fail >= rule.threshold * total


def should_pause(rule: Rule, fail: int, total: int) -> bool:
    return (rule.auto_pause and total >= max(rule.pause_min_records, 1) and fail >= 1
            and fail >= rule.pause_threshold * total)


# ------------------------------------------------------------------------------------ wording


def _fields_text(fields: list[str]) -> str:
    names = [("inline `<think>` tags in the content" if f == "inline" else f"`{f}`") for f in fields]
    return " and ".join(names) if names else "another field"


def describe(rule: Rule, fail: int, total: int, run_fail: int, run_total: int, ctx: dict[str, Any]) -> tuple[str, str]:
    """(message, fix) in plain words for an alarm of this rule; ctx holds the latest failure's details."""
    share = f"{fail} of the last {total} records" if total else f"{fail} records"
    whole = f" ({run_fail} of {run_total} in the whole run)" if run_total else ""
    mode = ctx.get("mode") or "auto"
    name = rule.name
    if name == "field_mismatch":
        fields = sorted(ctx.get("fields") or [])
        where = _fields_text(fields)
        reads = "no reasoning field (mode `none`)" if mode == "none" else (
            "inline `<think>` tags" if mode == "inline" else f"`{mode}`")
        msg = (f"The endpoint sends reasoning in {where}; this run reads {reads}. {share}{whole} have it there "
               "(so their stored reasoning is empty).")
        target = fields[0] if fields else "auto"
        fix = (f"Set reasoning.mode = \"{target}\" (or \"auto\"): Settings & repairs, or `synthwatch fix RUN "
               f"--reasoning-mode {target}`. Then re-derive the affected records: their reasoning is in the raw "
               "unread field, so no new request is needed (`synthwatch rederive RUN --check field_mismatch`).")
        return msg, fix
    if name == "empty_reasoning":
        return (f"{share}{whole} have no reasoning although the run expects it.",
                "Check where the endpoint puts the reasoning (reasoning.mode), that the server runs a reasoning "
                "parser, and that thinking is enabled (e.g. chat_template_kwargs); set reasoning.expect = false "
                "if this model does not reason.")
    if name == "reasoning_tokens_no_text":
        return (f"{share}{whole}: the server counted reasoning tokens but sent no reasoning text.",
                "The server generates reasoning but does not return it: check include_reasoning / "
                "separate_reasoning on the server and the reasoning.mode of this run.")
    if name == "both_empty_with_tokens":
        return (f"{share}{whole} have neither content nor reasoning although completion_tokens > 0.",
                "The server dropped the text (seen with some vLLM reasoning parsers, vLLM #41902): try another "
                "reasoning parser or server version, or read the reasoning inline (reasoning.mode = \"inline\").")
    if name == "empty_content":
        return (f"{share}{whole} have an empty answer (content).",
                "The model may spend all tokens reasoning or the parser may put the answer in the reasoning: "
                "raise max_tokens, check the reasoning parser and the think tags.")
    if name == "truncated":
        return (f"{share}{whole} stopped at max_tokens (finish_reason = length).",
                "Raise sampling.max_tokens, or keep these records out of training.")
    if name == "truncated_in_reasoning":
        return (f"{share}{whole} were cut off before the reasoning ended: no answer at all.",
                "Raise sampling.max_tokens; these records have no final answer.")
    if name == "think_tags_in_content":
        return (f"{share}{whole} still have think tags inside the content.",
                "The reasoning was not separated: set reasoning.mode = \"inline\" (or \"auto\"), check "
                "reasoning.think_open / think_close and reasoning.prefilled_open.")
    if name == "repetition":
        return (f"{share}{whole} end in repeated text (the model looped).",
                "Raise the repetition/presence penalty or temperature, or lower max_tokens; drop these records.")
    if name == "duplicate_output":
        return (f"{share}{whole} repeat the output of an earlier record.",
                "Check that prompts differ, that sampling is not greedy with a fixed seed, and the dataset "
                "for duplicates.")
    if name == "token_count_mismatch":
        d = ctx
        ex = (f" e.g. {d.get('retokenized')} re-tokenized vs {d.get('usage')} reported"
              if d.get("usage") is not None else "")
        return (f"{share} sampled records{whole}: the re-tokenized answer and the server's completion_tokens "
                f"disagree;{ex}.",
                "The configured tokenizer may not be the served model's, or the text was changed on the way; "
                "check tokenizer.name_or_path.")
    if name == "template_drops_reasoning":
        return ("Rendering a record with this run's chat template leaves the reasoning out of the training "
                f"tokens ({ctx.get('template') or 'configured template'}).",
                "Use a chat template that renders reasoning_content for the final assistant turn (or export "
                "with exact token ids); otherwise training loses every chain of thought.")
    if name == "canary_failed":
        why = ctx.get("why") or "the answer was wrong or the reasoning missing"
        return (f"{fail} canary prompts failed{whole}: {why}.",
                "The endpoint or the reasoning capture is not working as expected: open the example record, "
                "compare with a manual request, check reasoning.mode and the model.")
    if name == "server_drift":
        what = ctx.get("field", "system_fingerprint")
        on = f" on endpoint `{ctx['endpoint']}`" if ctx.get("endpoint") else ""
        return (f"The server's {what}{on} changed from `{ctx.get('from')}` to `{ctx.get('to')}` at record "
                f"#{ctx.get('record_id')} (dataset index {ctx.get('idx')}).",
                "A different model or server version answered part of this run; check the endpoints, and "
                "split or re-run the records after the change if that matters.")
    if name == "timeout":
        return (f"{share}{whole} finished as timeouts.",
                "The server is overloaded or too slow: lower concurrency, raise timeouts.total_s / idle_s, or "
                "add endpoints.")
    if name == "error":
        return (f"{share}{whole} finished as errors.",
                "Open the latest errors: check the endpoint URL, model name, API key and server logs.")
    return f"{share}{whole} failed the {name} check.", ""


# ------------------------------------------------------------------------------------ evaluation


@dataclass(slots=True)
class ActiveAlarm:
    id: int
    count: int
    auto_paused: bool
    message: str
    acked_at: float | None = None


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

    def load(self, conn: Connection) -> None:
        self.active = {}
        for aid, rule, count, paused, msg, acked in conn.execute(
            text("SELECT id, rule, count, auto_paused, message, acked_at FROM alarm WHERE run_id = :r AND active"
                 " ORDER BY id"), {"r": self.run_id},
        ):
            self.active[rule] = ActiveAlarm(aid, count, bool(paused), msg, acked)
        self.no_pause = active_overrides(conn, self.run_id)
        self.found_url = "" if self.dashboard_url else (dashboard_url(conn) or "")
        self.loaded = True

    def refresh(self, conn: Connection) -> None:
        """Acknowledgements and auto-pause overrides are written by the dashboard: read them again."""
        acked: dict[int, float | None] = dict(conn.execute(text("SELECT id, acked_at FROM alarm WHERE run_id = :r AND active"),
                                  {"r": self.run_id}).all())
        for cur in self.active.values():
            cur.acked_at = acked.get(cur.id, cur.acked_at)
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
        elif new_fail:
            self.refresh(conn)
        new_fail = new_fail or {}
        raised: list[str] = []
        for name, rule in rules.items():
            if only is not None and name not in only:
                continue
            fail, total = windows.get(name, (0, 0))
            n_fail, n_total, example = run_stats.get(name, (0, 0, None))
            cur = self.active.get(name)
            firing = rule.enabled and fires(rule, fail, total)
            if not firing:
                if cur is not None and (not rule.enabled or clear_sticky
                                        or (not rule.sticky and total >= rule.min_records)):
                    conn.execute(text("UPDATE alarm SET active = false, updated_at = :t WHERE id = :i"),
                                 {"t": t, "i": cur.id})
                    del self.active[name]
                continue
            if cur is None and name in MISMATCH_SYMPTOMS and "field_mismatch" in self.active:
                continue
            ctx = details.get(name, {})
            message, fix = describe(rule, fail, total, n_fail, n_total, ctx)
            count = n_fail or fail
            pause = allow_pause and name not in self.no_pause and should_pause(rule, fail, total)
            reraised_from = None
            if cur is not None and cur.acked_at is not None and new_fail.get(name, 0.0) > cur.acked_at:
                # the snooze is over: the condition came back in records finished after the acknowledgement
                conn.execute(text("UPDATE alarm SET active = false, updated_at = :t WHERE id = :i"),
                             {"t": t, "i": cur.id})
                store.add_event(conn, self.run_id, "alarm_reraised", cur.id, actor="alarm",
                                detail=f"{name}: failing again after the acknowledgement")
                reraised_from, cur = cur.id, None
                del self.active[name]
            if cur is None:
                aid = int(conn.execute(
                    text("INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, example_record_id,"
                         " raised_at, updated_at, active, auto_paused, reraised_from) VALUES (:r, :rule, :sev,"
                         " :title, :msg, :fix, :count, :ex, :t, :t, true, false, :prev) RETURNING id"),
                    {"r": self.run_id, "rule": name, "sev": rule.severity, "title": rule.title, "msg": message,
                     "fix": fix, "count": count, "ex": example, "t": t, "prev": reraised_from},
                ).scalar_one())
                cur = self.active[name] = ActiveAlarm(aid, count, False, message)
                raised.append(name)
                self._notify("alarm", rule, cur.id, message, fix, fail, total, n_fail, n_total, example)
            elif cur.count != count or cur.message != message:
                conn.execute(
                    text("UPDATE alarm SET count = :count, message = :msg, fix = :fix, severity = :sev,"
                         " example_record_id = COALESCE(:ex, example_record_id), updated_at = :t WHERE id = :i"),
                    {"count": count, "msg": message, "fix": fix, "sev": rule.severity, "ex": example, "t": t,
                     "i": cur.id},
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
        """Whether evaluating now would pause the run (checked before a claim is answered)."""
        for name in new_fail:
            rule = rules.get(name)
            if rule is None or not rule.enabled or name in self.no_pause:
                continue
            fail, total = windows.get(name, (0, 0))
            if not (fires(rule, fail, total) and should_pause(rule, fail, total)):
                continue
            cur = self.active.get(name)
            if cur is None or not cur.auto_paused or (cur.acked_at is not None and new_fail[name] > cur.acked_at):
                return True
        return False

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
               " acked_at, acked_by, active, auto_paused, reraised_from")


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


def acknowledge(engine: Engine, run_id: int, alarm_id: int, actor: str = "ui") -> dict[str, Any]:
    """Snooze an alarm: the banner hides it until its condition comes back in records finished after now."""
    with engine.connect() as conn, store.write_begin(conn):
        row = conn.execute(text("SELECT id, rule, acked_at, acked_by FROM alarm WHERE id = :i AND run_id = :r"),
                           {"i": alarm_id, "r": run_id}).first()
        if row is None:
            raise AlarmNotFound(f"run {run_id} has no alarm {alarm_id}")
        t = time.time()
        if row[2] is None:
            conn.execute(text("UPDATE alarm SET acked_at = :t, acked_by = :a WHERE id = :i"),
                         {"t": t, "a": actor, "i": alarm_id})
            store.add_event(conn, run_id, "ack_alarm", alarm_id, actor=actor,
                            detail=f"{row[1]}: snoozed until it fails again in new records")
    return {"id": alarm_id, "rule": row[1], "acked_at": row[2] or t, "acked_by": row[3] or actor}


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
        raise OverrideError(f"unknown check {check[:60]!r} (one of {', '.join(DEFAULT_RULES)})")
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


def open_quality_alarms(conn: Connection, run_id: int) -> list[tuple[str, int]]:
    """(check, failing records in the whole run) for every active data-quality alarm, most failures first."""
    rows = conn.execute(
        text("SELECT a.rule, COALESCE(s.n_fail, a.count) FROM alarm a LEFT JOIN check_stat s ON s.run_id = a.run_id"
             " AND s.check_name = a.rule WHERE a.run_id = :r AND a.active"), {"r": run_id}).all()
    out = [(rule, int(n or 0)) for rule, n in rows if rule not in TRANSPORT_RULES]
    out.sort(key=lambda x: -x[1])
    return out


def completion_message(conn: Connection, run_id: int) -> str | None:
    """'completed with N records failing <check>' when a data-quality alarm is open at the end, else None."""
    failing = open_quality_alarms(conn, run_id)
    if not failing:
        return None
    parts = [f"{n:,} record{'' if n == 1 else 's'} failing {rule}" for rule, n in failing]
    return "completed with " + ", ".join(parts)
