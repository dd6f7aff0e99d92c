"""An alarm's likely fix as an action: the settings change and the repair that its words propose (#28 item 7).

The banner's "Apply the likely fix" previews :func:`preview` (the settings diff, the records that would be
re-derived or re-run, counts) and applies :func:`apply` on confirm. Both go through the code paths of the CLI:
``synthwatch fix`` (store.versions.change_settings, a new config version: history appended) and ``synthwatch
rederive`` / ``rerun`` (synthwatch.repair.actions, every earlier output kept in the record's history).

Only fixes the alarm's evidence pins down are proposed; for the others the banner keeps its words and its link to
the Settings & repairs page.
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..quality.alarm_text import current_mode, evidence
from ..quality.detection import overrides  # noqa: F401  - registers the guard of config versions (#35)
from ..store import versions
from . import actions
from .settings_diff import lines

# a doubled max_tokens is the proposal for cut answers, never above this (a server's usual context)
MAX_TOKENS_CEILING = 131_072


class NoLikelyFix(actions.RepairError):
    """The alarm has no fix that can be applied in one step; the message says why."""


def _alarm(conn: Connection, run_id: int, alarm_id: int) -> dict[str, Any]:
    row = conn.execute(text("SELECT id, rule, title, active, evidence_json FROM alarm WHERE id = :a AND run_id = :r"),
                       {"a": alarm_id, "r": run_id}).mappings().first()
    if row is None:
        raise NoLikelyFix(f"run {run_id} has no alarm {alarm_id}")
    return dict(row)


def _mismatch_mode(alarm: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The reading mode a field-mismatch alarm's evidence names (the same rule as its words, alarm_text)."""
    ctx = evidence(alarm).get("ctx") or {}
    fields = sorted(f for f in (ctx.get("fields") or []) if isinstance(f, str))
    now = current_mode(cfg)
    made = ctx.get("mode")
    if fields and made and now != made and (now == "auto" or now in fields):
        return {}  # the settings were fixed since: only the re-derive is left
    target = ([f for f in fields if f != now] or ["auto"])[0]
    return None if target == now else {"reasoning.mode": target}


def proposal(alarm: dict[str, Any], cfg: dict[str, Any], run_kind: str) -> tuple[dict[str, Any], str] | None:
    """(settings changes in dotted keys, maybe empty; "rederive" | "rerun") for an alarm row, or None: no one-step
    fix. Reads nothing, so the banner asks it of every alarm it draws."""
    rule = alarm["rule"]
    if rule == "field_mismatch":
        changes = _mismatch_mode(alarm, cfg)
        return None if changes is None else (changes, "rederive")
    if rule == "think_tags_in_content":
        return ({} if current_mode(cfg) in ("inline", "auto") else {"reasoning.mode": "inline"}), "rederive"
    if rule in ("truncated", "truncated_in_reasoning") and run_kind == "generate":
        mt = (cfg.get("sampling") or {}).get("max_tokens")
        if isinstance(mt, int) and 0 < mt < MAX_TOKENS_CEILING:
            return {"sampling.max_tokens": min(mt * 2, MAX_TOKENS_CEILING)}, "rerun"
    return None


def plan(conn: Connection, run_id: int, alarm_id: int) -> dict[str, Any]:
    """{"alarm", "changes" (dotted keys, maybe empty), "repair" ("rederive" | "rerun")}; NoLikelyFix otherwise."""
    alarm = _alarm(conn, run_id, alarm_id)
    version, cfg = versions.current(conn, run_id)
    kind_row = conn.execute(text("SELECT kind FROM run WHERE id = :r"), {"r": run_id}).first()
    run_kind = kind_row[0] if kind_row else "generate"
    found = proposal(alarm, cfg, run_kind)
    if found is None:
        raise NoLikelyFix(f"alarm #{alarm_id} ({alarm['title']}) has no fix that can be applied in one step: "
                          "choose the settings and the records on the Settings & repairs page")
    return {"alarm": {k: alarm[k] for k in ("id", "rule", "title", "active")}, "changes": found[0],
            "repair": found[1], "version": version, "config": cfg, "run_kind": run_kind}


def preview(engine: Engine, run_id: int, alarm_id: int) -> dict[str, Any]:
    """What applying would do, writing nothing: the settings diff and the repair's counts under the new settings."""
    with engine.connect() as conn:
        p = plan(conn, run_id, alarm_id)
        sel = actions.select(conn, run_id, alarm_id=alarm_id)
        conn.rollback()
    new_cfg = p["config"]
    diff: list[dict[str, Any]] = []
    if p["changes"]:
        try:
            new_cfg = versions.changed_config(p["config"], p["changes"], p["run_kind"])
        except versions.VersionError as exc:
            raise NoLikelyFix(f"the likely fix cannot be saved: {exc}") from None
        diff = [{**c.as_dict(), "kind": versions.kind_of(c.path)} for c in versions.versioned_changes(p["config"], new_cfg)]
    if p["repair"] == "rederive":
        counts = actions.preview_rederive(engine, run_id, sel, config=new_cfg)
    else:
        counts = actions.preview_rerun(engine, run_id, sel)
    return {"alarm": p["alarm"], "changes": p["changes"], "diff": diff, "diff_lines": lines(diff),
            "repair": p["repair"], "version": p["version"], "counts": counts, "max_id": sel.max_id,
            "token": fix_token(p["version"], p["changes"], p["repair"])}


def fix_token(version: int, changes: dict[str, Any], repair: str) -> str:
    """What the preview showed, so that applying refuses when the settings moved on since (another tab, the CLI)."""
    return orjson.dumps({"v": version, "c": changes, "r": repair}, option=orjson.OPT_SORT_KEYS).decode()


def apply(engine: Engine, run_id: int, alarm_id: int, *, token: str, actor: str, start: Any,
          max_id: int | None = None) -> dict[str, Any]:
    """Save the settings change as a new version (if any), then start the repair of the alarm's records with
    ``start(engine, run_id, kind, selection, actor) -> bool`` (the dashboard's background job). The selection is
    pinned to ``max_id`` from the token's preview when given."""
    with engine.connect() as conn:
        p = plan(conn, run_id, alarm_id)
        conn.rollback()
    if fix_token(p["version"], p["changes"], p["repair"]) != token:
        raise NoLikelyFix("the run's settings changed since this preview: look at the new preview before applying")
    out: dict[str, Any] = {"alarm": p["alarm"], "repair": p["repair"], "version": p["version"], "changes": []}
    if p["changes"]:
        res = versions.change_settings(engine, run_id, p["changes"], actor=actor,
                                       reason=f"the likely fix of alarm #{alarm_id} ({p['alarm']['title']})")
        out["version"], out["changes"] = res["version"], res["changes"]
    with engine.connect() as conn:
        sel = actions.select(conn, run_id, alarm_id=alarm_id)
        conn.rollback()
    if max_id is not None:  # the records the preview counted, not ones that finished since
        sel = actions.Selection(sel.description, sel.filters, min(max_id, sel.max_id), sel.ids)
    if p["repair"] == "rerun" and not actions.preview_rerun(engine, run_id, sel)["queued"]:
        out["started"] = False
        return out
    out["started"] = bool(start(engine, run_id, p["repair"], sel, actor))
    return out
