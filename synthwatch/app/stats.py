"""The dashboard's read queries and what they share: the runs list here, one run's page in run_stats.py, the time
series in timeseries.py.

Live widgets never scan the record table: they read the run's counters, the ``series`` table
(one row per run/worker/endpoint/5-s bucket), ``error_event``, ``control_event``, ``check_stat``
and ``alarm``, each through an index. Every query binds its values. On SQLite a progress
handler interrupts a query that runs longer than ``stats_time_limit_ms`` (as datasette's
``sqlite_timelimit`` does) and the caller gets :class:`StatsTimeout`, shown as a "stale" fragment.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from ..quality.detection import Problems, problem_counts
from ..store.models import LIVE_STATUSES
from .words import plural

log = logging.getLogger("synthwatch.stats")


WORKING_STATUSES = ("running", "stopping")  # requests are being made: rates are real, not left over
WINDOWS = {"5m": 300, "1h": 3600, "all": None}
RECENT_S = 60  # "current" rates and problem tiles look at the last minute
MAX_POINTS = 240  # a chart never has more points than this (long runs are downsampled)
NICE_WIDTHS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
SERIES_FINAL_AFTER_S = 150  # the writer never touches a bucket older than 120 s again
FOLD_STEP_S = 1800  # whole-run aggregates fold history in steps of this much run time (one query each) ...
FOLD_BUDGET_S = 0.15  # ... for at most this long per request, so no request stalls on a long run's history

# thresholds of the problem tiles (share of finished requests in the recent window)
TIMEOUT_BAD = 0.05
TIMEOUT_WARN = 0.01
ERROR_BAD = 0.05
ERROR_WARN = 0.01
# the quality tiles (empty reasoning, cut at max_tokens) use their alarm's window and rule: quality_tiles.py


class StatsTimeout(Exception):
    """A dashboard query ran past its time limit; the page shows the last values as stale."""


@contextlib.contextmanager
def time_limit(conn: Connection, ms: int) -> Iterator[None]:
    """Interrupt any SQLite statement on this connection that runs longer than ``ms``.

    The deadline restarts with every statement (a slow query is the problem, not a busy machine
    stretching a request of many fast ones)."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw: Any = conn.connection.dbapi_connection
    deadline = [time.monotonic() + ms / 1000]
    last_sql = [""]

    def restart(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        deadline[0] = time.monotonic() + ms / 1000
        last_sql[0] = statement

    def handler() -> int:
        return 1 if time.monotonic() > deadline[0] else 0

    event.listen(conn, "before_cursor_execute", restart)
    raw.set_progress_handler(handler, 1000)
    try:
        yield
    except OperationalError as exc:
        if "interrupted" in str(exc).lower():
            log.warning("dashboard query interrupted after %d ms: %s", ms, last_sql[0][:300])
            raise StatsTimeout(f"a dashboard query took longer than {ms} ms") from None
        raise
    finally:
        raw.set_progress_handler(None, 1000)
        event.remove(conn, "before_cursor_execute", restart)


def window_seconds(window: str) -> int | None:
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    return WINDOWS[window]


def safe_rate(n: float, d: float) -> float | None:
    return n / d if d else None


# ------------------------------------------------------------------ runs list


def list_runs(conn: Connection, limit: int = 200, window_s: int = RECENT_S) -> list[dict[str, Any]]:
    now = time.time()
    runs = [dict(r) for r in conn.execute(
        text("SELECT id, name, kind, status, desired, status_message, cap, concurrency, created_at, started_at,"
             " finished_at, total, n_pending, n_in_flight, n_ok, n_error, n_timeout, n_cancelled"
             " FROM run ORDER BY id DESC LIMIT :n"), {"n": limit}).mappings()]
    errors = {int(run_id): int(n_err or 0) for run_id, n_err in conn.execute(text(
        "SELECT run_id, SUM(CASE WHEN severity = 'error' THEN 1 ELSE 0 END) FROM alarm WHERE active GROUP BY run_id"))}
    problems = problem_counts(conn, [r["id"] for r in runs])  # the one count every page shows (#35)
    for r in runs:
        r["live"] = r["status"] in LIVE_STATUSES
        r["duration_s"] = duration(r, now)
        p = problems.get(r["id"], Problems())
        r["alarms"], r["alarm_errors"] = p.alarms, errors.get(r["id"], 0)
        r["open_items"], r["open_records"], r["episodes"] = p.items, p.failing, p.episodes
        finished = r["n_ok"] + r["n_error"] + r["n_timeout"]
        r["timeout_share"] = safe_rate(r["n_timeout"], finished)
        r["error_share"] = safe_rate(r["n_error"], finished)
        r["target"] = r["cap"] if r["cap"] is not None else r["total"]
        if r["live"]:
            recent = sums(conn, r["id"], now - window_s)
            r.update(recent_rates(recent, window_span_s(recent, now, window_s)))
            r["window_s"] = window_s
            if r["status"] not in WORKING_STATUSES:  # paused: nothing runs, so the current rate is 0
                r.update({"req_s": 0.0, "tok_s": 0.0})
        else:
            d = r["duration_s"] or 0
            r.update({"req_s": safe_rate(r["n_ok"], d), "tok_s": None, "recent_timeout_share": None,
                      "recent_error_share": None})
        r["badges"] = run_badges(r)
    return runs


def duration(r: dict[str, Any], now: float) -> float | None:
    start = r.get("started_at")
    if not start:
        return None
    end = r.get("finished_at") if r["status"] not in LIVE_STATUSES else None
    return (end or now) - start


def run_badges(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(severity, text) pairs for the runs list."""
    out: list[tuple[str, str]] = []
    share = r.get("recent_timeout_share")
    if share is None:
        share = r.get("timeout_share")
    if r["n_timeout"]:
        sev = "bad" if (share or 0) >= TIMEOUT_BAD else "warn"
        # the count is the whole run's, so its share is too; the last minute's (which sets the colour of a live
        # run) is labelled as such ("1 timeout (0.0%)" put a whole-run count beside a last-minute rate)
        text = f"{plural(r['n_timeout'], 'timeout')} ({(r.get('timeout_share') or 0) * 100:.1f}% of the run"
        recent = r.get("recent_timeout_share")
        if recent is not None:
            text += f"; {recent * 100:.1f}% in the last {r.get('window_s', RECENT_S)} s"
        out.append((sev, text + ")"))
    eshare = r.get("recent_error_share")
    if eshare is None:
        eshare = r.get("error_share")
    if r["n_error"]:
        sev = "bad" if (eshare or 0) >= ERROR_BAD else "warn"
        out.append((sev, plural(r["n_error"], "error")))
    if r.get("alarms"):
        sev = "bad" if r.get("alarm_errors") else "warn"
        out.append((sev, plural(r["alarms"], "alarm")))
    if r.get("open_items"):  # records alarms left failing, whether or not the alarms have ended (#26)
        n = r.get("open_records") or 0
        out.append(("bad", plural(r["open_items"], "open problem")
                    + (f" ({plural(n, 'record')})" if n else "")))
    return out


SUM_COLS = ("finished", "ok", "errors", "timeouts", "attempts_failed", "attempt_timeouts", "retries", "dropped",
             "http_429", "http_4xx", "http_5xx", "other_errors", "cancelled", "prompt_tokens", "completion_tokens",
             "reasoning_tokens", "content_tokens", "empty_reasoning", "finish_length", "latency_sum")
_SUM_SQL = ", ".join(f"COALESCE(SUM({c}), 0) AS {c}" for c in SUM_COLS)


def sums(conn: Connection, run_id: int, since: float, endpoint_rows_only: bool = False) -> dict[str, Any]:
    row = conn.execute(
        text(f"SELECT {_SUM_SQL}, MIN(t) AS t_min FROM series WHERE run_id = :r AND t >= :since"),
        {"r": run_id, "since": int(since)},
    ).mappings().first()
    return dict(row) if row else dict.fromkeys(SUM_COLS, 0)


def sums_range(conn: Connection, rid: int, since: int, until: int | None) -> dict[str, Any]:
    sql = f"SELECT {_SUM_SQL} FROM series WHERE run_id = :r AND t >= :since"
    params: dict[str, Any] = {"r": rid, "since": since}
    if until is not None:
        sql += " AND t < :until"
        params["until"] = until
    row = conn.execute(text(sql), params).mappings().first()
    return {k: v or 0 for k, v in dict(row).items()} if row else {}


def recent_rates(s: dict[str, Any], span_s: float) -> dict[str, Any]:
    fin = s["finished"]
    return {
        "req_s": s["ok"] / span_s,
        "tok_s": s["completion_tokens"] / span_s,
        "recent_timeout_share": safe_rate(s["timeouts"], fin),
        "recent_error_share": safe_rate(s["errors"], fin),
    }


def window_span_s(s: dict[str, Any], now: float, window_s: int) -> float:
    """Seconds the recent sums cover: the window, or less when the run is younger than it."""
    return covered_s(s.get("t_min"), now, window_s)


def covered_s(t_min: float | None, now: float, window_s: float) -> float:
    """Seconds a window of series buckets covers, given its first bucket's start: the whole window, or the elapsed
    part of it when the run (or worker) is younger. Every rate over a window divides by this, so that the tile,
    the Server card and the workers table say the same thing ("292 tok/s over the last 28 s", not 102 over 60)."""
    if t_min is None:
        return float(window_s)
    return max(5.0, min(float(window_s), now - float(t_min)))


CACHE: dict[tuple[str, int, str], tuple[int, Any]] = {}
CACHE_LOCK = threading.Lock()


def cached_final(conn: Connection, rid: int, key: str, now: float,
                  compute: Callable[[Connection, int, int, int | None], Any],
                  add: Callable[[Any, Any], Any], empty: Callable[[], Any]) -> tuple[Any, bool]:
    """A whole-run aggregate of the series: (value, complete).

    Buckets the writer can no longer touch are folded in once and cached per process, in steps of
    FOLD_STEP_S of run time for at most FOLD_BUDGET_S per request, so that a long run's first view
    never hits the time limit; until the fold has caught up the value covers only the start of the
    run (complete=False).
    """
    final = int(now - SERIES_FINAL_AFTER_S)
    ckey = (str(conn.engine.url), rid, key)
    with CACHE_LOCK:
        cached = CACHE.get(ckey)
    if cached is None:
        first = conn.execute(text("SELECT MIN(t) FROM series WHERE run_id = :r"), {"r": rid}).scalar()
        cached = (int(first) if first is not None else final, empty())
    upto, base = cached
    started = time.monotonic()
    while final > upto:  # at least one step per request, then more while the budget lasts
        step_to = min(final, upto + FOLD_STEP_S)
        base = add(base, compute(conn, rid, upto, step_to))
        upto = step_to
        with CACHE_LOCK:
            CACHE[ckey] = (upto, base)
        if time.monotonic() - started >= FOLD_BUDGET_S:
            break
    if upto < final:
        return base, False
    return add(base, compute(conn, rid, upto, None)), True
