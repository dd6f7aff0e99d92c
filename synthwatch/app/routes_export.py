"""Routes: export a run from the dashboard (form, progress, download) and the JSON API.

The jobs themselves (their rows, their threads, where their files go) are export/jobs.py; a download
serves only the file of a finished job of that run, never a path taken from the request.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.engine import Connection

from ..export.criteria import resolve
from ..export.jobs import ExportJobs, FileGone, JobNotDone, JobNotFound
from ..export.manifest import public_manifest, without_paths
from ..export.plan import (
    DEFAULT_CHECKS,
    FORMATS,
    PARQUET_FORMATS,
    ExportError,
    ExportOptions,
    check_bit_map,
)
from ..export.select import SELECT_MODES
from ..quality import passk
from ..quality.detection.overrides import list_overrides
from ..quality.selection import catalogue
from ..store import queue as store
from .deps import render
from .export_guard import CONFIRM_FIELD, OpenAlarms, left_out_for, manifest_items, open_alarms

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
class OpenAlarmsError(ExportError):
    """The run has an open data-quality alarm and the export was not confirmed (allow_open_alarms)."""

    def __init__(self, guard: OpenAlarms) -> None:
        super().__init__(guard.message(cli=False))
        self.guard = guard


# ------------------------------------------------------------------------------------------ helpers


def _jobs(request: Request) -> ExportJobs:
    return request.app.state.export_jobs  # type: ignore[no-any-return]


def _run_or_404(conn: Connection, run_id: int) -> dict[str, Any]:
    try:
        return store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None


def _job_view(job: dict[str, Any]) -> dict[str, Any]:
    """A job as pages and the API show it: progress, links, and no server path."""
    job["file_name"] = Path(job["out_path"]).name
    job["percent"] = round(100 * job["done"] / job["total"], 1) if job["total"] else (
        100.0 if job["status"] == "done" else 0.0)
    base = f"/runs/{job['run_id']}/exports/{job['id']}"
    job["page_url"] = base
    job["progress_url"] = f"{base}/progress"
    job["download_url"] = f"{base}/file" if job["status"] == "done" else None
    job["manifest_url"] = f"{base}/manifest" if job["status"] == "done" else None
    job.pop("out_path")  # the server's filesystem layout is not the client's business
    if job.get("manifest") is not None:
        job["manifest"] = public_manifest(job["manifest"])  # nor are the paths the manifest names
    if job.get("error"):
        job["error"] = without_paths(str(job["error"]))
    return job


def job_data(request: Request, run_id: int, job_id: int) -> dict[str, Any]:
    """One export job of a run (shared by the page, its progress fragment and the API)."""
    with request.app.state.read_engine.connect() as conn:
        run = _run_or_404(conn, run_id)
    job = _jobs(request).job(run_id, job_id)
    if job is None:
        raise HTTPException(404, f"run {run_id} has no export {job_id}")
    return {"run": run, "job": _job_view(job), "poll_ms": request.app.state.settings.poll_interval_ms}


def jobs_data(request: Request, run_id: int) -> dict[str, Any]:
    with request.app.state.read_engine.connect() as conn:
        run = _run_or_404(conn, run_id)
    return {"run": run, "jobs": [_job_view(j) for j in _jobs(request).jobs(run_id)]}


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
        weakenings = list_overrides(conn, run_id)
        cat = catalogue(conn, run_id)
    return {
        "open_alarms": guard,
        "weakenings": weakenings,  # the manifest lists them too (#35)
        **data,
        "formats": FORMATS,
        "format_help": _FORMAT_HELP,
        "parquet_formats": PARQUET_FORMATS,
        "default_checks": DEFAULT_CHECKS,
        # the built-in checks, then the run's other checks (verifiers, user checks, rules, judge: #38)
        "other_checks": [*sorted(check_bit_map(ok_records_only=True)), *cat.extended],
        "run_tokenizer": tok.get("name_or_path"),
        "server_ids": bool(isinstance(config, dict) and config.get("request_token_ids")),
        "samples_per_prompt": passk.samples_per_prompt({"config": config}),
        "verifier": passk.verifier_check(config if isinstance(config, dict) else {}),
        "select_modes": SELECT_MODES,
        "values": values or {"format": "messages", "default_exclusions": True, "select": "all"},
        "error": error,
    }


def _names(values: dict[str, Any], key: str) -> list[str]:
    """A list of check names from a form or API field: a JSON list, or one string (comma or space separated)."""
    names = values.get(key) or []
    if isinstance(names, str):
        names = [c for c in re.split(r"[\s,]+", names) if c]
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        raise ExportError(f"{key} must be a list of check names")
    return [c for c in (str(n).strip() for n in names) if c]


def _options_from(values: dict[str, Any], out: Path) -> ExportOptions:
    fmt = str(values.get("format") or "").strip()
    checks = _names(values, "exclude_checks")
    where = values.get("where")
    if where is not None and not isinstance(where, str):
        raise ExportError("where must be a selection expression (text)")
    for key in (*_FORM_BOOLS, "default_exclusions", "retokenize", "require_pass"):
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
        select=str(values.get("select") or "all"),
        select_checks=tuple(_names(values, "select_checks") + _names(values, "select_check")),
        where=where.strip() or None if where else None,
        require_pass=bool(values.get("require_pass")),
    )


def start_export(request: Request, run_id: int, values: dict[str, Any], actor: str = "ui") -> dict[str, Any]:
    """Validate (ExportError on bad input, nothing written), then start the job."""
    with request.app.state.read_engine.connect() as conn:
        run = _run_or_404(conn, run_id)
        jobs = _jobs(request)
        out = jobs.out_path(run["name"], str(values.get("format") or ""), bool(values.get("parquet")))
        # a selection that leaves out every failing record of an alarm's check needs no yes for it (#35); the yes
        # itself is judged below, by the guard
        selection = _options_from({k: v for k, v in values.items() if k != CONFIRM_FIELD}, out)
        # every check name and the expression resolved in the run's catalogue, as the CLI does (#38): a bad
        # name is refused here with its "did you mean", before anything starts
        if selection.select not in SELECT_MODES:
            raise ExportError(f"select must be one of {', '.join(SELECT_MODES)}, got {selection.select[:40]!r}")
        crit = resolve(request.app.state.read_engine, run, passk.run_config(run), selection.exclude_checks,
                       selection.select_checks, selection.where, selection.select)
        expects = bool(run["expects_reasoning"]) if run.get("expects_reasoning") is not None else True
        guard = open_alarms(conn, run_id, left_out=left_out_for(
            selection, crit.select_checks, expects_reasoning=expects, also=crit.left_out()))
    if guard is not None and guard.blocking and values.get(CONFIRM_FIELD) is not True:
        raise OpenAlarmsError(guard)
    options = _options_from(values, out)
    if guard is not None:  # the manifest names what was open and who exported anyway (#26)
        options = dataclasses.replace(options, open_items=manifest_items(guard.items),
                                      confirmed_by=actor if guard.blocking else None,
                                      confirmed_at=time.time() if guard.blocking else None)
    job_id = jobs.start(run_id, options)
    return {"id": job_id, "run_id": run_id, "url": f"/runs/{run_id}/exports/{job_id}"}


def _finished_file(request: Request, run_id: int, job_id: int, manifest: bool = False) -> Path:
    with request.app.state.read_engine.connect() as conn:
        _run_or_404(conn, run_id)
    try:
        return _jobs(request).finished_file(run_id, job_id, manifest=manifest)
    except JobNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except JobNotDone as exc:
        raise HTTPException(409, str(exc)) from None
    except FileGone as exc:
        raise HTTPException(410, str(exc)) from None


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
        "select": str(form.get("select") or "all"), "select_check": str(form.get("select_check") or ""),
        "where": str(form.get("where") or ""), "require_pass": form.get("require_pass") == "on",
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
    try:
        manifest = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise HTTPException(410, f"the manifest of export {job_id} cannot be read: {type(exc).__name__}") from None
    # the file keeps the server's paths; what the dashboard serves names files only
    return Response(orjson.dumps(public_manifest(manifest), option=orjson.OPT_INDENT_2), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{path.name}"'})


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
    "select": "all|passing|first-passing|best" and "select_checks" (k samples per prompt: which per prompt, by
    those checks' verdicts, all passing; default the run's first verifier; "select_check": one name, as before),
    "require_pass" (select best: leave out prompts whose best did not pass), "where" (a selection expression,
    docs/export.md; every check name of the run, with "did you mean" when unknown),
    "allow_open_alarms" (needed when the run has an open data-quality alarm: 409 naming them otherwise)}."""
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError as exc:
        return JSONResponse({"detail": f"request body is not JSON: {exc}"}, status_code=400)
    if not isinstance(body, dict):
        return JSONResponse({"detail": "request body must be a JSON object"}, status_code=400)
    known = {"format", "exclude_checks", "default_exclusions", "retokenize", "select", "select_check",
             "select_checks", "where", "require_pass", *_FORM_BOOLS}
    unknown = sorted(set(body) - known)
    if unknown:
        return JSONResponse({"detail": f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"},
                            status_code=400)
    from starlette.concurrency import run_in_threadpool

    try:
        started = await run_in_threadpool(start_export, request, run_id, body, "api")
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
