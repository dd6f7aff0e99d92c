"""The runs list's filter, sort, throughput sparklines and failing-checks badges (#28 items 5 and 9).

One data function (:func:`runs_view`) feeds the page and the table fragment it polls: the rows of
stats.list_runs (at most 200), filtered and sorted in Python, each live run with its ok records/s over the last
5 minutes in 10-s buckets (one indexed query on ``series`` per live run) drawn as an inline SVG polyline.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store.models import LIVE_STATUSES, RUN_STATUSES
from .words import check_label

SPARK_SPAN_S = 300
SPARK_STEP_S = 10
SPARK_W, SPARK_H = 96, 22
SORTS = {  # key -> (label, the row's sort value); None sorts last whatever the order
    "newest": ("newest first", lambda r: r["id"]),
    "name": ("name", lambda r: r["name"].lower()),
    "progress": ("progress", lambda r: (r["n_ok"] / r["target"]) if r.get("target") else 0.0),
    "rate": ("current rate", lambda r: r.get("req_s") or 0.0),
    "problems": ("problems", lambda r: (r.get("alarm_errors", 0), r.get("alarms", 0), r.get("open_items", 0),
                                        r.get("n_error", 0) + r.get("n_timeout", 0))),
}
STATES = ("live", "alarm", *RUN_STATUSES)


def read_filter(q: Mapping[str, str]) -> dict[str, str]:
    """The list's query parameters, cleaned: unknown values fall back to the defaults (never an error page)."""
    name = str(q.get("q") or "").strip()[:200]
    state = str(q.get("state") or "")
    sort = str(q.get("sort") or "newest")
    default_order = "asc" if sort == "name" else "desc"
    order = str(q.get("order") or default_order)
    return {"q": name, "state": state if state in STATES else "",
            "sort": sort if sort in SORTS else "newest", "order": order if order in ("asc", "desc") else "desc"}


def filter_runs(runs: list[dict[str, Any]], f: Mapping[str, str]) -> list[dict[str, Any]]:
    needle = f.get("q", "").lower()
    state = f.get("state", "")
    out = []
    for r in runs:
        if needle and needle not in str(r["name"]).lower():
            continue
        if state == "live" and r["status"] not in LIVE_STATUSES:
            continue
        if state == "alarm" and not r.get("alarms"):
            continue
        if state and state not in ("live", "alarm") and r["status"] != state:
            continue
        out.append(r)
    key = SORTS[f.get("sort") or "newest"][1]
    return sorted(out, key=key, reverse=f.get("order", "desc") == "desc")


def spark_points(values: list[float], w: int = SPARK_W, h: int = SPARK_H) -> str:
    """An SVG polyline's points for the values, scaled to w x h (the highest at the top; all zero: the bottom)."""
    if not values:
        return ""
    top = max(values) or 1.0
    n = len(values)
    step = w / max(n - 1, 1)
    return " ".join(f"{i * step:.1f},{h - 1 - (v / top) * (h - 2):.1f}" for i, v in enumerate(values))


def throughput_series(conn: Connection, run_id: int, now: float) -> list[float]:
    """ok records/s per SPARK_STEP_S bucket over the last SPARK_SPAN_S seconds, oldest first (empty buckets 0)."""
    since = int((now - SPARK_SPAN_S) // SPARK_STEP_S * SPARK_STEP_S)
    got = {int(b): float(n or 0) for b, n in conn.execute(text(
        "SELECT (t / :s) * :s AS b, SUM(ok) FROM series WHERE run_id = :r AND t >= :since GROUP BY b"),
        {"s": SPARK_STEP_S, "r": run_id, "since": since})}
    last = int(now // SPARK_STEP_S * SPARK_STEP_S)
    first = min(got, default=last)  # a run younger than the span starts at its first bucket, not at a flat zero
    return [got.get(b, 0.0) / SPARK_STEP_S for b in range(max(since, first), last + 1, SPARK_STEP_S)]


def failing_checks(conn: Connection) -> dict[int, list[str]]:
    """run id -> the labels of the checks its open items still count failing records of (the "2 checks failing"
    badge; the status pill stays one word)."""
    out: dict[int, list[str]] = {}
    for run_id, check in conn.execute(text(
            "SELECT DISTINCT run_id, check_name FROM open_item WHERE state = 'open' AND n_records > 0"
            " ORDER BY run_id, check_name")):
        out.setdefault(int(run_id), []).append(check_label(str(check)))
    return out


def runs_view(conn: Connection, runs: list[dict[str, Any]], q: Mapping[str, str]) -> dict[str, Any]:
    f = read_filter(q)
    shown = filter_runs(runs, f)
    failing = failing_checks(conn)
    now = time.time()
    for r in shown:
        r["failing_checks"] = failing.get(r["id"], [])
        if r["live"]:
            values = throughput_series(conn, r["id"], now)
            if len(values) < 2:  # one bucket is not a line yet: the rate beside it says enough
                continue
            r["spark"] = {"points": spark_points(values), "now": values[-1] if values else 0.0,
                          "peak": max(values) if values else 0.0}
    default = read_filter({})
    query = urlencode({k: v for k, v in f.items() if v and v != default[k]})
    return {"runs": shown, "n_all": len(runs), "filter": f, "sorts": {k: v[0] for k, v in SORTS.items()},
            "states": STATES, "query": query, "spark_w": SPARK_W, "spark_h": SPARK_H}
