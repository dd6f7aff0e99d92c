"""Routes: a run's settings (config versions), repairs (re-derive, re-run, undo) and auto-pause overrides.

One data function (:func:`repair_context`) feeds the page and its fragments. Previews are computed in the
request (they read, never write); applying a repair runs in a background thread (one per run at a time)
that writes in short transactions, and the page polls its progress while it runs.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Annotated, Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..capture.reasoning import MODES as REASONING_MODES
from ..check_catalog import CHECK_INFO, CHECK_NAMES, DEFAULT_RULES
from ..quality.detection.alarms import OverrideError, list_overrides, set_auto_pause
from ..quality.verdicts import configured_checks
from ..repair import actions as repair
from ..repair import history as repair_history
from ..repair import settings_diff
from ..settings_policy import DASHBOARD_ACTORS, ID_MAX, Context, PolicyError, check_change, operator_entry_points
from ..store import queue as store
from ..store import versions
from .deps import ReadConn, ReadEngine, WriteEngine, render
from .form_errors import FormErrors
from .launch import LaunchError
from .routes_review import check_options

log = logging.getLogger("synthwatch.app.repair")
router = APIRouter()

_jobs: dict[int, dict[str, Any]] = {}  # run id -> the running / last repair job started from the dashboard
_jobs_lock = threading.Lock()
SELECT_KEYS = ("alarm", "check", "flag", "ids")


def _run(conn: Connection, run_id: int) -> dict[str, Any]:
    try:
        run = store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None
    try:
        run["config"] = orjson.loads(run["config_json"] or "{}")
    except orjson.JSONDecodeError:
        run["config"] = {}
    return run


def job_context(conn: Connection, run_id: int) -> dict[str, Any]:
    """The running (or last) repair job of the run: what the job fragment polls, every second while it runs."""
    run = _run(conn, run_id)
    with _jobs_lock:
        job = dict(_jobs[run_id]) if run_id in _jobs else None
    return {"run": run, "job": job}


def repair_context(conn: Connection, run_id: int) -> dict[str, Any]:
    ctx = job_context(conn, run_id)
    run, job = ctx["run"], ctx["job"]
    options, extended = check_options(conn, run_id), set(configured_checks(run["config_json"]))
    return {
        "run": run,
        "versions": list(reversed(versions.list_versions(conn, run_id))),
        "repairs": repair_history.list_repairs(conn, run_id),
        "overrides": list_overrides(conn, run_id),
        "check_names": CHECK_NAMES,
        "check_info": CHECK_INFO,
        "check_options": options,  # every check the run knows (#38): re-run a user check's records
        # the auto-pause picker: the catalogue's checks that have an alarm rule (built-in and the run's extended
        # ones, as set_auto_pause accepts), never only the built-in ones
        "pause_options": [o for o in options if o["name"] in DEFAULT_RULES or o["name"] in extended],
        "reasoning_modes": REASONING_MODES,
        "job": job,
        "alarms": [dict(r) for r in conn.execute(
            text("SELECT id, rule, title, active, acked_at FROM alarm WHERE run_id = :r ORDER BY id DESC"
                       " LIMIT 50"), {"r": run_id}).mappings()],
        "reading": repair.ReadingSettings.of(run["config"]).__dict__,
    }


def _selection_params(data: Any) -> dict[str, Any]:
    """alarm / check / flag / ids / any records-table filter key, from a form or query string."""
    out: dict[str, Any] = {}
    alarm = str(data.get("alarm") or "").strip()
    if alarm:
        try:
            out["alarm_id"] = int(alarm)
        except ValueError:
            raise repair.RepairError(f"alarm: not an alarm id: {alarm[:40]!r}") from None
        if not 0 <= out["alarm_id"] <= ID_MAX:
            raise repair.RepairError(f"alarm: not an alarm id: {alarm[:40]!r}")
    for key in ("check", "flag"):
        v = str(data.get(key) or "").strip()
        if v:
            out[key] = v
    ids = str(data.get("ids") or "").strip()
    if ids:
        try:
            out["ids"] = [int(x) for x in ids.replace(" ", "").split(",") if x]
        except ValueError:
            raise repair.RepairError(f"ids: not a comma-separated list of record ids: {ids[:60]!r}") from None
        if any(not 0 <= i <= ID_MAX for i in out["ids"]):
            raise repair.RepairError(f"ids: a record id is between 0 and {ID_MAX}: {ids[:60]!r}")
    filt = str(data.get("filter") or "").strip()
    if filt:
        from urllib.parse import parse_qsl

        out["params"] = dict(parse_qsl(filt.lstrip("?")))
    return out


def _select(conn: Connection, run_id: int, data: Any) -> repair.Selection:
    return repair.select(conn, run_id, **_selection_params(data))


# ------------------------------------------------------------------------------------------ pages


@router.get("/runs/{run_id}/repair", include_in_schema=False)
def repair_page(request: Request, run_id: int, conn: ReadConn) -> Response:
    ctx = repair_context(conn, run_id)
    q = request.query_params
    ctx["prefill"] = {k: q.get(k, "") for k in (*SELECT_KEYS, "filter", "kind")}
    ctx["message"] = q.get("message")
    ctx["error"] = q.get("error")
    ctx["preview"] = None
    return render(request, "repair.html", ctx)


@router.get("/runs/{run_id}/repair/job", include_in_schema=False)
def repair_job_fragment(request: Request, run_id: int, conn: ReadConn) -> Response:
    # not repair_context: its version counts scan the run's records, and this polls every second during a repair.
    # The last poll (the job over) redraws the repairs table beside it, so its row no longer says "running" (#28)
    ctx = job_context(conn, run_id)
    ctx["fragment"] = True
    if ctx["job"] and ctx["job"]["state"] != "running":
        ctx["repairs"] = repair_history.list_repairs(conn, run_id)
    return render(request, "_repair_job.html", ctx)


def _kept_selection(form: Any, prefix: str = "") -> dict[str, str]:
    """The records the page was choosing (an alarm, a check, ...), from a form, to come back to them: saving
    settings mid-repair keeps the alarm being repaired, so Preview works right after (#26)."""
    return {k: str(form.get(prefix + k) or "").strip()[:2000] for k in (*SELECT_KEYS, "filter", "kind")}


def back_to_repair(run_id: int, **q: str) -> RedirectResponse:
    """303 to the run's Settings & repairs page with the page's selection and message in the query."""
    return RedirectResponse(f"/runs/{run_id}/repair?{urlencode({k: v for k, v in q.items() if v})}", status_code=303)


def _settings_field(posted: set[str]) -> Any:
    """RunConfig location -> the settings form's field (``set.`` + its dotted path), for the fields it has."""
    def field(loc: tuple[str | int, ...], msg: str) -> str | None:
        if not loc:
            return "set.endpoints" if "endpoint" in msg and "set.endpoints" in posted else None
        top = str(loc[0])
        if top in ("endpoints", "tokenizer"):
            name = "set.endpoints" if top == "endpoints" else "set.tokenizer.name_or_path"
            return name if name in posted else None
        name = "set." + ".".join(str(p) for p in loc)
        return name if name in posted else None
    return field


@router.post("/runs/{run_id}/settings", include_in_schema=False)
async def settings_form(request: Request, run_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    """Every problem of the form at once, each beside its field, with what was entered kept; a valid change
    is a new config version."""
    form = await request.form()
    run = _run(conn, run_id)
    errors = FormErrors()
    entered = {k: str(v) for k, v in form.multi_items() if k.startswith("set.") or k == "reason"}
    changes: dict[str, Any] = {}
    for key, raw in form.multi_items():
        if not key.startswith("set.") or not str(raw).strip():
            continue
        path = key.removeprefix("set.")
        value: Any = str(raw).strip()
        if path in ("reasoning.expect", "reasoning.prefilled_open", "stream"):
            value = value == "true"
        elif path in ("sampling.max_tokens", "sampling.seed", "retries.max_attempts"):
            try:
                value = int(value)
            except ValueError:
                errors.add(key, path, f"not a whole number: {value[:40]!r}")
                continue
        elif path in ("sampling.temperature", "sampling.top_p", "timeouts.total_s", "timeouts.idle_s",
                      "timeouts.connect_s"):
            try:
                value = float(value)
            except ValueError:
                errors.add(key, path, f"not a number: {value[:40]!r}")
                continue
        elif path == "sampling.extra_body":
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                errors.add(key, path, f"not valid JSON ({exc})")
                continue
        elif path == "endpoints":
            value = _endpoint_lines(value, versions.current(conn, run_id)[1].get("endpoints") or [])
        changes[path] = value
    # only what differs from the current version is a change
    cur = versions.current(conn, run_id)[1]
    history = versions.history(conn, run_id)
    conn.rollback()
    changes = {k: v for k, v in changes.items() if _get(cur, k) != v}
    try:
        patch = dashboard_patch(versions.nest(changes), cur, request.app.state.settings, history)
    except PolicyError as exc:
        for key, why in exc.problems:
            errors.add(_policy_field(key, set(entered)), key, why)
        patch = {}
    except versions.VersionError as exc:
        errors.add(None, "settings", str(exc))
        patch = {}
    if patch:  # the whole new config validated, also when some fields above could not be read
        try:
            versions.changed_config(cur, patch, run["kind"])
        except versions.VersionError as exc:
            if exc.problems:
                errors.add_validation(exc.problems, _settings_field(set(entered)),
                                      skip=[p.field for p in errors.problems if p.field])
            elif not errors:
                errors.add(None, "settings", str(exc))
    elif not errors:
        errors.add(None, "settings", "nothing changes: the run already has these settings")
    if not errors:
        try:
            res = versions.change_settings(engine, run_id, patch, actor="ui", reason=str(form.get("reason") or ""))
        except (versions.VersionError, store.NotFound) as exc:
            errors.add(None, "settings", str(exc))
    if errors:
        ctx = repair_context(conn, run_id)
        ctx.update(prefill=_kept_selection(form, "keep."), message=None, error=None, preview=None,
                   errors=errors, entered=entered)
        return render(request, "repair.html", ctx, status_code=400)
    said = "; ".join(settings_diff.lines(res["changes"])).replace(" -> ", " → ")
    return back_to_repair(run_id, message=f"Config version {res['version']}: {said}", **_kept_selection(form, "keep."))


def _endpoint_lines(value: str, current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The settings form's endpoints: one per line, `URL [KEY_VARIABLE]`; an endpoint kept from the current
    version keeps the rest of its settings (name, TLS, headers, prices)."""
    by_url = {str(e.get("base_url", "")).rstrip("/"): e for e in current if isinstance(e, dict)}
    out = []
    for line in value.splitlines():
        parts = line.split()
        if not parts:
            continue
        url = parts[0].rstrip("/")
        ep = dict(by_url.get(url) or {"base_url": url})
        if len(parts) > 1:
            ep["api_key_env"] = parts[1]
        elif url not in by_url:
            ep.pop("api_key_env", None)
        out.append(ep)
    return out


def _policy_field(key: str, posted: set[str]) -> str | None:
    """The settings form's field of a key the settings policy refused."""
    top = key.split(".", 1)[0].split("[", 1)[0]
    name = {"endpoints": "set.endpoints", "tokenizer": "set.tokenizer.name_or_path"}.get(top, "set." + key)
    return name if name in posted else None


def dashboard_patch(patch: dict[str, Any], current: dict[str, Any], settings: Any,
                    history: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A settings change from the dashboard or its API through the settings policy (synthwatch.settings_policy):
    PolicyError names each key it may not set; the change with its paths resolved otherwise."""
    ctx = Context(settings, operator_entry_points=operator_entry_points(
        [cfg for actor, cfg in history if actor not in DASHBOARD_ACTORS]))
    return check_change(patch, current, ctx)


def _get(cfg: dict[str, Any], path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


@router.post("/runs/{run_id}/repair/preview", include_in_schema=False)
async def preview_form(request: Request, run_id: int, conn: ReadConn, read: ReadEngine) -> Response:
    form = await request.form()
    ctx = repair_context(conn, run_id)
    kind = str(form.get("kind") or "rederive")
    ctx["prefill"] = {k: str(form.get(k) or "") for k in (*SELECT_KEYS, "filter")} | {"kind": kind}
    ctx["message"] = ctx["error"] = None
    ctx["preview"] = None
    try:
        sel = _select(conn, run_id, form)
        conn.rollback()
        if kind == "rerun":
            ctx["preview"] = {"kind": kind, **repair.preview_rerun(read, run_id, sel)}
        else:
            ctx["preview"] = {"kind": "rederive", **repair.preview_rederive(read, run_id, sel)}
    except repair.RepairError as exc:
        ctx["error"] = str(exc)
        return render(request, "repair.html", ctx, status_code=400)
    return render(request, "repair.html", ctx)


def start_job(engine: Engine, run_id: int, kind: str, sel: repair.Selection, actor: str) -> bool:
    """Apply a repair in a background thread; False when one is already running for this run."""
    with _jobs_lock:
        if _jobs.get(run_id, {}).get("state") == "running":
            return False
        _jobs[run_id] = {"kind": kind, "state": "running", "started": time.time(), "written": 0,
                         "selection": sel.description}

    def work() -> None:
        try:
            if kind == "rerun":
                res = repair.rerun_records(engine, run_id, sel, actor=actor)
            elif kind == "rederive":
                res = repair.rederive_records(engine, run_id, sel, actor=actor,
                                              progress=lambda p: _jobs[run_id].update(written=p["written"]))
            else:
                raise repair.RepairError(f"unknown repair {kind!r}")
            with _jobs_lock:
                _jobs[run_id].update(state="done", result={k: v for k, v in res.items()
                                                           if k not in ("examples", "cannot_examples")})
        except Exception as exc:  # reported on the page, never lost in a thread
            log.exception("repair of run %d failed", run_id)
            with _jobs_lock:
                _jobs[run_id].update(state="failed", error=f"{exc.__class__.__name__}: {exc}"[:2000])

    threading.Thread(target=work, name=f"synthwatch-repair-{run_id}", daemon=True).start()
    return True


@router.post("/runs/{run_id}/repair/apply", include_in_schema=False)
async def apply_form(request: Request, run_id: int, engine: WriteEngine, conn: ReadConn) -> Response:
    form = await request.form()
    kind = str(form.get("kind") or "")
    if kind not in ("rederive", "rerun"):
        return back_to_repair(run_id, error=f"unknown repair {kind[:40]!r}")
    try:
        sel = _select(conn, run_id, form)
    except repair.RepairError as exc:
        return back_to_repair(run_id, error=str(exc))
    max_id = str(form.get("max_id") or "")
    if max_id.isdigit() and int(max_id) <= ID_MAX:  # the records the preview counted, not ones that finished since
        sel = repair.Selection(sel.description, sel.filters, int(max_id), sel.ids)
    if kind == "rerun":
        prev = repair.preview_rerun(engine, run_id, sel)
        if not prev["queued"]:  # no job, no repair row
            return back_to_repair(run_id, message=repair.nothing_to_rerun(prev["selected"]), **_kept_selection(form))
    if not start_job(engine, run_id, kind, sel, actor="ui"):
        return back_to_repair(run_id, error="a repair of this run is already running")
    return back_to_repair(run_id, message=f"{'Re-derive' if kind == 'rederive' else 'Re-run'} started: {sel.description}")


@router.post("/runs/{run_id}/repairs/{repair_id}/undo", include_in_schema=False)
def undo_form(run_id: int, repair_id: int, engine: WriteEngine) -> Response:
    try:
        res = repair_history.undo(engine, run_id, repair_id, actor="ui")
    except repair.RepairError as exc:
        return back_to_repair(run_id, error=str(exc))
    return back_to_repair(run_id, message=f"Undid repair #{repair_id}: {res['restored']} records restored"
                 + (f", {res['skipped']} changed again since and left as they are" if res["skipped"] else ""))


@router.post("/runs/{run_id}/autopause", include_in_schema=False)
def autopause_form(run_id: int, engine: WriteEngine, check: Annotated[str, Form()], state: Annotated[str, Form()],
                   reason: Annotated[str, Form()] = "", back: Annotated[str, Form()] = "") -> Response:
    try:
        set_auto_pause(engine, run_id, check, state == "on", reason=reason, actor="ui")
    except (OverrideError, store.NotFound) as exc:
        return back_to_repair(run_id, error=str(exc))
    if back == "run":
        return RedirectResponse(f"/runs/{run_id}", status_code=303)
    return back_to_repair(run_id, message=f"Auto-pause for {check} is {'on' if state == 'on' else 'off'}")


# ------------------------------------------------------------------------------------------ JSON API


class SettingsBody(BaseModel):
    changes: dict[str, Any] = Field(description="Dotted keys (or nested tables) of the run config to change, "
                                                "e.g. {\"reasoning.mode\": \"reasoning\"}")
    reason: str | None = Field(None, max_length=1000)


RowId = Annotated[int, Field(ge=0, le=ID_MAX)]  # a database id (64-bit): larger ones are refused, naming the field


class SelectionBody(BaseModel):
    alarm: RowId | None = Field(None, description="the records this alarm names")
    check: str | None = Field(None, max_length=200, description="records failing this check: any check of the run "
                              "(built-in, verify_*/verify:*, rule:*, user:*, language, near_duplicate, judge)")
    flag: str | None = Field(None, description="good | bad | flagged | unreviewed")
    filter: dict[str, str] | None = Field(None, description="records-table filter parameters, `where` (a selection "
                                          "expression, e.g. `user:boxed=fail or language=fail`) included")
    ids: list[RowId] | None = Field(None, max_length=1_000_000)
    dry_run: bool = Field(False, description="preview only: change nothing")
    max_id: RowId | None = Field(None, description="pin the selection to ids <= this (from a preview)")


class AutoPauseBody(BaseModel):
    check: str
    auto_pause: bool
    reason: str | None = Field(None, max_length=2000)


def _json_select(conn: Connection, run_id: int, body: SelectionBody) -> repair.Selection:
    sel = repair.select(conn, run_id, alarm_id=body.alarm, check=body.check, flag=body.flag, params=body.filter,
                        ids=body.ids)
    if body.max_id is not None:
        sel = repair.Selection(sel.description, sel.filters, min(body.max_id, sel.max_id), sel.ids)
    return sel


@router.get("/api/runs/{run_id}/versions", tags=["repair"], summary="Config versions with changes and counts")
def api_versions(run_id: int, conn: ReadConn) -> Any:
    run = _run(conn, run_id)
    return {"run_id": run_id, "current": run["config_version"], "versions": versions.list_versions(conn, run_id)}


@router.post("/api/runs/{run_id}/settings", tags=["repair"],
             summary="Change a run's settings: a new config version (reading and generation settings)")
def api_settings(request: Request, run_id: int, body: SettingsBody, engine: WriteEngine, conn: ReadConn) -> Any:
    _run(conn, run_id)
    try:
        patch = versions.nest(body.changes)
        cur = versions.current(conn, run_id)[1]
        patch = dashboard_patch(patch, cur, request.app.state.settings, versions.history(conn, run_id))
        conn.rollback()
        return versions.change_settings(engine, run_id, patch, actor="api", reason=body.reason)
    except PolicyError as exc:
        return JSONResponse({"detail": str(exc), "refused": [k for k, _ in exc.problems]}, status_code=400)
    except (versions.VersionError, LaunchError) as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)


def _api_repair(kind: str, run_id: int, body: SelectionBody, engine: Engine, read: Engine, conn: Connection) -> Any:
    _run(conn, run_id)
    try:
        sel = _json_select(conn, run_id, body)
    except repair.RepairError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    conn.rollback()
    if body.dry_run:
        prev = repair.preview_rederive(read, run_id, sel) if kind == "rederive" else repair.preview_rerun(read, run_id, sel)
        return {"dry_run": True, **prev}
    if kind == "rerun":
        prev = repair.preview_rerun(read, run_id, sel)
        if not prev["queued"]:  # no job, no repair row
            return JSONResponse({"started": False, "kind": kind, "selection": sel.description, "queued": 0,
                                 "detail": repair.nothing_to_rerun(prev["selected"])}, status_code=200)
    if not start_job(engine, run_id, kind, sel, actor="api"):
        return JSONResponse({"detail": "a repair of this run is already running"}, status_code=409)
    return JSONResponse({"started": True, "kind": kind, "selection": sel.description, "max_id": sel.max_id,
                         "poll": f"/api/runs/{run_id}/repairs"}, status_code=202)


@router.post("/api/runs/{run_id}/rederive", tags=["repair"],
             summary="Re-derive records from their stored raw answer under the current reading settings")
def api_rederive(run_id: int, body: SelectionBody, engine: WriteEngine, read: ReadEngine, conn: ReadConn) -> Any:
    return _api_repair("rederive", run_id, body, engine, read, conn)


@router.post("/api/runs/{run_id}/rerun", tags=["repair"],
             summary="Queue records to be generated again under the current config version")
def api_rerun(run_id: int, body: SelectionBody, engine: WriteEngine, read: ReadEngine, conn: ReadConn) -> Any:
    return _api_repair("rerun", run_id, body, engine, read, conn)


@router.get("/api/runs/{run_id}/repairs", tags=["repair"], summary="Repairs of a run (newest first) and the running job")
def api_repairs(run_id: int, conn: ReadConn) -> Any:
    ctx = job_context(conn, run_id)
    return {"run_id": run_id, "job": ctx["job"], "repairs": repair_history.list_repairs(conn, run_id),
            "n_rerun_queued": ctx["run"]["n_rerun"]}


@router.post("/api/runs/{run_id}/repairs/{repair_id}/undo", tags=["repair"], summary="Undo a re-derive or re-run")
def api_undo(run_id: int, repair_id: int, engine: WriteEngine, conn: ReadConn) -> Any:
    _run(conn, run_id)
    try:
        return repair_history.undo(engine, run_id, repair_id, actor="api")
    except repair.RepairError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)


@router.post("/api/runs/{run_id}/autopause", tags=["repair"],
             summary="Turn auto-pause off (with a reason) or back on for one check of the run")
def api_autopause(run_id: int, body: AutoPauseBody, engine: WriteEngine, conn: ReadConn) -> Any:
    _run(conn, run_id)
    try:
        return set_auto_pause(engine, run_id, body.check, body.auto_pause, reason=body.reason, actor="api")
    except OverrideError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)


@router.get("/api/runs/{run_id}/records/{record_id}/history", tags=["repair"],
            summary="A record's earlier outputs (newest first)")
def api_history(run_id: int, record_id: int, conn: ReadConn) -> Any:
    row = conn.execute(text("SELECT run_id FROM record WHERE id = :i"), {"i": record_id}).first()
    if row is None or row[0] != run_id:
        raise HTTPException(404, f"run {run_id} has no record {record_id}")
    return {"record_id": record_id, "history": repair_history.history(conn, record_id)}
