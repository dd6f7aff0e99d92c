"""The run page's data-quality tiles: the same window and the same rule as the alarm on their check (#19).

A tile that counted the last minute of ok records while its alarm counted the last 100 checked records
could read green 1.1 % beside a red banner. So each quality tile shows its check's rolling window as the
writer keeps it for the alarms (``check_stat.win_fail / win_total``: the last ``window`` records the check
applied to), and is coloured by that alarm's rule (``alarms.fires``, the run's own rule overrides):

- red (amber for a rule of severity "warning") while the rule fires over that window, or while an alarm
  on the check is open and not snoozed;
- red while the field-mismatch alarm is open and records in the window fail a check that is its symptom
  (empty reasoning: that alarm is held back then, so the banner names the cause once);
- amber while the failing share is over the threshold but fewer records than the rule's ``min_records``
  were checked (the alarm waits for them);
- otherwise green.

A finished run (no longer live) has no "last 100" that means anything: its tiles show the whole run's rate,
labelled "whole run", red while an open item on the check remains (records an alarm left failing, whether
or not the alarm itself has ended; quality/detection/open_items.py), or when the whole run's share fires the rule (#26:
3,290 empty-reasoning records of 20,000 once showed green 0.0 % from the last 100).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..check_catalog import Rule
from ..quality.detection.alarms import MISMATCH_SYMPTOMS, effective_rules, fires
from ..store.models import LIVE_STATUSES
from .problem_counts import open_problems
from .words import check_label, plural

TILE_CHECKS = (("empty_reasoning", "empty_reasoning"), ("length", "truncated"))  # tile key, its check


def _rules(run: dict[str, Any]) -> dict[str, Rule]:
    from ..quality.checks import ChecksConfigError, parse_settings

    try:
        return effective_rules(parse_settings((run.get("config") or {}).get("checks") or {}).rules)
    except ChecksConfigError:
        return effective_rules({})


def _pct(x: float) -> str:
    return f"{x * 100:g} %"


def quality_tiles(conn: Connection, run: dict[str, Any], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tile fields (key, level, title, value, detail) of each quality tile; ``checks``: the run's check_stat rows."""
    rules = _rules(run)
    by_name = {c["check_name"]: c for c in checks}
    open_alarms = {r[0] for r in conn.execute(
        text("SELECT rule FROM alarm WHERE run_id = :r AND active AND acked_at IS NULL"), {"r": run["id"]})}
    if run.get("status") not in LIVE_STATUSES:
        return _finished_tiles(conn, run, rules, by_name)
    out = []
    for key, check in TILE_CHECKS:
        rule, row = rules[check], by_name.get(check) or {}
        fail, total = int(row.get("win_fail") or 0), int(row.get("win_total") or 0)
        title = check_label(check)
        if not total:
            out.append({"key": key, "level": "ok", "title": title, "value": "–", "detail": "no checked records yet"})
            continue
        firing = rule.enabled and fires(rule, fail, total)
        symptom = check in MISMATCH_SYMPTOMS and "field_mismatch" in open_alarms and fail > 0
        level = "ok"
        if firing or check in open_alarms or symptom:
            level = "warn" if rule.severity == "warning" and not symptom else "bad"
        elif rule.enabled and total < rule.min_records and fail >= 1 and fail >= rule.threshold * total:
            level = "warn"  # over the threshold, but the alarm waits for min_records: not green, not yet red
        detail = (f"{fail:,} of the last {plural(total, 'checked record')}; its alarm: {_pct(rule.threshold)} or more"
                  f" of the last {rule.window:,} once {rule.min_records:,} are checked"
                  + ("" if rule.enabled else " (turned off for this run)")
                  + f"; {int(row.get('n_fail') or 0):,} in the whole run")
        if check in open_alarms:
            detail += "; its alarm is open"
        elif symptom:
            detail += "; a symptom of the open field-mismatch alarm"
        out.append({"key": key, "level": level, "title": title, "value": f"{fail / total * 100:.1f}%",
                    "detail": detail})
    return out


def _finished_tiles(conn: Connection, run: dict[str, Any], rules: dict[str, Rule],
                    by_name: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A finished run's tiles: the whole run's rate, red while an open item on the check remains."""
    problems = open_problems(conn, run["id"])
    out = []
    for key, check in TILE_CHECKS:
        rule, row = rules[check], by_name.get(check) or {}
        fail, total = int(row.get("n_fail") or 0), int(row.get("n_total") or 0)
        title = f"{check_label(check)} (whole run)"
        if not total:
            out.append({"key": key, "level": "ok", "title": title, "value": "–", "detail": "no checked records"})
            continue
        level = "ok"
        problem = problems.on_check(check)
        if problem is not None:
            level = "warn" if rule.severity == "warning" and problem[0] == check else "bad"
        elif rule.enabled and fail and fires(_whole_run_rule(rule), fail, total):
            level = "warn"
        detail = f"{fail:,} of {plural(total, 'checked record')} in the whole run"
        if problem is not None and problem[0] == check:
            detail += (f"; open problem: {plural(problem[1], 'record')} still failing (repair, exclude or accept"
                       " it)")
        elif problem is not None:  # a symptom: its records belong to the cause's open problem (#37)
            detail += (f"; part of the open problem \"{check_label(problem[0])}\": {plural(problem[1], 'record')}"
                       " still failing (repair, exclude or accept it)")
        elif fail:
            detail += "; no open problem (its records were repaired, excluded or accepted)"
        out.append({"key": key, "level": level, "title": title, "value": f"{fail / total * 100:.1f}%",
                    "detail": detail})
    return out


def _whole_run_rule(rule: Rule) -> Rule:
    """The rule over a whole run: its threshold counts, not the window's minimum of records."""
    from dataclasses import replace

    return replace(rule, min_records=1)
