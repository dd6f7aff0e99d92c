"""A run's time series for the charts: buckets of the series table merged to the requested width,
and the endpoints' own server metrics beside them."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..quality.detection import open_items
from ..store.models import LIVE_STATUSES
from . import stats
from .stats import (
    CACHE_LOCK,
    FOLD_STEP_S,
    MAX_POINTS,
    NICE_WIDTHS,
    SERIES_FINAL_AFTER_S,
    window_seconds,
)

# ------------------------------------------------------------------ time series


def timeseries(conn: Connection, run: dict[str, Any], window: str) -> dict[str, Any]:
    """Chart data: per-bucket rates over the window, downsampled to at most MAX_POINTS buckets."""
    span = window_seconds(window)
    rid = run["id"]
    now = time.time()
    end = now if run["status"] in LIVE_STATUSES else (run.get("finished_at") or run.get("updated_at") or now)
    first = conn.execute(text("SELECT MIN(t) FROM series WHERE run_id = :r"), {"r": rid}).scalar()
    first_t = float(first) if first is not None else (run.get("started_at") or end - 60)
    # a young run fills the chart's width instead of sitting in the corner of an empty window
    start = first_t if span is None else max(end - span, min(first_t, end - 60))
    total_span = max(5.0, end - start)
    width = next((w for w in NICE_WIDTHS if total_span / w <= MAX_POINTS), None)
    if width is None:
        width = int(-(-total_span // MAX_POINTS) // 3600 + 1) * 3600
    since = int(start // width * width)
    rows, complete = _bucket_rows(conn, rid, width, since, now)
    points = []
    for r in rows:
        w = float(width)
        gn = r["gauge_n"] or 0
        ok = r["ok"] or 0
        points.append({
            "t": int(r["b"]),
            "req_s": (r["finished"] or 0) / w,
            "ok_s": ok / w,
            "tok_s": (r["completion_tokens"] or 0) / w,
            "reasoning_tok_s": (r["reasoning_tokens"] or 0) / w,
            "content_tok_s": (r["content_tokens"] or 0) / w,
            "timeouts_s": (r["timeouts"] or 0) / w,
            "errors_s": (r["errors"] or 0) / w,
            "attempt_timeouts_s": (r["attempt_timeouts"] or 0) / w,
            "retries_s": (r["retries"] or 0) / w,
            "dropped_s": (r["dropped"] or 0) / w,
            "http_429_s": (r["http_429"] or 0) / w,
            "http_5xx_s": (r["http_5xx"] or 0) / w,
            "http_4xx_s": (r["http_4xx"] or 0) / w,
            "timeout_share": (r["timeouts"] or 0) / r["finished"] if r["finished"] else None,
            "empty_reasoning_share": (r["empty_reasoning"] or 0) / ok if ok else None,
            "mean_latency_s": (r["latency_sum"] or 0.0) / ok if ok else None,
            "in_flight": (r["inflight"] or 0) / gn if gn else None,
            "concurrency": (r["concurrency"] or 0) / gn if gn else None,
            "counts": {k: r[k] or 0 for k in ("finished", "ok", "errors", "timeouts", "retries", "dropped",
                                              "http_429", "http_5xx", "http_4xx", "attempt_timeouts")},
        })
    points = points[-MAX_POINTS:]
    has_server = _server_points(conn, rid, width, since, points)
    # each alarm's time span, shaded on every chart (static/charts.js); an alarm still open runs to the end
    alarms = [a for a in open_items.spans(conn, rid) if (a["t1"] is None or a["t1"] >= since)]
    return {"run_id": rid, "window": window, "bucket_s": width, "start": since, "end": end, "points": points,
            "complete": complete, "server": has_server, "alarms": alarms}


def _server_points(conn: Connection, rid: int, width: int, since: int, points: list[dict[str, Any]]) -> bool:
    """Add the servers' own view (server_metric rows) to the chart buckets: each endpoint's mean per bucket,
    summed over endpoints (the KV cache: the fullest). True when any endpoint has metrics."""
    by_t = {p["t"]: p for p in points}
    found = False
    for b, _ep, waiting, running, kv, pre, gen in conn.execute(text(
            "SELECT (CAST(t AS INTEGER) / :w) * :w AS b, endpoint, AVG(waiting), AVG(running), AVG(kv_usage),"
            " AVG(preemptions_s), AVG(gen_tokens_s) FROM server_metric WHERE run_id = :r AND t >= :since"
            " AND error IS NULL GROUP BY b, endpoint"), {"w": width, "r": rid, "since": since}):
        p = by_t.get(int(b))
        if p is None:
            continue
        found = True
        per = p.setdefault("server_by_endpoint", {})
        per[_ep] = {"waiting": waiting, "running": running, "kv_usage": kv, "preemptions_s": pre, "gen_tok_s": gen}
        for key, v in (("server_waiting", waiting), ("server_running", running), ("server_preemptions_s", pre),
                       ("server_gen_tok_s", gen)):
            if v is not None:
                p[key] = (p.get(key) or 0.0) + float(v)
        if kv is not None:
            p["server_kv_usage"] = max(p.get("server_kv_usage") or 0.0, float(kv))
    return found


_TS_SQL = (
    "SELECT (t / :w) * :w AS b, SUM(finished) AS finished, SUM(ok) AS ok, SUM(errors) AS errors,"
    " SUM(timeouts) AS timeouts, SUM(attempts_failed) AS attempts_failed,"
    " SUM(attempt_timeouts) AS attempt_timeouts, SUM(retries) AS retries, SUM(dropped) AS dropped,"
    " SUM(http_429) AS http_429, SUM(http_4xx) AS http_4xx, SUM(http_5xx) AS http_5xx,"
    " SUM(other_errors) AS other_errors, SUM(completion_tokens) AS completion_tokens,"
    " SUM(reasoning_tokens) AS reasoning_tokens, SUM(content_tokens) AS content_tokens,"
    " SUM(empty_reasoning) AS empty_reasoning, SUM(latency_sum) AS latency_sum,"
    " SUM(CASE WHEN endpoint = '' THEN inflight ELSE 0 END) AS inflight,"
    " SUM(CASE WHEN endpoint = '' THEN concurrency ELSE 0 END) AS concurrency,"
    " COUNT(DISTINCT CASE WHEN endpoint = '' THEN t END) AS gauge_n"
    " FROM series WHERE run_id = :r AND t >= :since{until} GROUP BY b"
)
_TS_CACHE: dict[tuple[str, int, int], tuple[int, int, dict[int, dict[str, Any]]]] = {}


def _ts_buckets(conn: Connection, rid: int, width: int, since: int, until: int | None) -> dict[int, dict[str, Any]]:
    sql = _TS_SQL.format(until="" if until is None else " AND t < :until")
    params: dict[str, Any] = {"r": rid, "since": since, "w": width}
    if until is not None:
        params["until"] = until
    return {int(r["b"]): dict(r) for r in conn.execute(text(sql), params).mappings()}


def _bucket_rows(conn: Connection, rid: int, width: int, since: int, now: float) -> tuple[list[dict[str, Any]], bool]:
    """Downsampled buckets from ``since`` on: (rows in time order, complete).

    Buckets older than the writer's horizon never change, so they are aggregated once per process
    (in FOLD_STEP_S steps, FOLD_BUDGET_S per request) and only the last few minutes are queried on
    every refresh; ``complete`` is False while a long run's history is still being folded in.
    """
    final = int((now - SERIES_FINAL_AFTER_S) // width * width)
    key = (str(conn.engine.url), rid, width)
    with CACHE_LOCK:
        cached = _TS_CACHE.get(key)
    buckets: dict[int, dict[str, Any]]
    if cached is None or cached[0] > since:
        start, upto, buckets = since, since, {}
    else:
        start, upto, buckets = cached
    if final > upto:
        buckets = {b: v for b, v in buckets.items() if b >= since}  # the window moved on: forget the old part
        step = max(width, FOLD_STEP_S // width * width)
        started = time.monotonic()
        while final > upto:  # at least one step per request, then more while the budget lasts
            step_to = min(final, upto + step)
            buckets.update(_ts_buckets(conn, rid, width, upto, step_to))
            start, upto = max(start, since), step_to
            with CACHE_LOCK:
                _TS_CACHE[key] = (start, upto, dict(buckets))
            if time.monotonic() - started >= stats.FOLD_BUDGET_S:  # read at call time: one budget, set in stats
                break
    tail = _ts_buckets(conn, rid, width, max(upto, final), None)
    merged = {b: v for b, v in buckets.items() if b >= since}
    merged.update(tail)
    return [merged[b] for b in sorted(merged)], upto >= final
