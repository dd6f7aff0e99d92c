"""Routes: a run's open items (records an alarm left failing, quality/detection/open_items.py) and accepting one.

The run page shows them in its stats fragment; this module answers the JSON API and the accept form. Accepting
is the only write: a short transaction with a typed reason, kept with the item and in the audit log.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..quality.detection import open_items
from .deps import ReadConn, WriteEngine

router = APIRouter()


def _run_or_404(conn: Connection, run_id: int) -> None:
    if conn.execute(text("SELECT 1 FROM run WHERE id = :r"), {"r": run_id}).first() is None:
        raise HTTPException(404, f"no run {run_id}")


class AcceptBody(BaseModel):
    reason: str = Field(..., description=f"why the records are accepted as they are (at least "
                                         f"{open_items.MIN_REASON_CHARS} characters; kept in the audit log)")


@router.get("/api/runs/{run_id}/open-items", tags=["alarms"],
            summary="Open items: records each alarm left failing, until repaired, excluded or accepted")
def api_open_items(run_id: int, conn: ReadConn, closed: bool = False) -> dict[str, Any]:
    _run_or_404(conn, run_id)
    return {"run_id": run_id, "open_items": open_items.items(conn, run_id, include_closed=closed)}


@router.post("/api/runs/{run_id}/open-items/{item_id}/accept", tags=["alarms"],
             summary="Accept an open item as it is, with a reason (audit-logged)")
def api_accept(run_id: int, item_id: int, body: AcceptBody, engine: WriteEngine, conn: ReadConn) -> Any:
    _run_or_404(conn, run_id)
    try:
        return open_items.accept(engine, run_id, item_id, body.reason, actor="api")
    except open_items.OpenItemError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)


@router.post("/runs/{run_id}/open-items/{item_id}/accept", include_in_schema=False)
def accept_form(request: Request, run_id: int, item_id: int, engine: WriteEngine, conn: ReadConn,
                reason: Annotated[str, Form()] = "") -> Response:
    _run_or_404(conn, run_id)
    try:
        open_items.accept(engine, run_id, item_id, reason, actor="ui")
    except open_items.OpenItemError as exc:
        code = "closed" if "already closed" in str(exc) else "missing" if "has no open item" in str(exc) else "reason"
        return RedirectResponse(f"/runs/{run_id}?{urlencode({'item': item_id, 'item_error': code})}#open-items",
                                status_code=303)
    return RedirectResponse(f"/runs/{run_id}?{urlencode({'item': item_id, 'accepted': 1})}#open-items",
                            status_code=303)


ERRORS = {
    "reason": f"Accepting an open problem needs a reason of at least {open_items.MIN_REASON_CHARS} characters.",
    "closed": "That open problem is already closed.",
    "missing": "This run has no such open problem.",
}


def flash(conn: Connection, run_id: int, query: Any) -> tuple[str | None, str | None]:
    """(message, error) for the run page after the accept form: composed here from the item, never from the URL."""
    try:
        item_id = int(query.get("item") or 0)
    except ValueError:
        return None, None
    if not item_id:
        return None, None
    error = ERRORS.get(str(query.get("item_error") or ""))
    if error:
        return None, error
    if query.get("accepted"):
        found = [i for i in open_items.items(conn, run_id, include_closed=True)
                 if i["id"] == item_id and i["state"] == "accepted"]
        if found:
            return f"Accepted: {found[0]['text']} (reason: {found[0]['reason']})", None
    return None, None
