"""Weakening is an override (#35): a settings change that makes fewer records fail, or stops a check from alarming,
needs a reason, and is kept with who and when.

What counts as weakening (:func:`weakenings`, old config -> new config):

- a check disabled (``[checks] disabled``), or an extended check (verifier, user check, rule) removed;
- a rule switched off (``[checks.rules.X] enabled = false``);
- a rule's ``threshold``, ``min_records``, ``pause_threshold`` or ``pause_min_records`` raised;
- the hysteresis lengthened (``alarm_pending_records`` raised) or the error-share line raised
  (``error_share_threshold``);
- ``reasoning.expect`` turned off (empty reasoning then never fails);
- the judge switched off (``[judge]`` removed).

Turning auto-pause off is its own action with a reason (synthwatch.quality.detection.alarms.set_auto_pause).

Every config version goes through ``store.versions.create_version``; this module's :func:`guard` is registered
there (``versions.set_change_guard``) when it is imported: a weakening without a reason of at least
``MIN_REASON_CHARS`` characters is refused (:class:`synthwatch.store.versions.WeakeningRefused`, naming each
weakening; exit 2 on the CLI, 400 on the API and the forms). With a reason, each weakening is appended to
``check_override`` (never changed), logged as an event, and the open items of the checks it weakens close as
*accepted* with that reason: an open item never closes because a check stopped running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ...check_catalog import CheckSettings, Rule
from ...store import queue as store
from ...store import versions
from ..checks import ChecksConfigError, parse_settings
from .alarms import effective_rules, rules_for

MIN_REASON_CHARS = 5
MAX_REASON_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Weakening:
    kind: str
    check: str
    detail: str


def _settings(cfg: dict[str, Any]) -> CheckSettings:
    try:
        return parse_settings(cfg.get("checks") or {})
    except (ChecksConfigError, AttributeError):
        return CheckSettings()


def _rules(s: CheckSettings) -> dict[str, Rule]:
    return {**effective_rules(s.rules), **rules_for(s.extended_names(), s.rules)}


def weakenings(old_cfg: dict[str, Any], new_cfg: dict[str, Any]) -> list[Weakening]:
    """Each change from old_cfg to new_cfg that weakens detection (see the module's list)."""
    old, new = _settings(old_cfg), _settings(new_cfg)
    out: list[Weakening] = []
    for name in sorted(set(new.disabled) - set(old.disabled)):
        out.append(Weakening("disabled", name, f"{name} disabled (no longer computed)"))
    for name in sorted(set(old.extended_names()) - set(new.extended_names())):
        out.append(Weakening("removed", name, f"{name} removed from the run's checks"))
    before, after = _rules(old), _rules(new)
    for name in sorted(set(before) & set(after)):
        b, a = before[name], after[name]
        if b.enabled and not a.enabled:
            out.append(Weakening("rule_off", name, f"{name}: its alarm switched off (enabled = false)"))
            continue
        for key in ("threshold", "min_records", "pause_threshold", "pause_min_records"):
            if key.startswith("pause") and not (a.auto_pause and b.auto_pause):
                continue
            if getattr(a, key) > getattr(b, key):
                out.append(Weakening(key, name, f"{name}: {key} raised from {getattr(b, key):g} to"
                                                f" {getattr(a, key):g}"))
    if new.alarm_pending_records > old.alarm_pending_records:
        out.append(Weakening("alarm_pending_records", "*", f"alarm_pending_records raised from"
                                                           f" {old.alarm_pending_records} to {new.alarm_pending_records}"))
    if new.error_share_threshold > old.error_share_threshold:
        out.append(Weakening("error_share_threshold", "*", f"error_share_threshold raised from"
                                                           f" {old.error_share_threshold:g} to"
                                                           f" {new.error_share_threshold:g}"))
    if (old_cfg.get("reasoning") or {}).get("expect", True) and not (new_cfg.get("reasoning") or {}).get("expect", True):
        out.append(Weakening("reasoning_expect_off", "empty_reasoning",
                             "reasoning.expect turned off: empty reasoning no longer fails"))
    if old_cfg.get("judge") and not new_cfg.get("judge"):
        out.append(Weakening("judge_off", "judge", "the judge switched off"))
    return out


def refusal(ws: list[Weakening]) -> str:
    listed = "; ".join(w.detail for w in ws)
    return (f"this change weakens detection ({listed}): it needs a reason of at least {MIN_REASON_CHARS} characters"
            " (CLI --reason, API field `reason`, the form's Reason field); it is kept with who and when and shown on"
            " the run, the export page and the export manifest")


def guard(conn: Connection, run_id: int, old_cfg: dict[str, Any], new_cfg: dict[str, Any], *, actor: str,
          reason: str | None) -> list[Weakening]:
    """Refuse a weakening without a reason; record one with its reason (inside the caller's write transaction)."""
    ws = weakenings(old_cfg, new_cfg)
    if not ws:
        return ws
    why = (reason or "").strip()
    if len(why) < MIN_REASON_CHARS:
        raise versions.WeakeningRefused(refusal(ws), [(("reason",), "a reason is needed: " + w.detail) for w in ws])
    why = why[:MAX_REASON_CHARS]
    t = time.time()
    for w in ws:
        conn.execute(text("INSERT INTO check_override (run_id, kind, check_name, detail, reason, actor, created_at)"
                          " VALUES (:r, :k, :c, :d, :why, :a, :t)"),
                     {"r": run_id, "k": w.kind, "c": w.check, "d": w.detail, "why": why, "a": actor, "t": t})
        store.add_event(conn, run_id, "override", w.check, actor=actor, detail=f"{w.detail}: {why}"[:MAX_REASON_CHARS])
    checks = {w.check for w in ws}
    for iid, check in conn.execute(text("SELECT id, check_name FROM open_item WHERE run_id = :r AND state = 'open'"),
                                   {"r": run_id}).all():
        if check in checks:
            conn.execute(text("UPDATE open_item SET state = 'accepted', closed_at = :t, closed_by = :a, reason = :why,"
                              " updated_at = :t WHERE id = :i"),
                         {"t": t, "a": actor, "why": f"override: {why}"[:MAX_REASON_CHARS], "i": iid})
            store.add_event(conn, run_id, "accept_open_item", iid, actor=actor,
                            detail=f"{check}: accepted by an override: {why}"[:MAX_REASON_CHARS])
    return ws


def list_overrides(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """The run's weakening overrides, newest first (for the run page, the export page and the manifest)."""
    return [dict(r) for r in conn.execute(text(
        "SELECT id, kind, check_name, detail, reason, actor, created_at FROM check_override WHERE run_id = :r"
        " ORDER BY id DESC"), {"r": run_id}).mappings()]


versions.set_change_guard(guard)
