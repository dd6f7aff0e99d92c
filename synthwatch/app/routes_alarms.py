"""Routes: the alarm banner (every page of a run), alarms and check rates (JSON), check settings.

The banner and the checks table read only ``alarm`` and ``check_stat`` rows (small, indexed);
the only writes are acknowledgements and settings (short transactions on the write engine).
A recompute scans the run's records, so it runs in a background thread and the POST returns
at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.engine import Connection, Engine

from ..check_catalog import BIT, CHECK_INFO, CHECK_NAMES, DEFAULT_RULES, extended_rule
from ..check_extended import VERIFIER_KINDS
from ..quality import judge_view
from ..quality.alarm_text import render as render_alarm
from ..quality.checks import ChecksConfigError, parse_settings
from ..quality.detection import Hysteresis, run_problems
from ..quality.detection.alarms import (
    AlarmNotFound,
    acknowledge,
    active_overrides,
    banner_alarms,
    effective_rules,
    group_alarms,
    list_alarms,
    list_overrides,
    rules_for,
    snoozed_alarms,
    worst_severity,
)
from ..quality.detection.overrides import list_overrides as list_weakenings
from ..quality.recompute import recompute, save_settings
from ..repair.likely_fix import proposal
from ..settings_policy import (
    DASHBOARD_ACTORS,
    Context,
    PolicyError,
    check_change,
    operator_entry_points,
    recheck_versions,
)
from ..store import queue as store
from ..store import versions
from ..store.models import LIVE_STATUSES
from .deps import ReadConn, WriteEngine, render

log = logging.getLogger("synthwatch.app.alarms")
router = APIRouter()

BANNER_POLL_S = 2
_recomputing: set[int] = set()
_recompute_lock = threading.Lock()
_last_recompute: dict[int, dict[str, Any]] = {}


def _run(conn: Connection, run_id: int) -> dict[str, Any]:
    try:
        return store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None


def _live(run: dict[str, Any]) -> bool:
    return run.get("status") in LIVE_STATUSES


def _config(run: dict[str, Any]) -> dict[str, Any]:
    try:
        cfg = orjson.loads(run.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _rules(cfg: dict[str, Any]) -> dict[str, Any]:
    try:
        settings = parse_settings(cfg.get("checks") or {})
    except ChecksConfigError:
        return effective_rules({})
    return {**effective_rules(settings.rules), **rules_for(settings.extended_names(), settings.rules)}


def banner_context(conn: Connection, run_id: int) -> dict[str, Any]:
    """One data function for the banner fragment and the JSON list. Each alarm's message and fix are computed
    from its evidence and the run's current settings (alarm_text.render), with when its rule pauses."""
    run = _run(conn, run_id)
    overrides = list_overrides(conn, run_id)
    cfg = _config(run)
    rules = _rules(cfg)
    alarms = [render_alarm(a, cfg, rules, run_name=run["name"], conn=conn) for a in banner_alarms(conn, run_id)]
    for a in alarms:  # "Apply the likely fix": only where the alarm's evidence pins the fix down
        a["one_step_fix"] = proposal(a, cfg, str(run.get("kind") or "generate")) is not None
    hold = []
    if _live(run):
        claimed = int(run.get("total") or 0) - int(run.get("n_pending") or 0)
        hold = [a["id"] for a in store.alarm_gate(conn, run_id, claimed, time.time(), reopen=False)[0]]
    try:
        hysteresis = Hysteresis.of(parse_settings(cfg.get("checks") or {})).words()
    except ChecksConfigError:
        hysteresis = Hysteresis().words()
    return {"run": {"id": run["id"], "name": run["name"], "status": run["status"], "desired": run["desired"]},
            # the one count (quality.detection.problem_counts): the runs list, the strip, the tab title and the API
            "problems": run_problems(conn, run_id), "hysteresis_words": hysteresis,
            "weakenings": list_weakenings(conn, run_id),
            "alarms": alarms, "groups": group_alarms(alarms), "worst": worst_severity(alarms),
            "live": _live(run), "poll_s": BANNER_POLL_S, "hold_ids": hold,
            "overrides": overrides, "overrides_by_check": {o["check_name"] for o in overrides}}


def checks_context(conn: Connection, run_id: int) -> dict[str, Any]:
    from ..quality.recompute import check_rates
    from ..quality.verdicts import pending_estimate

    run = _run(conn, run_id)
    raw = _config(run).get("checks") or {}
    try:
        settings = parse_settings(raw)
        settings_error = None
    except ChecksConfigError as exc:
        settings = parse_settings({})
        settings_error = str(exc)
    extended = settings.extended_names()  # their rules are set here like a built-in check's (#30)
    rules = {**effective_rules(settings.rules), **rules_for(extended, settings.rules)}
    return {
        "run": {"id": run["id"], "name": run["name"], "status": run["status"]},
        "live": _live(run),
        "extended": set(extended),
        "checks": check_rates(conn, run_id),
        "pending_checks": pending_estimate(conn, run_id, int(run.get("n_ok") or 0), settings.extended_names()),
        "rules": [rules[n] for n in (*CHECK_NAMES, *extended)],
        "settings": settings,
        "settings_error": settings_error,
        "disabled": set(settings.disabled),
        "recomputing": run_id in _recomputing,
        "last_recompute": _last_recompute.get(run_id),
        "no_pause": active_overrides(conn, run_id),
        "poll_s": BANNER_POLL_S,
        "judge": judge_view.summary(conn, run),
        "hysteresis_words": Hysteresis.of(settings).words(),
        "overrides": list_weakenings(conn, run_id),
    }


# ------------------------------------------------------------------------------------ banner


@router.get("/runs/{run_id}/alarms/banner", include_in_schema=False)
def banner(request: Request, run_id: int, conn: ReadConn, show_all: bool = Query(False, alias="all")) -> Response:
    """The full cards (run page: the first cause open, the rest behind "N more"; ``all=1``: the checks page, all open)."""
    ctx = banner_context(conn, run_id)
    ctx["show_all"] = show_all
    return render(request, "_alarms_banner.html", ctx)


@router.get("/runs/{run_id}/alarms/strip", include_in_schema=False)
def strip(request: Request, run_id: int, conn: ReadConn) -> Response:
    """One line per run for every other page: the count and worst severity lead to the full cards."""
    return render(request, "_alarm_strip.html", banner_context(conn, run_id))


@router.post("/runs/{run_id}/alarms/{alarm_id}/ack", include_in_schema=False)
async def ack_form(request: Request, run_id: int, alarm_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    """The card's one acknowledge control: for N records or M minutes (or, with no amount, until it fails again)."""
    form = await request.form()
    records, minutes = ack_for(str(form.get("ack_unit") or ""), str(form.get("ack_amount") or ""))
    try:
        await run_in_threadpool(acknowledge, engine, run_id, alarm_id, for_records=records, for_minutes=minutes)
    except AlarmNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return await run_in_threadpool(_after_ack, request, run_id, conn)


def ack_for(unit: str, amount: str) -> tuple[int | None, float | None]:
    """The acknowledge control's "for N records / M minutes" (no unit or no amount: until the check fails again)."""
    if not unit or not amount.strip():
        return None, None
    try:
        x = float(amount)
    except ValueError:
        raise HTTPException(400, f"acknowledge for how many {unit[:20]}? got {amount[:40]!r}") from None
    if not (x > 0 and x < 1e9):
        raise HTTPException(400, f"acknowledge for a positive number of {unit[:20]}, got {amount[:40]!r}")
    if unit == "minutes":
        return None, x
    if unit != "records" or x != int(x):
        raise HTTPException(400, f"acknowledge for a whole number of records or for minutes, got {amount[:40]!r}")
    return int(x), None


def _after_ack(request: Request, run_id: int, conn: Connection) -> Response:
    conn.rollback()  # see the acknowledgement just written
    if request.headers.get("HX-Request") == "true":
        ctx = banner_context(conn, run_id)
        ctx["show_all"] = request.query_params.get("all") == "1"
        return render(request, "_alarms_banner.html", ctx)
    return RedirectResponse(f"/runs/{run_id}/checks", status_code=303)


# ------------------------------------------------------------------------------------ checks page


@router.get("/help/checks", include_in_schema=False)
def checks_help_page(request: Request) -> Response:
    """Every check: its label, identifier, what fails it and its default rule (the table of docs/checks.md)."""
    from ..quality.user_checks import installed_entry_points

    extended = [(f"verify_{k}", f"{k} verifier: the answer against a reference field of the dataset row")
                for k in VERIFIER_KINDS]
    extended += [("user:<name>", "your Python function (entry point or module:function) returns a failing verdict"),
                 ("rule:<name>", "a TOML rule (regex, length bounds, language) does not hold"),
                 ("language", "the answer is not in the prompt's (or the configured) language (lingua)"),
                 ("near_duplicate", "the answer is a near-duplicate of another prompt's earlier answer, or of a row "
                  "of the --dedup-against dataset (MinHash LSH)"),
                 ("near_duplicate_in_prompt", "a sample is a near-duplicate of an earlier sample of the same prompt")]
    return render(request, "help_checks.html", {
        "rules": [DEFAULT_RULES[n] for n in CHECK_NAMES if n in DEFAULT_RULES],
        "extended": [(name, what, extended_rule(name)) for name, what in extended], "entry_points": sorted(installed_entry_points().items())})


@router.get("/runs/{run_id}/checks", include_in_schema=False)
def checks_page(request: Request, run_id: int, conn: ReadConn) -> Response:
    ctx = checks_context(conn, run_id)
    ctx["history"] = list_alarms(conn, run_id, limit=100)
    ctx["saved"] = request.query_params.get("saved") == "1"
    ctx["form_error"] = None
    return render(request, "checks_settings.html", ctx)


@router.get("/runs/{run_id}/checks/table", include_in_schema=False)
def checks_table(request: Request, run_id: int, conn: ReadConn) -> Response:
    return render(request, "_checks_table.html", checks_context(conn, run_id))


def _form_to_settings(form: Any, current: dict[str, Any]) -> dict[str, Any]:
    """The settings form (one row per rule) -> a `[checks]` table; bad numbers raise ValueError naming the field."""
    raw = dict(current)
    rules: dict[str, Any] = dict(raw.get("rules") or {})
    disabled: list[str] = list(raw.get("disabled") or [])
    try:
        extended = parse_settings(current).extended_names()
    except ChecksConfigError:
        extended = []
    defaults = {**DEFAULT_RULES, **{n: extended_rule(n) for n in extended}}
    for name in (*CHECK_NAMES, *extended):
        ov = dict(rules.get(name) or {})
        for fld, conv in (("threshold", float), ("window", int), ("min_records", int)):
            v = str(form.get(f"{fld}__{name}", "")).strip()
            if v == "":
                continue
            try:
                value = conv(v.rstrip("%")) / (100 if fld == "threshold" and v.endswith("%") else 1)
            except ValueError:
                raise ValueError(f"{name} {fld}: {v!r} is not a number") from None
            if value != getattr(defaults[name], fld):
                ov[fld] = value
            else:
                ov.pop(fld, None)
        # an unticked checkbox is not sent: its absence means "off" only on a row the form showed (shown__NAME),
        # so a post that omits fields never switches a check off (#34, #35)
        shown = form.get(f"shown__{name}") is not None
        for fld in ("enabled", "auto_pause"):
            if fld == "auto_pause" and form.get(f"auto_pause_shown__{name}") is None:
                continue  # shown as "on": turning it off is its own action, with a reason (set_auto_pause)
            if fld == "enabled" and not shown:
                continue
            on = form.get(f"{fld}__{name}") is not None
            if on != getattr(defaults[name], fld):
                ov[fld] = on
            else:
                ov.pop(fld, None)
        if name in BIT and shown:  # an extended check is on by its own table
            if form.get(f"computed__{name}") is None:
                disabled.append(name)
            else:
                disabled = [d for d in disabled if d != name]
        if ov:
            rules[name] = ov
        else:
            rules.pop(name, None)
    raw["rules"] = rules
    raw["disabled"] = list(dict.fromkeys(disabled))
    canary = dict(raw.get("canary") or {})
    every = str(form.get("canary_every_n", "")).strip()
    if every:
        try:
            canary["every_n"] = int(every)
        except ValueError:
            raise ValueError(f"canary every_n: {every!r} is not a whole number") from None
    raw["canary"] = canary
    webhook = dict(raw.get("webhook") or {})
    url = str(form.get("webhook_url", "")).strip()
    if url:
        webhook["url"] = url
    elif "webhook_url" in form:  # emptied on the form (a post without the field keeps it)
        webhook.pop("url", None)
    raw["webhook"] = webhook
    return raw


@router.post("/runs/{run_id}/checks/settings", include_in_schema=False)
async def settings_form(request: Request, run_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    form = await request.form()
    run = _run(conn, run_id)
    conn.rollback()
    try:
        raw = _form_to_settings(form, _config(run).get("checks") or {})
        raw = checks_policy(request, conn, run_id, raw)
        save_settings(engine, run_id, raw, actor="ui", reason=str(form.get("reason") or "") or None)
    except (ValueError, ChecksConfigError) as exc:  # PolicyError is a ValueError naming each refused key
        ctx = checks_context(conn, run_id)
        ctx.update(history=list_alarms(conn, run_id, limit=100), saved=False, form_error=str(exc))
        return render(request, "checks_settings.html", ctx, status_code=400)
    return RedirectResponse(f"/runs/{run_id}/checks?saved=1", status_code=303)


def _unloadable(run: dict[str, Any]) -> str | None:
    """A user check of the run that this process cannot import: a recompute here is refused, naming it (#35)."""
    from ..quality.user_checks import loadable_error

    why = loadable_error(_config(run).get("checks"))
    return None if why is None else f"{why}; nothing was re-checked"


def checks_policy(request: Request, conn: Connection, run_id: int, raw: dict[str, Any]) -> dict[str, Any]:
    """A `[checks]` table from the dashboard through the settings policy (synthwatch.settings_policy): no import
    path, only entry points the operator's own configuration enabled, every number bounded; PolicyError names
    each refused key (as ``checks.KEY``)."""
    cur = versions.current(conn, run_id)[1]
    history = versions.history(conn, run_id)
    conn.rollback()
    ctx = Context(request.app.state.settings, operator_entry_points=operator_entry_points(
        [cfg for actor, cfg in history if actor not in DASHBOARD_ACTORS]))
    return check_change({"checks": raw}, cur, ctx)["checks"]  # type: ignore[no-any-return]


def start_recompute(engine: Engine, run_id: int) -> bool:
    """Start a recompute in a background thread; False when one is already running for this run."""
    with _recompute_lock:
        if run_id in _recomputing:
            return False
        _recomputing.add(run_id)

    def work() -> None:
        try:
            done = recompute(engine, run_id)
            from ..quality.extended import recheck  # noqa: PLC0415 - starts check processes only when a run has them

            done["extended"] = recheck(engine, run_id, all_records=True)
            _last_recompute[run_id] = done
        except Exception as exc:  # reported on the page, never lost in a thread
            log.exception("recompute of run %d failed", run_id)
            _last_recompute[run_id] = {"error": f"{exc.__class__.__name__}: {exc}"}
        finally:
            with _recompute_lock:
                _recomputing.discard(run_id)

    threading.Thread(target=work, name=f"synthwatch-recompute-{run_id}", daemon=True).start()
    return True


def recompute_refusal(request: Request, conn: Connection, run_id: int) -> str | None:
    """Why a recompute may not run the run's checks in the dashboard: its stored settings hold something a dashboard
    change brought in that the settings policy refuses (an import path, say), re-checked before anything runs."""
    cur = versions.current(conn, run_id)[1]
    history = versions.history(conn, run_id)
    conn.rollback()
    problems = recheck_versions(history, cur, request.app.state.settings)
    if not problems:
        return None
    return ("the run's settings hold what the dashboard may not set (a dashboard change stored it): "
            + "; ".join(f"{k}: {why}" for k, why in problems))


@router.post("/runs/{run_id}/checks/recompute", include_in_schema=False)
def recompute_form(request: Request, run_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    _run(conn, run_id)
    # the policy first: a user check a dashboard change stored is refused before anything imports it
    why = recompute_refusal(request, conn, run_id) or _unloadable(_run(conn, run_id))
    if why is not None:
        raise HTTPException(409, why)
    start_recompute(engine, run_id)
    return RedirectResponse(f"/runs/{run_id}/checks", status_code=303)


# ------------------------------------------------------------------------------------ JSON API


def _jsonable_rule(rule: Any) -> dict[str, Any]:
    return {k: getattr(rule, k) for k in rule.__slots__}


@router.get("/api/runs/{run_id}/alarms", tags=["alarms"])
def api_alarms(run_id: int, conn: ReadConn) -> dict[str, Any]:
    """Every alarm of the run (newest first) and the ones the banner shows (active, not acknowledged)."""
    ctx = banner_context(conn, run_id)
    p = ctx["problems"]
    return {"run_id": run_id, "banner": ctx["alarms"], "alarms": list_alarms(conn, run_id),
            "snoozed": snoozed_alarms(conn, run_id), "auto_pause_off": ctx["overrides"],
            # the one count (quality.detection.problem_counts), as the runs list, the strip and the tab title show it
            "problems": {"alarms": p.alarms, "unacknowledged": p.unacked, "episodes": p.episodes,
                         "open_items": p.items, "records_failing": p.failing},
            "hysteresis": ctx["hysteresis_words"], "overrides": list_weakenings(conn, run_id)}


@router.post("/api/runs/{run_id}/alarms/{alarm_id}/ack", tags=["alarms"])
def api_ack(run_id: int, alarm_id: int, engine: WriteEngine, for_records: int | None = None,
            for_minutes: float | None = None) -> dict[str, Any]:
    """Snooze an alarm: until its check fails again, or for ``for_records`` claimed records / ``for_minutes``."""
    try:
        return acknowledge(engine, run_id, alarm_id, actor="api", for_records=for_records, for_minutes=for_minutes)
    except AlarmNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except store.ControlError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("/api/runs/{run_id}/judge", tags=["alarms"])
def api_judge(run_id: int, conn: ReadConn) -> Any:
    """The run's judge model: verdicts by state, its own requests, tokens and cost (apart from the run's), and how
    often people's flags and the judge agree (null when the run has no judge)."""
    return {"run_id": run_id, "judge": judge_view.summary(conn, _run(conn, run_id))}


@router.get("/api/runs/{run_id}/checks", tags=["alarms"])
def api_checks(run_id: int, conn: ReadConn) -> dict[str, Any]:
    """Per-check rates (whole run and rolling window), the effective rules and the check settings."""
    ctx = checks_context(conn, run_id)
    return {
        "run_id": run_id,
        "checks": ctx["checks"],
        "rules": {r.name: _jsonable_rule(r) for r in ctx["rules"]},
        "settings": ctx["settings"].model_dump(mode="json"),
        "settings_error": ctx["settings_error"],
        "recomputing": ctx["recomputing"],
        "last_recompute": ctx["last_recompute"],
        "descriptions": {**CHECK_INFO, **ctx["settings"].extended_info()},
        "pending_checks": ctx["pending_checks"],
    }


@router.post("/api/runs/{run_id}/checks/settings", tags=["alarms"])
async def api_settings(request: Request, run_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    """Replace the run's `[checks]` table (JSON object, same keys as the config file)."""
    _run(conn, run_id)
    conn.rollback()
    try:
        raw = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        return JSONResponse({"detail": f"body is not valid JSON: {exc}"}, status_code=400)
    if not isinstance(raw, dict):
        return JSONResponse({"detail": "body must be a JSON object (the [checks] table)"}, status_code=400)
    try:
        raw = checks_policy(request, conn, run_id, raw)
        # a change that weakens detection needs ?reason=... (synthwatch.quality.detection.overrides)
        settings = save_settings(engine, run_id, raw, actor="api", reason=request.query_params.get("reason"))
    except PolicyError as exc:
        return JSONResponse({"detail": str(exc), "refused": [k for k, _ in exc.problems]}, status_code=400)
    except ChecksConfigError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return JSONResponse({"run_id": run_id, "settings": settings.model_dump(mode="json")})


@router.post("/api/runs/{run_id}/checks/recompute", tags=["alarms"], status_code=202)
def api_recompute(request: Request, run_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    """Re-run every check on the run's records with its current settings (background; poll /checks)."""
    _run(conn, run_id)
    why = recompute_refusal(request, conn, run_id) or _unloadable(_run(conn, run_id))
    if why is not None:
        return JSONResponse({"detail": why}, status_code=409)
    started = start_recompute(engine, run_id)
    return JSONResponse({"run_id": run_id, "started": started,
                         "detail": "recompute started" if started else "a recompute is already running"},
                        status_code=202)
