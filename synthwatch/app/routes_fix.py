"""Routes: an alarm's likely fix in one step from the banner (#28 item 7).

GET shows the run's Settings & repairs page with the fix's preview on top (settings diff, the records to re-derive
or re-run, counts); POST applies it (a new config version, then the repair job of routes_repair), back on the same
page with the alarm still selected, where the job's progress, the repairs row and a Resume follow.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from ..repair import likely_fix
from ..store import versions
from .deps import ReadConn, ReadEngine, WriteEngine, render
from .routes_repair import back_to_repair, repair_context, start_job

router = APIRouter()


@router.get("/runs/{run_id}/alarms/{alarm_id}/fix", include_in_schema=False)
def fix_preview(request: Request, run_id: int, alarm_id: int, conn: ReadConn, read: ReadEngine) -> Response:
    ctx = repair_context(conn, run_id)
    conn.rollback()
    ctx.update(prefill={"alarm": str(alarm_id), "check": "", "flag": "", "ids": "", "filter": "", "kind": "rederive"},
               message=None, error=None, preview=None, likely=None)
    try:
        ctx["likely"] = likely_fix.preview(read, run_id, alarm_id)
        ctx["prefill"]["kind"] = ctx["likely"]["repair"]
    except likely_fix.NoLikelyFix as exc:
        ctx["error"] = str(exc)
        return render(request, "repair.html", ctx, status_code=400)
    return render(request, "repair.html", ctx)


@router.post("/runs/{run_id}/alarms/{alarm_id}/fix", include_in_schema=False)
def fix_apply(run_id: int, alarm_id: int, engine: WriteEngine, token: Annotated[str, Form()],
              max_id: Annotated[str, Form()] = "") -> Response:
    try:
        res = likely_fix.apply(engine, run_id, alarm_id, token=token, actor="ui", start=start_job,
                               max_id=int(max_id) if max_id.isdigit() else None)
    except (likely_fix.NoLikelyFix, versions.VersionError) as exc:
        return back_to_repair(run_id, alarm=str(alarm_id), error=str(exc))
    said = f"Config version {res['version']}: " + "; ".join(
        f"{c['path']} {c['old']!r} → {c['new']!r}" for c in res["changes"]) + ". " if res["changes"] else ""
    verb = "Re-derive" if res["repair"] == "rederive" else "Re-run"
    if res["started"]:
        said += f"{verb} of the records of alarm #{alarm_id} started."
    elif res["repair"] == "rerun":
        said += "Nothing to re-run: none of the alarm's records is finished and not already queued."
    else:
        said += "A repair of this run is already running; start this one when it ends."
    return back_to_repair(run_id, alarm=str(alarm_id), kind=res["repair"], message=said)
