"""Routes: the runs list, the live run page and its fragments, controls, starting a run, and the JSON API.

Pages and their htmx fragments share one data function each (``_list_context``, ``_stats_context``,
``_charts_context``, ``_audit_context``); fragments are the ``_``-prefixed templates.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from ..capture.reasoning import MODES as REASONING_MODES
from ..quality import verdicts
from ..store import queue as store
from ..store import versions
from . import launch, probe_button, run_stats, stats, timeseries
from .deps import HX, ReadConn, WriteEngine, lean, render
from .form_errors import FormErrors
from .routes_cost import run_page_cost
from .routes_open_items import flash as open_items_flash
from .routes_server import server_context
from .runs_list import runs_view

router = APIRouter()

Window = Literal["5m", "1h", "all"]
CONTROL_LABELS = {
    "pause": "Pause requested", "resume": "Resume requested", "stop": "Graceful stop requested",
    "stop_now": "Immediate stop requested", "cap": "Cap set", "concurrency": "Concurrency set",
}


def run_or_404(conn: Any, run_id: int) -> dict[str, Any]:
    run = run_stats.get_run(conn, run_id)
    if run is None:
        raise HTTPException(404, f"no run with id {run_id} in this database")
    return run


def request_limit_ms(request: Request) -> int:
    return int(request.app.state.settings.stats_time_limit_ms)


def _poll_ms(request: Request) -> int:
    return int(request.app.state.settings.poll_interval_ms)


def _slow_poll_ms(request: Request) -> int:
    """Charts, failure tables, workers and the audit log: a chart bucket is 5 s, so a faster poll only costs
    bytes (an open live run page stays within 100 KB per 30 s, see tests/test_polling_budget_browser.py)."""
    return max(10_000, 5 * _poll_ms(request))


# ------------------------------------------------------------------ data functions (pages and fragments)


def _window_s(request: Request) -> int:
    """The window of the current rates (settings.rate_window_s): every number that says "last N s" uses it."""
    return int(request.app.state.settings.rate_window_s)


def _list_context(request: Request, conn: Any) -> dict[str, Any]:
    try:
        with stats.time_limit(conn, request_limit_ms(request)):
            view = runs_view(conn, stats.list_runs(conn, window_s=_window_s(request)), request.query_params)
        stale = None
    except stats.StatsTimeout as exc:
        view, stale = runs_view(conn, [], request.query_params), str(exc)
    return {**view, "stale": stale, "poll_ms": max(2000, _poll_ms(request))}


def _stats_context(request: Request, conn: Any, run: dict[str, Any]) -> dict[str, Any]:
    try:
        with stats.time_limit(conn, request_limit_ms(request)):
            st = run_stats.run_stats(conn, run, _window_s(request))
            # records written whose extended checks have not answered yet (#30): verdicts follow the records
            names = verdicts.configured_checks(run.get("config") or run.get("config_json"))
            pending = verdicts.pending_estimate(conn, run["id"], int(run.get("n_ok") or 0), names) if names else None
        stale = None
    except stats.StatsTimeout as exc:
        st, stale, pending = None, str(exc), None
    return {"run": run, "st": st, "stale": stale, "poll_ms": _poll_ms(request),
            "details_poll_ms": _slow_poll_ms(request), "pending_checks": pending}


def _charts_context(request: Request, conn: Any, run: dict[str, Any], window: str) -> dict[str, Any]:
    """The charts card: charts.js draws it from the time series API (and polls that while the run is live)."""
    return {"run": run, "window": window, "windows": list(stats.WINDOWS), "chart_poll_ms": _slow_poll_ms(request),
            "hist_poll_ms": _slow_poll_ms(request), "filter_form": None}


def _audit_context(request: Request, conn: Any, run: dict[str, Any]) -> dict[str, Any]:
    return {"run": run, "events": run_stats.control_events(conn, run["id"]), "audit_poll_ms": _slow_poll_ms(request),
            "hold": _hold(conn, run)}


def _hold(conn: Any, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The open pausing alarms a resume must acknowledge (read as the claim reads them; no write)."""
    if run.get("status") not in ("created", "running", "paused", "stopping"):
        return []
    claimed = int(run.get("total") or 0) - int(run.get("n_pending") or 0)
    return store.alarm_gate(conn, int(run["id"]), claimed, time.time(), reopen=False)[0]


def _ack_amount(unit: str | None, amount: str | None) -> tuple[int | None, float | None]:
    """The dialog's "for N records / M minutes" as apply_control's arguments (ControlError when unreadable)."""
    if amount in (None, ""):
        return None, None
    try:
        x = float(amount)  # type: ignore[arg-type]
    except ValueError:
        raise store.ControlError(f"acknowledge for how many {unit or 'records'}? got {amount!r}") from None
    if unit == "minutes":
        return None, x
    if unit not in (None, "", "records") or x != int(x):
        raise store.ControlError(f"acknowledge for a whole number of records or for minutes, got {amount!r} {unit!r}")
    return int(x), None


# ------------------------------------------------------------------ pages


@router.get("/runs", include_in_schema=False)
def runs_page(request: Request, conn: ReadConn) -> Response:
    return render(request, "runs.html", _list_context(request, conn))


@router.get("/runs/table", include_in_schema=False)
def runs_table(request: Request, conn: ReadConn) -> Response:
    return render(request, "_runs_table.html", _list_context(request, conn))


def _new_run_defaults() -> dict[str, str]:
    return {"name": "", **{f["form"]: f["default"] for f in launch.dataset_form_fields()}, "endpoints": "", "api_key_env": "", "model": "", "temperature": "",
            "top_p": "", "max_tokens": "", "concurrency": "16", "cap": "", "samples_per_prompt": "", "timeout_s": "600", "idle_timeout_s": "60",
            "connect_timeout_s": "10", "max_attempts": "4", "reasoning_mode": "auto", "stream": "on",
            "tokenizer": ""}


@router.get("/runs/new", include_in_schema=False)
def new_run_form(request: Request, conn: ReadConn, like: int | None = None) -> Response:
    form, like_run = _new_run_defaults(), None
    if like is not None:  # "Start a run like this": the form pre-filled from that run's stored configuration
        like_run = run_or_404(conn, like)
        form.update({k: v for k, v in launch.config_to_form(like_run["config"]).items() if v != "" or k == "name"})
    return render(request, "new_run.html", {"form": form, "error": None, "modes": REASONING_MODES,
                                            "dataset_fields": launch.dataset_form_fields(),
                                            "like_run": like_run})


async def _posted_form(request: Request) -> dict[str, str]:
    raw = await request.form()
    form = _new_run_defaults()
    form["stream"] = ""  # an unticked checkbox is simply absent
    for k in launch.FORM_FIELDS:
        v = raw.get(k)
        if isinstance(v, str):
            form[k] = v[:10_000]
    return form


@router.post("/runs/new/probe", include_in_schema=False)
async def new_run_probe(request: Request) -> Response:
    """The form's "Probe the endpoint" button: synthwatch probe on its first endpoint, shown above the form,
    with the reasoning field set to where the reasoning arrived. Starts nothing. Runs on the app's loop, off the
    request threads, within probe_button.DEADLINE_S, cancelled when the client goes (app/probe_button.py)."""
    from ..probe import ProbeError

    form = await _posted_form(request)
    urls = [u.strip() for u in form["endpoints"].splitlines() if u.strip()]
    ctx: dict[str, Any] = {"form": form, "error": None, "modes": REASONING_MODES,
                           "dataset_fields": launch.dataset_form_fields(), "probe": None}
    if not urls or not form["model"].strip():
        ctx["error"] = "probe: give an endpoint base URL and a model"
        return render(request, "new_run.html", ctx, status_code=400)
    key = None
    if form["api_key_env"].strip():  # the same allowlist as starting a run: the key goes to the form's URL
        try:
            key = launch.key_for_dashboard(form["api_key_env"].strip(), request.app.state.settings)
        except launch.LaunchError as exc:
            ctx["error"] = f"probe: {exc}"
            return render(request, "new_run.html", ctx, status_code=400)
    try:
        report = await probe_button.run_probe(probe_button.slots_of(request.app.state),
                                              probe_button.options_for(urls[0], form["model"].strip(), key),
                                              lambda: probe_button.client_gone(request.receive))
    except probe_button.Busy as exc:
        ctx["error"] = f"probe: {exc}"
        return render(request, "new_run.html", ctx, status_code=429)
    except probe_button.Gone:
        return Response(status_code=499)  # nobody reads it
    except ProbeError as exc:
        ctx["error"] = f"probe: {exc}"
        return render(request, "new_run.html", ctx, status_code=400)
    mode = report.settings.get("reasoning.mode")
    if mode in REASONING_MODES:
        form["reasoning_mode"] = mode
    ctx["probe"] = report.as_dict()
    return render(request, "new_run.html", ctx)


@router.post("/runs/new", include_in_schema=False)
async def new_run_submit(request: Request) -> Response:
    form = await _posted_form(request)
    try:
        launched = await run_in_threadpool(_launch, request, form)
    except launch.LaunchError as exc:  # every problem of the form at once, each beside its field
        errors = exc if isinstance(exc, FormErrors) else None
        return render(request, "new_run.html", {"form": form, "error": None if errors else str(exc),
                                                "errors": errors, "modes": REASONING_MODES,
                                                "dataset_fields": launch.dataset_form_fields(), "like_run": None},
                      status_code=400)
    if launched.run_id is None:
        return RedirectResponse(f"/runs?started={launched.name}", status_code=303)
    return RedirectResponse(f"/runs/{launched.run_id}", status_code=303)


def _launch(request: Request, form: dict[str, str]) -> launch.Launched:
    errors = FormErrors()
    data = launch.form_to_data(form, errors)
    config = launch.validate(data, request.app.state.read_engine, settings=request.app.state.settings, errors=errors)
    launched = launch.start_worker(config, request.app.state.db_url)
    launch.wait_for_run(launched, request.app.state.read_engine)
    return launched


@router.get("/runs/{run_id}", include_in_schema=False)
def run_page(request: Request, conn: ReadConn, run_id: int, window: Window = "5m") -> Response:
    run = run_or_404(conn, run_id)
    ctx = _stats_context(request, conn, run)
    ctx.update(_charts_context(request, conn, run, window))
    ctx.update(_audit_context(request, conn, run))
    # an open item's accept form comes back here: what happened, from the item (routes_open_items.py)
    ctx["message"], ctx["control_error"] = open_items_flash(conn, run_id, request.query_params)
    ctx["versions"] = list(reversed(versions.list_versions(conn, run_id, counts=False)))[:5]
    ctx["server"] = server_context(conn, run_id, _window_s(request))
    ctx["cost"] = run_page_cost(conn, run_id)
    return render(request, "run.html", ctx)


@router.get("/runs/{run_id}/stats", include_in_schema=False)
def run_stats_fragment(request: Request, conn: ReadConn, run_id: int, shown_state: str = "") -> Response:
    run = run_or_404(conn, run_id)
    # shown_state: the status:desired the page's controls were drawn for; when the run moved on (an alarm
    # paused it, another tab resumed it) this poll redraws them too
    ctx = {**_stats_context(request, conn, run), "fragment": True, "shown_state": shown_state or None,
           "hold": _hold(conn, run)}
    if not run["live"]:  # the last render also switches off the controls and the audit log's polling
        ctx.update(_audit_context(request, conn, run))
    return render(request, "_run_stats.html", ctx)


@router.get("/runs/{run_id}/details", include_in_schema=False)
def run_details_fragment(request: Request, conn: ReadConn, run_id: int) -> Response:
    run = run_or_404(conn, run_id)
    return render(request, "_run_details.html", _stats_context(request, conn, run))


@router.get("/runs/{run_id}/charts", include_in_schema=False)
def run_charts_fragment(request: Request, conn: ReadConn, run_id: int, window: Window = "5m") -> Response:
    run = run_or_404(conn, run_id)
    return render(request, "_run_charts.html", _charts_context(request, conn, run, window))


@router.get("/runs/{run_id}/audit", include_in_schema=False)
def run_audit_fragment(request: Request, conn: ReadConn, run_id: int) -> Response:
    run = run_or_404(conn, run_id)
    return render(request, "_run_audit.html", _audit_context(request, conn, run))


@router.post("/runs/{run_id}/control", include_in_schema=False)
def run_control_form(request: Request, conn: ReadConn, write: WriteEngine, hx: HX, run_id: int,
                     action: Annotated[str, Form()], value: Annotated[str | None, Form()] = None,
                     ack_unit: Annotated[str | None, Form()] = None,
                     ack_amount: Annotated[str | None, Form()] = None) -> Response:
    run_or_404(conn, run_id)
    error = message = None
    status = 200
    try:
        records, minutes = _ack_amount(ack_unit, ack_amount)
        applied = store.apply_control(write, run_id, action, value, actor="ui", ack_records=records,
                                      ack_minutes=minutes)
        message = _describe(action, applied)
    except store.AlarmOpen as exc:
        error, status = str(exc).replace("RUN", str(run_id)), 409
    except store.ControlError as exc:
        error, status = str(exc), 400
    if not hx:
        if error:
            raise HTTPException(status, error)
        return RedirectResponse(f"/runs/{run_id}", status_code=303)
    conn.rollback()  # see the row as it is after our write
    run = run_or_404(conn, run_id)
    ctx = {"run": run, "message": message, "control_error": error, "fragment": True,
           **_audit_context(request, conn, run)}
    return render(request, "_run_controls.html", ctx, status_code=status)


def _describe(action: str, applied: dict[str, Any]) -> str:
    label = CONTROL_LABELS.get(action, action)
    acked = applied.get("acknowledged") or []
    if acked:
        names = ", ".join(f"#{a['id']} {a['rule']}" for a in acked)
        return (f"{label} with alarm {names} acknowledged for {acked[0]['for']}; the run pauses again after that if"
                " the check failed since")
    if action == "cap":
        return f"{label}: {applied.get('cap') if applied.get('cap') is not None else 'none'}"
    if action == "concurrency":
        return f"{label}: {applied.get('concurrency')}"
    if action == "pause" and applied.get("pause_in_flight") == "cancel":
        return f"{label}, the requests in flight cancelled (back to pending); the workers follow within a second"
    return f"{label}; the workers follow within a second"


# ------------------------------------------------------------------ JSON API


class ControlBody(BaseModel):
    action: Literal["pause", "resume", "stop", "stop_now", "cap", "concurrency"] = Field(
        description="pause | resume | stop (graceful: in-flight requests finish) | stop_now | cap | concurrency")
    value: int | None = Field(None, description="The new cap (null removes it) or concurrency.")
    ack_records: int | None = Field(None, ge=1, description=(
        "resume only: acknowledge the open alarm that paused the run, for this many more claimed records (a plain"
        " resume is refused with 409 while one is open)"))
    ack_minutes: float | None = Field(None, gt=0, description="resume only: acknowledge it for this many minutes")
    in_flight: Literal["cancel", "finish"] | None = Field(None, description=(
        "pause only: the requests in flight are cancelled (back to pending, the server frees them) or finish"
        " (the default); a stop's choice is stop (finish) or stop_now (cancel)"))


class StartBody(BaseModel):
    name: str | None = None
    dataset: str = Field(description="Path of a JSONL / Parquet file on the dashboard's machine.")
    endpoints: list[str] = Field(min_length=1, description="OpenAI-compatible base URLs.")
    api_key_env: str | None = None
    model: str
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    concurrency: int | None = None
    cap: int | None = None
    timeout_s: float | None = None
    idle_timeout_s: float | None = None
    connect_timeout_s: float | None = None
    max_attempts: int | None = None
    reasoning_mode: str = "auto"
    stream: bool = True
    limit: int | None = None
    tokenizer: str | None = Field(None, description="'deepseek-v4' (packaged) or a tokenizer folder inside "
                                  "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS")


@router.get("/api/runs", tags=["runs"], summary="All runs with progress, current rates and problem badges")
def api_runs(request: Request, conn: ReadConn) -> Any:
    ctx = _list_context(request, conn)
    if ctx["stale"]:
        return JSONResponse({"detail": ctx["stale"], "stale": True}, status_code=503)
    return {"runs": ctx["runs"]}


@router.post("/api/runs", tags=["runs"], status_code=201,
             summary="Start a run: validates, writes a config and launches a worker process")
async def api_start_run(request: Request, body: StartBody) -> Any:
    form = {k: "" if v is None else str(v) for k, v in body.model_dump().items() if k != "endpoints"}
    form["endpoints"] = "\n".join(body.endpoints)
    form["stream"] = "on" if body.stream else ""
    try:
        launched = await run_in_threadpool(_launch, request, form)
    except launch.LaunchError as exc:
        return JSONResponse({"detail": str(exc), **({"errors": exc.as_list()} if isinstance(exc, FormErrors) else {})},
                            status_code=400)
    return {"name": launched.name, "run_id": launched.run_id, "pid": launched.pid,
            "config_path": str(launched.config_path), "log_path": str(launched.log_path)}


@router.get("/api/runs/{run_id}", tags=["runs"], summary="One run: counters, status, configuration, audit log")
def api_run(conn: ReadConn, run_id: int) -> Any:
    run = run_or_404(conn, run_id)
    return {**run, "control_events": run_stats.control_events(conn, run_id)}


@router.get("/api/runs/{run_id}/stats", tags=["runs"],
            summary="Live statistics: progress, ETA, rates, latency percentiles, failures, data quality")
def api_run_stats(request: Request, conn: ReadConn, run_id: int) -> Any:
    run = run_or_404(conn, run_id)
    ctx = _stats_context(request, conn, run)
    if ctx["stale"]:
        return JSONResponse({"detail": ctx["stale"], "stale": True}, status_code=503)
    return ctx["st"].as_json()


@router.get("/api/runs/{run_id}/timeseries", tags=["runs"],
            summary="Chart data: per-bucket rates over 5m, 1h or the whole run (downsampled)")
def api_run_timeseries(request: Request, conn: ReadConn, run_id: int,
                       window: Annotated[Window, Query(description="5m | 1h | all")] = "5m",
                       since: Annotated[int | None, Query(description="only buckets from this time on (a poll "
                                                          "passes the last answer's final_before)")] = None) -> Any:
    run = run_or_404(conn, run_id)
    try:
        with stats.time_limit(conn, request_limit_ms(request)):
            data = timeseries.timeseries(conn, run, window)
    except stats.StatsTimeout as exc:
        return JSONResponse({"detail": str(exc), "stale": True}, status_code=503)
    # buckets before final_before never change again: a poll asks only for the ones after it
    width = int(data["bucket_s"])
    data["final_before"] = int((time.time() - stats.SERIES_FINAL_AFTER_S) // width * width)
    data["live"] = run["live"]
    if since is not None:
        data["since"] = since
        data["points"] = [p for p in data["points"] if p["t"] >= since]
    return lean(request, JSONResponse(data))


@router.get("/api/runs/{run_id}/errors", tags=["runs"], summary="Latest failed attempts (newest first)")
def api_run_errors(conn: ReadConn, run_id: int, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> Any:
    run_or_404(conn, run_id)
    return {"errors": run_stats.latest_errors(conn, run_id, limit)}


@router.get("/api/runs/{run_id}/events", tags=["runs"], summary="Audit log of control actions (newest first)")
def api_run_events(conn: ReadConn, run_id: int, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    run_or_404(conn, run_id)
    return {"events": run_stats.control_events(conn, run_id, limit)}


@router.post("/api/runs/{run_id}/control", tags=["controls"],
             summary="Pause, resume, stop (graceful or now), set the cap or the concurrency")
def api_run_control(conn: ReadConn, write: WriteEngine, run_id: int, body: ControlBody) -> Any:
    run_or_404(conn, run_id)
    if body.action in ("cap",) and body.value is not None and body.value < 1:
        return JSONResponse({"detail": f"cap must be at least 1, got {body.value}"}, status_code=400)
    if body.action == "concurrency" and body.value is None:
        return JSONResponse({"detail": "concurrency needs a value"}, status_code=400)
    if body.in_flight is not None and body.action != "pause":
        return JSONResponse({"detail": "in_flight goes with pause (a stop's choice is stop or stop_now)"},
                            status_code=400)
    try:
        value: Any = body.in_flight if body.action == "pause" else body.value
        applied = store.apply_control(write, run_id, body.action, value, actor="api",
                                      ack_records=body.ack_records, ack_minutes=body.ack_minutes)
    except store.AlarmOpen as exc:
        return JSONResponse({"detail": str(exc).replace("RUN", str(run_id)),
                             "alarms": [{"id": a["id"], "rule": a["rule"], "title": a["title"]} for a in exc.alarms]},
                            status_code=409)
    except store.ControlError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return {"run_id": run_id, "action": body.action, "applied": applied, "message": _describe(body.action, applied)}

