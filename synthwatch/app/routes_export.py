"""Routes: export a run from the dashboard (form, progress, download) and the JSON API.

An export runs in a background thread of the web process: it reads records through the query-only
read engine, page by page, and writes only its own ``export_job`` row (progress, then the manifest or
the error) with short transactions on the write engine. Files go to the ``exports`` folder beside the
SQLite database; a download serves only the file of a finished ``export_job`` row of that run, never a
path taken from the request.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from .. import store
from ..export import (
    DEFAULT_CHECKS,
    FORMATS,
    PARQUET_FORMATS,
    ExportError,
    ExportOptions,
    ExportPlan,
    check_bit_map,
    manifest_path,
    prepare_export,
    run_export,
    sqlite_path,
)
from ..export_guard import CONFIRM_FIELD, OpenAlarms, open_alarms
from .deps import render

router = APIRouter()
log = logging.getLogger("synthwatch.export")

PROGRESS_WRITE_INTERVAL_S = 0.5
_FORM_BOOLS = ("think_inline", "from_value", "only_good", "include_flagged", "parquet", "template_drops_past_reasoning",
               "all_turns", CONFIRM_FIELD)
_FORMAT_HELP = {
    "messages": "OpenAI-style messages; the answer carries reasoning_content and content (HF chat templates).",
    "sharegpt": "SpecForge/EAGLE {id, conversations}; reasoning as reasoning_content or inline.",
    "tokens": "input_ids + loss_mask + prompt_len: the server's token ids, or re-tokenized with the run's "
              "tokenizer and chat template.",
    "raw": "Every stored field of each record.",
    "specforge": "For SpecForge (checked against specforge 0.2.0): its regenerated-data rows {id, conversations, "
                 "status: success} with reasoning_content; train with a 'thinking' chat-template entry (DeepSeek: "
                 "deepseek-v32) and train_only_last_turn.",
    "speculators": "For speculators (checked against speculators 0.9.0): pre-tokenized rows {id, input_ids, "
                   "loss_mask, metadata} that its prepare-data passes through.",
}
_lock = threading.RLock()


class OpenAlarmsError(ExportError):
    """The run has an open data-quality alarm and the export was not confirmed (allow_open_alarms)."""

    def __init__(self, guard: OpenAlarms) -> None:
        super().__init__(guard.message(cli=False))
        self.guard = guard


# ------------------------------------------------------------------------------------------ helpers


def exports_dir(request: Request) -> Path:
    """The exports folder beside the SQLite database (or ./exports for a server database)."""
    db_file = sqlite_path(request.app.state.db_url)
    base = db_file.parent if db_file is not None else Path.cwd()
    return (base / "exports").resolve()


def _running(request: Request) -> dict[int, threading.Thread]:
    """Export threads started by this process (a 'running' row without one was interrupted)."""
    state = request.app.state
    with _lock:
        if not hasattr(state, "export_threads"):
            state.export_threads = {}
        return state.export_threads  # type: ignore[no-any-return]


def _alive(request: Request) -> set[int]:
    running = _running(request)
    with _lock:
        return set(running)


def _run_or_404(conn: Connection, run_id: int) -> dict[str, Any]:
    try:
        return store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:60] or "run"


def _job_dict(row: Any, alive: set[int]) -> dict[str, Any]:
    """alive: ids of this process's export threads, taken BEFORE the row was read (a thread writes its
    final status before it leaves the set, so a 'running' row without a live thread was interrupted)."""
    job = dict(row)
    raw_manifest = job.pop("manifest_json", None)
    manifest = orjson.loads(raw_manifest) if raw_manifest else None
    job["manifest"] = manifest
    job["file_name"] = Path(job["out_path"]).name
    job["interrupted"] = job["status"] == "running" and job["id"] not in alive
    job["percent"] = round(100 * job["done"] / job["total"], 1) if job["total"] else (
        100.0 if job["status"] == "done" else 0.0)
    base = f"/runs/{job['run_id']}/exports/{job['id']}"
    job["page_url"] = base
    job["progress_url"] = f"{base}/progress"
    job["download_url"] = f"{base}/file" if job["status"] == "done" else None
    job["manifest_url"] = f"{base}/manifest" if job["status"] == "done" else None
    job.pop("out_path")  # the server's filesystem layout is not the client's business
    return job


def _mark_interrupted(engine: Engine, job_id: int) -> None:
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(
            text("UPDATE export_job SET status = 'failed', finished_at = :t, error = :e"
                 " WHERE id = :j AND status = 'running'"),
            {"t": time.time(), "e": "interrupted: the dashboard stopped while this export ran", "j": job_id},
        )


def job_data(request: Request, run_id: int, job_id: int) -> dict[str, Any]:
    """One export job of a run (shared by the page, its progress fragment and the API)."""
    alive = _alive(request)
    with request.app.state.read_engine.connect() as conn:
        run = _run_or_404(conn, run_id)
        row = conn.execute(
            text("SELECT * FROM export_job WHERE id = :j AND run_id = :r"), {"j": job_id, "r": run_id}
        ).mappings().first()
    if row is None:
        raise HTTPException(404, f"run {run_id} has no export {job_id}")
    job = _job_dict(row, alive)
    if job["interrupted"]:
        _mark_interrupted(request.app.state.write_engine, job_id)
        job.update(status="failed", error="interrupted: the dashboard stopped while this export ran",
                   interrupted=False)
    return {"run": run, "job": job, "poll_ms": request.app.state.settings.poll_interval_ms}


def jobs_data(request: Request, run_id: int) -> dict[str, Any]:
    alive = _alive(request)
    with request.app.state.read_engine.connect() as conn:
        run = _run_or_404(conn, run_id)
        rows = conn.execute(
            text("SELECT * FROM export_job WHERE run_id = :r ORDER BY id DESC LIMIT 50"), {"r": run_id}
        ).mappings().all()
    return {"run": run, "jobs": [_job_dict(r, alive) for r in rows]}


def _form_context(request: Request, run_id: int, values: dict[str, Any] | None = None,
                  error: str | None = None) -> dict[str, Any]:
    data = jobs_data(request, run_id)
    run = data["run"]
    try:
        config = orjson.loads(run.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        config = {}
    tok = (config.get("tokenizer") or {}) if isinstance(config, dict) else {}
    with request.app.state.read_engine.connect() as conn:
        guard = open_alarms(conn, run_id)
    return {
        "open_alarms": guard,
        **data,
        "formats": FORMATS,
        "format_help": _FORMAT_HELP,
        "parquet_formats": PARQUET_FORMATS,
        "default_checks": DEFAULT_CHECKS,
        "other_checks": sorted(check_bit_map(ok_records_only=True)),
        "run_tokenizer": tok.get("name_or_path"),
        "server_ids": bool(isinstance(config, dict) and config.get("request_token_ids")),
        "values": values or {"format": "messages", "default_exclusions": True},
        "error": error,
    }


def _options_from(values: dict[str, Any], out: Path) -> ExportOptions:
    fmt = str(values.get("format") or "").strip()
    checks = values.get("exclude_checks") or []
    if isinstance(checks, str):
        checks = [c for c in re.split(r"[\s,]+", checks) if c]
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise ExportError("exclude_checks must be a list of check names")
    for key in (*_FORM_BOOLS, "default_exclusions", "retokenize"):
        if key in values and not isinstance(values[key], bool):
            raise ExportError(f"{key} must be true or false")
    return ExportOptions(
        format=fmt,
        out=out,
        parquet=bool(values.get("parquet")),
        think_inline=bool(values.get("think_inline")),
        from_value=bool(values.get("from_value")),
        only_good=bool(values.get("only_good")),
        include_flagged=bool(values.get("include_flagged")),
        default_exclusions=bool(values.get("default_exclusions", True)),
        exclude_checks=tuple(checks),
        retokenize=bool(values.get("retokenize")),
        template_drops_past_reasoning=bool(values.get("template_drops_past_reasoning")),
        turns="all" if values.get("all_turns") else "last",
    )


def start_export(request: Request, run_id: int, values: dict[str, Any]) -> dict[str, Any]:
    """Validate (ExportError on bad input, nothing written), insert the job row, start the thread."""
    with request.app.state.read_engine.connect() as conn:
        run = _run_or_404(conn, run_id)
        guard = open_alarms(conn, run_id)
    if guard is not None and values.get(CONFIRM_FIELD) is not True:
        raise OpenAlarmsError(guard)
    fmt = str(values.get("format") or "")
    parquet = bool(values.get("parquet"))
    folder = exports_dir(request)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = f"{_slug(run['name'])}-{fmt if fmt in FORMATS else 'export'}-{stamp}-{secrets.token_hex(3)}"
    out = folder / (name + (".parquet" if parquet else ".jsonl"))
    options = _options_from(values, out)
    folder.mkdir(parents=True, exist_ok=True)
    engine: Engine = request.app.state.read_engine
    plan = prepare_export(engine, run_id, options)
    write: Engine = request.app.state.write_engine
    running = _running(request)
    with _lock:  # the row and its thread appear together: a reader never sees one without the other
        with write.connect() as conn, store.write_begin(conn):
            job_id = int(conn.execute(
                text("INSERT INTO export_job (run_id, format, out_path, status, done, total, started_at)"
                     " VALUES (:r, :f, :o, 'running', 0, :n, :t) RETURNING id"),
                {"r": run_id, "f": fmt, "o": str(plan.out), "n": plan.total, "t": time.time()},
            ).scalar_one())
        thread = threading.Thread(target=_export_thread, args=(engine, write, job_id, plan, running),
                                  name=f"export-{job_id}", daemon=True)
        running[job_id] = thread
        thread.start()
    return {"id": job_id, "run_id": run_id, "url": f"/runs/{run_id}/exports/{job_id}"}


def _export_thread(read: Engine, write: Engine, job_id: int, plan: ExportPlan,
                   running: dict[int, threading.Thread]) -> None:
    last = 0.0

    def progress(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < PROGRESS_WRITE_INTERVAL_S and done < total:
            return
        last = now
        try:
            with write.connect() as conn, store.write_begin(conn):
                conn.execute(text("UPDATE export_job SET done = :d, total = :n WHERE id = :j"),
                             {"d": done, "n": total, "j": job_id})
        except OperationalError:  # database busy: progress is best effort, the export goes on
            log.warning("export %s: progress not recorded (database busy)", job_id)

    try:
        try:
            manifest = run_export(read, plan, progress)
        except Exception as exc:
            message = str(exc) if isinstance(exc, ExportError) else f"{type(exc).__name__}: {exc}"
            with write.connect() as conn, store.write_begin(conn):
                conn.execute(
                    text("UPDATE export_job SET status = 'failed', finished_at = :t, error = :e WHERE id = :j"),
                    {"t": time.time(), "e": message[:2000], "j": job_id},
                )
            return
        counts = manifest["counts"]
        with write.connect() as conn, store.write_begin(conn):
            conn.execute(
                text("UPDATE export_job SET status = 'done', finished_at = :t, done = :d, total = :d,"
                     " manifest_json = :m WHERE id = :j"),
                {"t": time.time(), "d": counts["ok_scanned"], "m": orjson.dumps(manifest).decode(), "j": job_id},
            )
    finally:
        with _lock:
            running.pop(job_id, None)


def _finished_file(request: Request, run_id: int, job_id: int, manifest: bool = False) -> Path:
    """The file of a finished export of this run: only paths of export_job rows, inside the exports folder."""
    with request.app.state.read_engine.connect() as conn:
        _run_or_404(conn, run_id)
        row = conn.execute(
            text("SELECT status, out_path FROM export_job WHERE id = :j AND run_id = :r"), {"j": job_id, "r": run_id}
        ).first()
    if row is None:
        raise HTTPException(404, f"run {run_id} has no export {job_id}")
    if row[0] != "done":
        raise HTTPException(409, f"export {job_id} is {row[0]}, not done: there is no file to download yet")
    path = Path(row[1]).resolve()
    if manifest:
        path = manifest_path(path)
    if not path.is_relative_to(exports_dir(request)) or not path.is_file():
        raise HTTPException(410, f"the file of export {job_id} is no longer in the exports folder")
    return path


# ------------------------------------------------------------------------------------------- pages


@router.get("/runs/{run_id}/export", include_in_schema=False)
def export_page(request: Request, run_id: int) -> Response:
    return render(request, "export.html", _form_context(request, run_id))  # type: ignore[no-any-return]


@router.post("/runs/{run_id}/export", include_in_schema=False)
async def export_submit(request: Request, run_id: int) -> Response:
    form = await request.form()
    values: dict[str, Any] = {
        "format": str(form.get("format") or ""),
        "exclude_checks": [str(v) for v in form.getlist("exclude_checks")],
        **{k: form.get(k) == "on" for k in (*_FORM_BOOLS, "retokenize")},
        "default_exclusions": form.get("default_exclusions") == "on",
    }
    from starlette.concurrency import run_in_threadpool

    try:
        started = await run_in_threadpool(start_export, request, run_id, values)
    except ExportError as exc:
        ctx = await run_in_threadpool(_form_context, request, run_id, values, str(exc))
        return render(request, "export.html", ctx, status_code=400)  # type: ignore[no-any-return]
    return RedirectResponse(started["url"], status_code=303)


@router.get("/runs/{run_id}/exports/list", include_in_schema=False)
def export_jobs_fragment(request: Request, run_id: int) -> Response:
    """The run's exports with their downloads, as a fragment (for the run page: hx-get ... hx-trigger=load)."""
    return render(request, "_export_jobs.html", jobs_data(request, run_id))  # type: ignore[no-any-return]


@router.get("/runs/{run_id}/exports/{job_id}", include_in_schema=False)
def export_job_page(request: Request, run_id: int, job_id: int) -> Response:
    return render(request, "export_job.html", job_data(request, run_id, job_id))  # type: ignore[no-any-return]


@router.get("/runs/{run_id}/exports/{job_id}/progress", include_in_schema=False)
def export_job_fragment(request: Request, run_id: int, job_id: int) -> Response:
    return render(request, "_export_job.html", job_data(request, run_id, job_id))  # type: ignore[no-any-return]


@router.get("/runs/{run_id}/exports/{job_id}/file", include_in_schema=False)
def export_download(request: Request, run_id: int, job_id: int) -> Response:
    path = _finished_file(request, run_id, job_id)
    media = "application/vnd.apache.parquet" if path.suffix == ".parquet" else "application/x-ndjson"
    return FileResponse(path, media_type=media, filename=path.name, content_disposition_type="attachment")


@router.get("/runs/{run_id}/exports/{job_id}/manifest", include_in_schema=False)
def export_manifest(request: Request, run_id: int, job_id: int) -> Response:
    path = _finished_file(request, run_id, job_id, manifest=True)
    return FileResponse(path, media_type="application/json", filename=path.name,
                        content_disposition_type="attachment")


# --------------------------------------------------------------------------------------------- API


@router.get("/api/runs/{run_id}/exports", tags=["export"])
def api_list_exports(request: Request, run_id: int) -> dict[str, Any]:
    """The run's exports, newest first (status, progress, manifest, download URL)."""
    data = jobs_data(request, run_id)
    return {"run_id": run_id, "exports": data["jobs"]}


@router.post("/api/runs/{run_id}/exports", tags=["export"], status_code=202)
async def api_start_export(request: Request, run_id: int) -> Response:
    """Start an export. Body: {"format": "messages|sharegpt|tokens|raw|specforge|speculators", "think_inline",
    "only_good", "include_flagged", "default_exclusions", "exclude_checks": [...], "parquet", "retokenize",
    "template_drops_past_reasoning", "all_turns" (conversations regenerated turn by turn: one row per turn),
    "allow_open_alarms" (needed when the run has an open data-quality alarm: 409 naming them otherwise)}."""
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError as exc:
        return JSONResponse({"detail": f"request body is not JSON: {exc}"}, status_code=400)
    if not isinstance(body, dict):
        return JSONResponse({"detail": "request body must be a JSON object"}, status_code=400)
    known = {"format", "exclude_checks", "default_exclusions", "retokenize", *_FORM_BOOLS}
    unknown = sorted(set(body) - known)
    if unknown:
        return JSONResponse({"detail": f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"},
                            status_code=400)
    from starlette.concurrency import run_in_threadpool

    try:
        started = await run_in_threadpool(start_export, request, run_id, body)
    except OpenAlarmsError as exc:  # told what is wrong and how to export anyway
        return JSONResponse({"detail": str(exc), "open_alarms": exc.guard.as_dict(), "confirm": CONFIRM_FIELD},
                            status_code=409)
    except ExportError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    job = await run_in_threadpool(job_data, request, run_id, started["id"])
    return JSONResponse(job["job"], status_code=202)


@router.get("/api/runs/{run_id}/exports/{job_id}", tags=["export"])
def api_export(request: Request, run_id: int, job_id: int) -> dict[str, Any]:
    return job_data(request, run_id, job_id)["job"]  # type: ignore[no-any-return]


@router.get("/api/runs/{run_id}/exports/{job_id}/file", tags=["export"])
def api_export_file(request: Request, run_id: int, job_id: int) -> Response:
    return export_download(request, run_id, job_id)
