"""Routes: the server's own view of a run (each endpoint's /metrics, scraped by the workers) beside the client's.

One data function (:func:`server_context`) feeds the run page's card, its polled fragment and the JSON API.
It reads the newest ``server_metric`` rows of the run (indexed by run, endpoint, time) and the client's
output tokens/s per endpoint from ``series``, so a gap between what the server generates and what reaches
the client shows at a glance.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store import queue as store
from ..store.models import LIVE_STATUSES
from .deps import ReadConn, render
from .stats import RECENT_S, covered_s

router = APIRouter()

WINDOW_S = 300  # the card's history: the last five minutes of scrapes
POLL_S = 2
CARD_POLL_S = 10  # the card refreshes less often than the scrapes: an open run page stays within its byte budget
_COLS = ("endpoint, t, kind, version, running, waiting, kv_usage, preemptions_s, gen_tokens_s, prompt_tokens_s,"
         " queue_p50_s, queue_p95_s, ttft_p50_s, ttft_p95_s, error, interval_s, preemptions, queue_mean_s,"
         " ttft_mean_s, quantiles, aborted, errored, prefix_hit_rate, max_concurrency, waiting_by_reason")


def _json(value: str | None) -> Any:
    try:
        return orjson.loads(value) if value else None
    except orjson.JSONDecodeError:
        return None


def server_context(conn: Connection, run_id: int, rate_window_s: int = RECENT_S) -> dict[str, Any]:
    try:
        run = store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None
    live = run["status"] in LIVE_STATUSES
    newest = conn.execute(text("SELECT MAX(t) FROM server_metric WHERE run_id = :r"), {"r": run_id}).scalar()
    endpoints: dict[str, dict[str, Any]] = {}
    now = time.time()
    client_s = float(rate_window_s)
    if newest is not None:
        since = float(newest) - WINDOW_S
        for row in conn.execute(text(f"SELECT {_COLS} FROM server_metric WHERE run_id = :r AND t >= :since"
                                     " ORDER BY t"), {"r": run_id, "since": since}).mappings():
            ep = endpoints.setdefault(row["endpoint"], {"endpoint": row["endpoint"], "points": [], "latest": None})
            point = dict(row)
            point["quantiles"] = _json(point["quantiles"]) or {}
            point["waiting_by_reason"] = _json(point["waiting_by_reason"])
            ep["points"].append(point)
            ep["latest"] = point
            if row["kind"] and row["kind"] != "unknown":
                ep["kind"], ep["version"] = row["kind"], row["version"]
        # the client's side over the same window as the run page's tiles, divided by the time it covers (a run
        # younger than the window is not diluted by time before it started)
        t_client = now if live else min(now, float(newest))
        client = conn.execute(text(
            "SELECT endpoint, SUM(completion_tokens), MIN(t) FROM series WHERE run_id = :r AND t >= :since"
            " AND endpoint != '' GROUP BY endpoint"), {"r": run_id, "since": int(t_client - rate_window_s)}).all()
        t_min = min((float(t) for _, _, t in client if t is not None), default=None)
        client_s = covered_s(t_min, t_client, rate_window_s)
        for endpoint, tokens, _t in client:
            if endpoint in endpoints:
                endpoints[endpoint]["client_tokens_s"] = float(tokens or 0) / client_s
        # this run's requests in flight at each endpoint, from the newest series bucket of each worker
        for endpoint, inflight in conn.execute(text(
                "SELECT s.endpoint, SUM(s.inflight) FROM series s JOIN (SELECT worker_id, endpoint, MAX(t) AS t"
                " FROM series WHERE run_id = :r AND t >= :since AND endpoint != '' GROUP BY worker_id, endpoint) m"
                " ON s.worker_id = m.worker_id AND s.endpoint = m.endpoint AND s.t = m.t WHERE s.run_id = :r"
                " GROUP BY s.endpoint"), {"r": run_id, "since": int(t_client - 30)}):
            if endpoint in endpoints:
                endpoints[endpoint]["client_in_flight"] = int(inflight or 0)
    out = []
    for ep in endpoints.values():
        latest = ep["latest"] or {}
        pts = ep["points"]
        ep.setdefault("kind", latest.get("kind") or "unknown")
        ep.setdefault("version", latest.get("version"))
        ep["has_metrics"] = any(p["error"] is None for p in pts)
        ep["max_waiting"] = max((p["waiting"] or 0 for p in pts), default=0)
        ep["max_kv_usage"] = max((p["kv_usage"] or 0 for p in pts), default=0)
        # counted per scrape over the interval it covered (not a rate times an assumed interval)
        ep["preemptions"] = sum(p["preemptions"] or 0 for p in pts)
        ep["aborted"] = sum(p["aborted"] or 0 for p in pts)
        ep["errored"] = sum(p["errored"] or 0 for p in pts)
        ep["history_s"] = (pts[-1]["t"] - pts[0]["t"]) if len(pts) > 1 else 0.0
        running = latest.get("running")
        if running is not None and "client_in_flight" in ep and live:
            # an estimate: the server's batch minus what this run has in flight there (both sampled, not at once)
            ep["other_clients_est"] = max(0, round(running - ep["client_in_flight"]))
        ep["queue"] = describe(latest.get("quantiles", {}).get("queue"))
        ep["ttft"] = describe(latest.get("quantiles", {}).get("ttft"))
        out.append(ep)
    return {"run": {"id": run["id"], "name": run["name"], "status": run["status"]}, "live": live,
            "endpoints": out, "poll_s": CARD_POLL_S, "window_s": WINDOW_S, "client_window_s": round(client_s)}


def describe(q: dict[str, Any] | None) -> dict[str, str | None]:
    """A histogram's interval summary in words: the mean from _sum/_count, and each quantile as the buckets resolve
    it ("< 0.3 s" when it falls in the first bucket, where there is no lower bound to interpolate from)."""
    out: dict[str, str | None] = {"mean": None, "p50": None, "p95": None}
    if not q:
        return out
    if q.get("mean") is not None:
        out["mean"] = _secs(q["mean"])
    for k in ("p50", "p95"):
        v = q.get(k)
        if not v:
            continue
        if "value" in v:
            out[k] = _secs(v["value"])
        elif "below" in v:
            out[k] = "< " + _secs(v["below"])
        elif "above" in v and v["above"] is not None:
            out[k] = "> " + _secs(v["above"])
    return out


def _secs(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1000:.3g} ms"
    return f"{s:.3g} s"


@router.get("/runs/{run_id}/server", include_in_schema=False)
def server_fragment(request: Request, run_id: int, conn: ReadConn) -> Response:
    return render(request, "_run_server.html",
                  server_context(conn, run_id, request.app.state.settings.rate_window_s))


@router.get("/api/runs/{run_id}/server", tags=["runs"],
            summary="Each endpoint's own metrics (vLLM, SGLang) over the last 5 minutes, beside the client's tokens/s")
def api_server(request: Request, run_id: int, conn: ReadConn) -> Any:
    return server_context(conn, run_id, request.app.state.settings.rate_window_s)
