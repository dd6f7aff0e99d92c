"""Routes: flagging records (one, undo, bulk over a filter), as forms (htmx) and as JSON API.

A flag answered to htmx is the record viewer's flag fragment, from the same data function as the viewer
(routes_review.flag_context)."""

from __future__ import annotations

import html
from typing import Annotated, Any

from fastapi import APIRouter, Body, Form, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..review import filters as review_filters
from ..review import flags as review_flags
from ..review import idset
from ..review.filters import ReviewError
from .deps import HX, ReadConn, ReadEngine, WriteEngine, catch_up_search, render
from .routes_review import bad, flag_context, parse_filters, record_or_404, run_or_404

router = APIRouter()


# --------------------------------------------------------------------------------------------- flags


def _form_or_json(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    return None if value in (None, "") else str(value)


@router.post("/runs/{run_id}/records/{record_id:int}/flag", include_in_schema=False)
def flag_form(request: Request, run_id: int, record_id: int, conn: ReadConn, write: WriteEngine, hx: HX,
              verdict: Annotated[str, Form()] = "", reason: Annotated[str, Form()] = "",
              note: Annotated[str, Form()] = "") -> Response:
    run = run_or_404(conn, run_id)
    try:
        review_flags.flag(write, run_id, record_id, verdict, reason or None, note or None)
    except ReviewError as exc:
        raise bad(exc) from None
    except review_filters.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return _after_flag(request, conn, run, record_id, hx)


@router.post("/runs/{run_id}/records/{record_id:int}/undo", include_in_schema=False)
def undo_form(request: Request, run_id: int, record_id: int, conn: ReadConn, write: WriteEngine,
              hx: HX) -> Response:
    run = run_or_404(conn, run_id)
    record_or_404(conn, run_id, record_id)
    try:
        review_flags.undo(write, run_id, record_id)
    except ReviewError as exc:
        raise bad(exc) from None
    return _after_flag(request, conn, run, record_id, hx)


def _after_flag(request: Request, conn: Any, run: dict[str, Any], record_id: int, hx: bool) -> Response:
    conn.rollback()  # a fresh read snapshot that sees the write
    rec = record_or_404(conn, run["id"], record_id)
    if hx:
        return render(request, "_viewer_flag.html", flag_context(conn, run, rec))
    return RedirectResponse(f"/runs/{run['id']}/records/{record_id}", status_code=303)


@router.post("/api/runs/{run_id}/records/{record_id:int}/flag", tags=["review"])
def flag_api(run_id: int, record_id: int, conn: ReadConn, write: WriteEngine,
             body: dict[str, Any] = Body(..., examples=[{"verdict": "bad", "reason": "truncated", "note": ""}])
             ) -> Any:
    """Flag a record good or bad (reason: empty_reasoning, truncated, wrong_format, wrong_answer,
    wrong_language, repetition, other; optional note)."""
    run_or_404(conn, run_id)
    try:
        return review_flags.flag(write, run_id, record_id, str(body.get("verdict", "")), _form_or_json(body, "reason"),
                           _form_or_json(body, "note"))
    except ReviewError as exc:
        raise bad(exc) from None
    except review_filters.NotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.post("/api/runs/{run_id}/records/{record_id:int}/undo", tags=["review"])
def undo_api(run_id: int, record_id: int, conn: ReadConn, write: WriteEngine) -> Any:
    """Undo the latest flag on a record; it gets its previous verdict back."""
    run_or_404(conn, run_id)
    record_or_404(conn, run_id, record_id)
    try:
        return review_flags.undo(write, run_id, record_id)
    except ReviewError as exc:
        raise bad(exc) from None


@router.post("/api/runs/{run_id}/flags/undo", tags=["review"])
def undo_last_api(run_id: int, conn: ReadConn, write: WriteEngine) -> Any:
    """Undo the run's latest flag action (a bulk flag is one action)."""
    run_or_404(conn, run_id)
    try:
        return review_flags.undo(write, run_id, None)
    except ReviewError as exc:
        raise bad(exc) from None


def _bulk_args(data: dict[str, Any]) -> tuple[str, str | None, str | None]:
    verdict = str(data.get("verdict") or "")
    reason, note = _form_or_json(data, "reason"), _form_or_json(data, "note")
    try:
        review_flags.validate_flag(verdict, reason, note)
    except ReviewError as exc:
        raise bad(exc) from None
    return verdict, reason, note


@router.post("/runs/{run_id}/flags/bulk", include_in_schema=False)
async def bulk_form(request: Request, run_id: int, conn: ReadConn, read: ReadEngine, write: WriteEngine) -> Response:
    """Preview (no ids) or apply (the preview's pinned `ids`) a bulk flag; the filter comes as form fields."""
    form = {k: str(v) for k, v in (await request.form()).items()}
    run = run_or_404(conn, run_id)
    f = parse_filters(form)  # the filter's own fields; the verdict comes as flag_* (a filter has a reason field too)
    backlog = await run_in_threadpool(catch_up_search, request, f.q)
    verdict, reason, note = _bulk_args({k.removeprefix("flag_"): v for k, v in form.items() if k.startswith("flag_")})
    ctx: dict[str, Any] = {"run": run, "f": f, "verdict": verdict, "reason": reason, "note": note,
                           "reason_labels": review_filters.REASON_LABELS, "search_backlog": backlog}
    try:  # database work off the event loop
        if form.get("undo_bulk"):
            ctx["undone"] = await run_in_threadpool(review_flags.undo_bulk, write, run_id, form["undo_bulk"])
        elif "ids" not in form:
            ctx["preview"] = await run_in_threadpool(review_flags.bulk_preview, conn, run_id, f)
        else:
            ctx["result"] = await run_in_threadpool(review_flags.bulk_flag_ids, write, run_id, _ids(form["ids"]),
                                                    verdict, reason, note,
                                                    review_flags.selection_words(conn, run_id, f))
    except ReviewError as exc:
        raise bad(exc) from None
    response = render(request, "_records_bulk.html", ctx)
    if "undone" in ctx or "result" in ctx:  # the table below redraws itself with the new flags
        response.headers["HX-Trigger"] = "records-changed"
    return response


def _ids(raw: Any) -> list[int]:
    try:
        return idset.decode(str(raw))
    except idset.IdSetError as exc:
        raise HTTPException(400, str(exc)) from None


@router.post("/api/runs/{run_id}/flags/bulk", tags=["review"])
def bulk_api(request: Request, run_id: int, conn: ReadConn, read: ReadEngine, write: WriteEngine,
             body: dict[str, Any] = Body(..., examples=[{"filters": {"finish_reason": "length"}, "verdict": "bad",
                                                         "reason": "truncated"}])) -> Any:
    """Flag the records matching `filters` (the records-table query parameters: `check` names any check of the run,
    `where` takes a selection expression such as `user:boxed=fail or language=fail`, the grammar of the records
    listing; a bad one is a 400 naming the problem). Without `ids` it only previews:
    {count, ids, max_id}, where `ids` pins the set; send the same request with that `ids` to flag exactly those
    records (`flagged` is how many). A `max_id` alone is refused: records pending at the preview have ids below it."""
    run_or_404(conn, run_id)
    filters = body.get("filters") or {}
    if not isinstance(filters, dict):
        raise HTTPException(400, "filters: must be an object of records-table query parameters")
    f = parse_filters(filters)
    verdict, reason, note = _bulk_args(body)
    backlog = catch_up_search(request, f.q)
    try:
        if body.get("ids") is None:
            if body.get("max_id") is not None:
                raise HTTPException(400, "max_id: no longer pins a bulk flag; send the preview's `ids` instead")
            return {"preview": review_flags.bulk_preview(conn, run_id, f), "search_backlog": backlog}
        return review_flags.bulk_flag_ids(write, run_id, _ids(body["ids"]), verdict, reason, note,
                                          review_flags.selection_words(conn, run_id, f), actor="api")
    except ReviewError as exc:
        raise bad(exc) from None




MAX_SELECTED = 1000  # a selection is ticked by hand; a bigger set is a filter (bulk flag by filter)


@router.post("/runs/{run_id}/flags/selected", include_in_schema=False)
async def selected_form(request: Request, run_id: int, conn: ReadConn, write: WriteEngine) -> Response:
    """Flag the records ticked in the records table, one flag each (the same path as a verdict key)."""
    form = {k: str(v) for k, v in (await request.form()).items()}
    run_or_404(conn, run_id)
    try:
        ids = [int(x) for x in form.get("ids", "").replace(" ", "").split(",") if x]
    except ValueError:
        raise HTTPException(400, f"ids: not a comma-separated list of record ids: {form.get('ids', '')[:60]!r}") from None
    if not ids:
        raise HTTPException(400, "ids: no record selected")
    if len(ids) > MAX_SELECTED:
        raise HTTPException(400, f"ids: {len(ids):,} records selected; at most {MAX_SELECTED:,} (flag by filter instead)")
    verdict, reason, note = _bulk_args({k.removeprefix("flag_"): v for k, v in form.items() if k.startswith("flag_")})
    missing: list[int] = []

    def work() -> int:
        done = 0
        for rid in dict.fromkeys(ids):
            try:
                review_flags.flag(write, run_id, rid, verdict, reason, note)
                done += 1
            except review_filters.NotFound:
                missing.append(rid)
        return done

    try:
        done = await run_in_threadpool(work)
    except ReviewError as exc:
        raise bad(exc) from None
    text = f"Flagged {done:,} record{'' if done == 1 else 's'} {verdict}"
    if missing:
        text += f"; {len(missing):,} not in this run: {', '.join(map(str, missing[:10]))}"
    response = HTMLResponse(f'<span id="selected-done" data-count="{done}">{html.escape(text)}</span>')
    response.headers["HX-Trigger"] = "records-changed"
    return response
