"""Routes: the server's own view of a run (each endpoint's /metrics, scraped by the workers) beside the client's.

One data function (:func:`server_context`) feeds the run page's card, its polled fragment and the JSON API.
It reads the newest ``server_metric`` rows of the run (indexed by run, endpoint, time) and the client's
output tokens/s per endpoint from ``series``, so a gap between what the server generates and what reaches
the client shows at a glance.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store import queue as store
from ..store.models import LIVE_STATUSES
from .deps import ReadConn, render

router = APIRouter()

WINDOW_S = 300  # the card's history: the last five minutes of scrapes
CLIENT_WINDOW_S = 60
POLL_S = 2
CARD_POLL_S = 10  # the card refreshes less often than the scrapes: an open run page stays within its byte budget
_COLS = ("endpoint, t, kind, version, running, waiting, kv_usage, preemptions_s, gen_tokens_s, prompt_tokens_s,"
         " queue_p50_s, queue_p95_s, ttft_p50_s, ttft_p95_s, error")


def server_context(conn: Connection, run_id: int) -> dict[str, Any]:
    try:
        run = store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None
    live = run["status"] in LIVE_STATUSES
    newest = conn.execute(text("SELECT MAX(t) FROM server_metric WHERE run_id = :r"), {"r": run_id}).scalar()
    endpoints: dict[str, dict[str, Any]] = {}
    if newest is not None:
        since = float(newest) - WINDOW_S
        for row in conn.execute(text(f"SELECT {_COLS} FROM server_metric WHERE run_id = :r AND t >= :since"
                                     " ORDER BY t"), {"r": run_id, "since": since}).mappings():
            ep = endpoints.setdefault(row["endpoint"], {"endpoint": row["endpoint"], "points": [], "latest": None})
            point = dict(row)
            ep["points"].append(point)
            ep["latest"] = point
            if row["kind"] and row["kind"] != "unknown":
                ep["kind"], ep["version"] = row["kind"], row["version"]
        t_client = min(time.time(), float(newest))
        for endpoint, tokens in conn.execute(text(
                "SELECT endpoint, SUM(completion_tokens) FROM series WHERE run_id = :r AND t >= :since"
                " AND endpoint != '' GROUP BY endpoint"), {"r": run_id, "since": t_client - CLIENT_WINDOW_S}):
            if endpoint in endpoints:
                endpoints[endpoint]["client_tokens_s"] = float(tokens or 0) / CLIENT_WINDOW_S
    out = []
    for ep in endpoints.values():
        latest = ep["latest"] or {}
        pts = ep["points"]
        ep.setdefault("kind", latest.get("kind") or "unknown")
        ep.setdefault("version", latest.get("version"))
        ep["has_metrics"] = any(p["error"] is None for p in pts)
        ep["max_waiting"] = max((p["waiting"] or 0 for p in pts), default=0)
        ep["max_kv_usage"] = max((p["kv_usage"] or 0 for p in pts), default=0)
        ep["preemptions"] = sum((p["preemptions_s"] or 0) * POLL_S for p in pts)
        out.append(ep)
    return {"run": {"id": run["id"], "name": run["name"], "status": run["status"]}, "live": live,
            "endpoints": out, "poll_s": CARD_POLL_S, "window_s": WINDOW_S}


@router.get("/runs/{run_id}/server", include_in_schema=False)
def server_fragment(request: Request, run_id: int, conn: ReadConn) -> Response:
    return render(request, "_run_server.html", server_context(conn, run_id))


@router.get("/api/runs/{run_id}/server", tags=["runs"],
            summary="Each endpoint's own metrics (vLLM, SGLang) over the last 5 minutes, beside the client's tokens/s")
def api_server(run_id: int, conn: ReadConn) -> Any:
    return server_context(conn, run_id)
