"""Routes: the workers of a run (host, pid, state, claims, rate, heartbeat), as JSON and as an htmx fragment.

A worker is dead when it was marked so (another worker found its pid gone or its lease expired and took its
claims back) or when it is still 'running' but has written no heartbeat for settings.dead_worker_after_s.
The page fragment and the API share ``workers_context``. It reads the small ``worker`` table and the run's
recent ``series`` rows (per worker), never the records.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import text
from sqlalchemy.engine import Connection

from . import run_stats
from .deps import ReadConn, render
from .stats import covered_s

router = APIRouter()

MAX_WORKERS = 200


def worker_state(status: str, heartbeat_age_s: float, dead_after_s: float) -> str:
    """running | exited | dead (marked dead, or running without a heartbeat for dead_after_s)."""
    if status == "dead" or (status == "running" and heartbeat_age_s > dead_after_s):
        return "dead"
    return "exited" if status == "exited" else "running"


def workers_context(request: Request, conn: Connection, run: dict[str, Any]) -> dict[str, Any]:
    dead_after_s = float(request.app.state.settings.dead_worker_after_s)
    window_s = int(request.app.state.settings.rate_window_s)  # the tiles' window (settings.rate_window_s)
    now = time.time()
    rid = run["id"]
    recent = {int(w): (int(n or 0), t_min) for w, n, t_min in conn.execute(
        text("SELECT worker_id, sum(ok), min(t) FROM series WHERE run_id = :r AND t >= :since GROUP BY worker_id"),
        {"r": rid, "since": int(now - window_s)})}
    workers = []
    for r in conn.execute(text(
            "SELECT id, host, pid, started_at, heartbeat_at, status, claimed, done, stats_json FROM worker"
            " WHERE run_id = :r ORDER BY id LIMIT :n"), {"r": rid, "n": MAX_WORKERS}).mappings():
        try:
            st = orjson.loads(r["stats_json"] or "{}")
        except orjson.JSONDecodeError:
            st = {}
        if not isinstance(st, dict):
            st = {}
        age = max(0.0, now - float(r["heartbeat_at"]))
        state = worker_state(r["status"], age, dead_after_s)
        lifetime = max(float(r["heartbeat_at"]) - float(r["started_at"]), 1e-9)
        live = state == "running"
        workers.append({
            "id": r["id"], "host": r["host"], "pid": r["pid"], "state": state, "status": r["status"],
            "claimed": r["claimed"], "done": r["done"],
            "rate_s": r["done"] / lifetime if r["done"] else 0.0,
            "recent_rate_s": _recent_rate(recent.get(int(r["id"])), now, window_s) if live else None,
            "started_at": r["started_at"], "heartbeat_at": r["heartbeat_at"], "heartbeat_age_s": age,
            "in_flight": st.get("in_flight") if live else 0, "concurrency": st.get("concurrency"),
            "worker_state": st.get("state"), "write_error": st.get("write_error"),
        })
    summary = {s: sum(1 for w in workers if w["state"] == s) for s in ("running", "dead", "exited")}
    return {"run": run, "workers": workers, "summary": summary, "dead_after_s": dead_after_s,
            "recent_s": window_s, "workers_poll_ms": max(10_000, 5 * int(request.app.state.settings.poll_interval_ms))}


def _recent_rate(done: tuple[int, float] | None, now: float, window_s: int) -> float:
    """A worker's ok records per second over the part of the window it has been working (a worker younger than the
    window is not diluted by time it did not exist: 4.57/s, not 1.60/s)."""
    if done is None:
        return 0.0
    n, t_min = done
    return n / covered_s(t_min, now, window_s)


def _run_or_404(conn: Connection, run_id: int) -> dict[str, Any]:
    run = run_stats.get_run(conn, run_id)
    if run is None:
        raise HTTPException(404, f"no run with id {run_id} in this database")
    return run


@router.get("/runs/{run_id}/workers", include_in_schema=False)
def run_workers_fragment(request: Request, conn: ReadConn, run_id: int) -> Response:
    run = _run_or_404(conn, run_id)
    return render(request, "_run_workers.html", workers_context(request, conn, run))


@router.get("/api/runs/{run_id}/workers", tags=["runs"],
            summary="The run's workers: host, pid, state (running/exited/dead), claims, rates, last heartbeat")
def api_run_workers(request: Request, conn: ReadConn, run_id: int) -> Any:
    run = _run_or_404(conn, run_id)
    ctx = workers_context(request, conn, run)
    return {"run_id": run_id, "dead_after_s": ctx["dead_after_s"], "recent_s": ctx["recent_s"],
            "summary": ctx["summary"], "workers": ctx["workers"]}
