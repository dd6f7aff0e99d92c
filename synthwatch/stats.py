"""Every read query of the dashboard: runs list, run summary, time series, audit log, latest errors.

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
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from .quality_tiles import quality_tiles
from .sketch import TPS_MIN, Sketch
from .words import check_label, plural

log = logging.getLogger("synthwatch.stats")

LIVE_STATUSES = ("created", "running", "paused", "stopping")
WORKING_STATUSES = ("running", "stopping")  # requests are being made: rates are real, not left over
WINDOWS = {"5m": 300, "1h": 3600, "all": None}
RECENT_S = 60  # "current" rates and problem tiles look at the last minute
MAX_POINTS = 240  # a chart never has more points than this (long runs are downsampled)
_NICE_WIDTHS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
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


def _rate(n: float, d: float) -> float | None:
    return n / d if d else None


# ------------------------------------------------------------------ runs list


def list_runs(conn: Connection, limit: int = 200) -> list[dict[str, Any]]:
    now = time.time()
    runs = [dict(r) for r in conn.execute(
        text("SELECT id, name, kind, status, desired, status_message, cap, concurrency, created_at, started_at,"
             " finished_at, total, n_pending, n_in_flight, n_ok, n_error, n_timeout, n_cancelled"
             " FROM run ORDER BY id DESC LIMIT :n"), {"n": limit}).mappings()]
    alarms: dict[int, tuple[int, int]] = {}
    for run_id, n, n_err in conn.execute(text(
            "SELECT run_id, COUNT(*), SUM(CASE WHEN severity = 'error' THEN 1 ELSE 0 END) FROM alarm"
            " WHERE active GROUP BY run_id")):
        alarms[run_id] = (n, n_err or 0)
    for r in runs:
        r["live"] = r["status"] in LIVE_STATUSES
        r["duration_s"] = _duration(r, now)
        r["alarms"], r["alarm_errors"] = alarms.get(r["id"], (0, 0))
        finished = r["n_ok"] + r["n_error"] + r["n_timeout"]
        r["timeout_share"] = _rate(r["n_timeout"], finished)
        r["error_share"] = _rate(r["n_error"], finished)
        r["target"] = r["cap"] if r["cap"] is not None else r["total"]
        if r["live"]:
            recent = _sums(conn, r["id"], now - RECENT_S)
            r.update(_recent_rates(recent, _span(recent, now, RECENT_S)))
            if r["status"] not in WORKING_STATUSES:  # paused: nothing runs, so the current rate is 0
                r.update({"req_s": 0.0, "tok_s": 0.0})
        else:
            d = r["duration_s"] or 0
            r.update({"req_s": _rate(r["n_ok"], d), "tok_s": None, "recent_timeout_share": None,
                      "recent_error_share": None})
        r["badges"] = _badges(r)
    return runs


def _duration(r: dict[str, Any], now: float) -> float | None:
    start = r.get("started_at")
    if not start:
        return None
    end = r.get("finished_at") if r["status"] not in LIVE_STATUSES else None
    return (end or now) - start


def _badges(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(severity, text) pairs for the runs list."""
    out: list[tuple[str, str]] = []
    share = r.get("recent_timeout_share")
    if share is None:
        share = r.get("timeout_share")
    if r["n_timeout"]:
        sev = "bad" if (share or 0) >= TIMEOUT_BAD else "warn"
        out.append((sev, f"{plural(r['n_timeout'], 'timeout')} ({(share or 0) * 100:.1f}%)"))
    eshare = r.get("recent_error_share")
    if eshare is None:
        eshare = r.get("error_share")
    if r["n_error"]:
        sev = "bad" if (eshare or 0) >= ERROR_BAD else "warn"
        out.append((sev, plural(r["n_error"], "error")))
    if r.get("alarms"):
        sev = "bad" if r.get("alarm_errors") else "warn"
        out.append((sev, plural(r["alarms"], "alarm")))
    return out


_SUM_COLS = ("finished", "ok", "errors", "timeouts", "attempts_failed", "attempt_timeouts", "retries", "dropped",
             "http_429", "http_4xx", "http_5xx", "other_errors", "cancelled", "prompt_tokens", "completion_tokens",
             "reasoning_tokens", "content_tokens", "empty_reasoning", "finish_length", "latency_sum")
_SUM_SQL = ", ".join(f"COALESCE(SUM({c}), 0) AS {c}" for c in _SUM_COLS)


def _sums(conn: Connection, run_id: int, since: float, endpoint_rows_only: bool = False) -> dict[str, Any]:
    row = conn.execute(
        text(f"SELECT {_SUM_SQL}, MIN(t) AS t_min FROM series WHERE run_id = :r AND t >= :since"),
        {"r": run_id, "since": int(since)},
    ).mappings().first()
    return dict(row) if row else dict.fromkeys(_SUM_COLS, 0)


def _sums_range(conn: Connection, rid: int, since: int, until: int | None) -> dict[str, Any]:
    sql = f"SELECT {_SUM_SQL} FROM series WHERE run_id = :r AND t >= :since"
    params: dict[str, Any] = {"r": rid, "since": since}
    if until is not None:
        sql += " AND t < :until"
        params["until"] = until
    row = conn.execute(text(sql), params).mappings().first()
    return {k: v or 0 for k, v in dict(row).items()} if row else {}


def _recent_rates(s: dict[str, Any], span_s: float) -> dict[str, Any]:
    fin = s["finished"]
    return {
        "req_s": s["ok"] / span_s,
        "tok_s": s["completion_tokens"] / span_s,
        "recent_timeout_share": _rate(s["timeouts"], fin),
        "recent_error_share": _rate(s["errors"], fin),
    }


# ------------------------------------------------------------------ one run


@dataclass
class Tile:
    """A problem tile: big, coloured, impossible to miss."""

    key: str
    level: str  # bad | warn | ok
    title: str
    value: str
    detail: str


@dataclass
class RunStats:
    run: dict[str, Any]
    now: float
    window_s: int
    recent: dict[str, Any]
    whole: dict[str, Any]
    tiles: list[Tile] = field(default_factory=list)
    latency: dict[str, dict[str, float | None]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    status_codes: list[dict[str, Any]] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    endpoints: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    gauge: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.run["status"] in LIVE_STATUSES

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.run, "live": self.live, "now": self.now, "window_s": self.window_s,
            "progress": self.progress, "recent": self.recent, "whole_run": self.whole,
            "tiles": [t.__dict__ for t in self.tiles], "latency": self.latency, "failures": self.failures,
            "status_codes": self.status_codes, "quality": self.quality, "checks": self.checks,
            "endpoints": self.endpoints, "workers": self.workers, "latest_errors": self.errors,
            "in_flight": self.gauge,
        }


def get_run(conn: Connection, run_id: int) -> dict[str, Any] | None:
    row = conn.execute(text("SELECT * FROM run WHERE id = :r"), {"r": run_id}).mappings().first()
    if row is None:
        return None
    r = dict(row)
    r["live"] = r["status"] in LIVE_STATUSES
    r["duration_s"] = _duration(r, time.time())
    try:
        r["config"] = orjson.loads(r.pop("config_json") or "{}")
    except orjson.JSONDecodeError:
        r["config"] = {}
    return r


def run_stats(conn: Connection, run: dict[str, Any], window_s: int = RECENT_S) -> RunStats:
    now = time.time()
    rid = run["id"]
    recent = _sums(conn, rid, now - window_s)
    span = _span(recent, now, window_s)
    recent.update({k: v for k, v in _recent_rates(recent, span).items()})
    recent["span_s"] = span
    recent["tok_s_reasoning"] = recent["reasoning_tokens"] / span
    recent["tok_s_content"] = recent["content_tokens"] / span
    recent["errors_s"] = recent["attempts_failed"] / span
    recent["working"] = run["status"] in WORKING_STATUSES
    if not recent["working"]:  # paused or ended: nothing runs, so no request rate is current
        recent.update(req_s=0.0, tok_s=0.0, tok_s_reasoning=0.0, tok_s_content=0.0, errors_s=0.0)
    whole = {
        "ok": run["n_ok"], "errors": run["n_error"], "timeouts": run["n_timeout"],
        "finished": run["n_ok"] + run["n_error"] + run["n_timeout"],
    }
    st = RunStats(run=run, now=now, window_s=window_s, recent=recent, whole=whole)
    st.progress = _progress(run, recent)
    st.gauge = _gauge(conn, rid, run)
    total = _whole_sums(conn, run, now)  # first: it may drop the run's cached folds (rows that came late)
    st.latency = _latency(conn, rid, now, window_s)
    st.failures, st.status_codes = _failures(conn, rid, recent, total)
    st.quality = _quality(conn, rid, recent, total, now)
    st.checks = _checks(conn, rid)
    st.endpoints = _endpoints(conn, rid, now, window_s, recent["working"])
    st.workers = _workers(conn, rid, now)
    st.errors = latest_errors(conn, rid, 8)
    st.tiles = _tiles(st) + [Tile(**t) for t in quality_tiles(conn, run, st.checks)]
    return st


def _span(s: dict[str, Any], now: float, window_s: int) -> float:
    """Seconds the recent sums cover: the window, or less when the run is younger than it."""
    t_min = s.get("t_min")
    if t_min is None:
        return float(window_s)
    return max(5.0, min(float(window_s), now - float(t_min)))


def _progress(run: dict[str, Any], recent: dict[str, Any]) -> dict[str, Any]:
    target = run["cap"] if run["cap"] is not None else run["total"]
    n_ok = run["n_ok"]
    left = max(0, (target or 0) - n_ok)
    if run["cap"] is not None:
        # a cap larger than the dataset can never be reached: what is left is bounded by the queue
        left = min(left, run["n_pending"] + run["n_in_flight"])
    rate = recent.get("req_s") or 0.0
    eta = left / rate if rate > 0 and left else (0.0 if not left else None)
    paused = run["status"] == "paused" or (run["status"] in LIVE_STATUSES and run["desired"] == "pause")
    return {"target": target, "ok": n_ok, "left": left, "fraction": min(1.0, n_ok / target) if target else 0.0,
            "eta_s": eta if run["status"] in LIVE_STATUSES and not paused else None, "paused": paused,
            "rate_req_s": rate, "capped": run["cap"] is not None, "turns": _turns_progress(run)}


def _turns_progress(run: dict[str, Any]) -> dict[str, int] | None:
    """Conversations regenerated turn by turn (synthwatch.turns): turns stored / turns to write; None when
    every record is one turn. A record counts as ok once its last turn is; its earlier turns count here."""
    total = int(run.get("n_turns") or 0)
    if total <= int(run.get("total") or 0):
        return None
    return {"done": int(run.get("n_turns_done") or 0), "total": total}


def _gauge(conn: Connection, rid: int, run: dict[str, Any]) -> dict[str, Any]:
    # the latest gauge bucket of each worker (endpoint "" rows carry in-flight and concurrency)
    row = conn.execute(text(
        "SELECT COALESCE(SUM(inflight), 0), COALESCE(SUM(concurrency), 0), MAX(t) FROM series"
        " WHERE run_id = :r AND endpoint = '' AND t = (SELECT MAX(t) FROM series WHERE run_id = :r)"),
        {"r": rid}).first()
    inflight, conc, t = row if row else (0, 0, None)
    return {"in_flight": run["n_in_flight"], "worker_in_flight": inflight, "concurrency": run["concurrency"],
            "worker_concurrency": conc, "t": t}


_CACHE: dict[tuple[str, int, str], tuple[int, Any]] = {}
_CACHE_LOCK = threading.Lock()


def _cached_final(conn: Connection, rid: int, key: str, now: float,
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
    with _CACHE_LOCK:
        cached = _CACHE.get(ckey)
    if cached is None:
        first = conn.execute(text("SELECT MIN(t) FROM series WHERE run_id = :r"), {"r": rid}).scalar()
        cached = (int(first) if first is not None else final, empty())
    upto, base = cached
    started = time.monotonic()
    while final > upto:  # at least one step per request, then more while the budget lasts
        step_to = min(final, upto + FOLD_STEP_S)
        base = add(base, compute(conn, rid, upto, step_to))
        upto = step_to
        with _CACHE_LOCK:
            _CACHE[ckey] = (upto, base)
        if time.monotonic() - started >= FOLD_BUDGET_S:
            break
    if upto < final:
        return base, False
    return add(base, compute(conn, rid, upto, None)), True


_VERIFIED: dict[tuple[str, int], int] = {}


def _whole_sums(conn: Connection, run: dict[str, Any], now: float) -> dict[str, Any]:
    """The series summed over the whole run.

    The fold trusts that no row older than SERIES_FINAL_AFTER_S changes again. That holds for
    workers, not for `watch`/`import`, which write rows at the timestamps read from their files. For
    those runs the run's own counters (written in the same transaction as the rows) tell when the fold
    missed rows; the run's folds are then dropped and redone, once per change of the counters."""
    rid = run["id"]
    total, complete = _cached_final(conn, rid, "sums", now, _sums_range, _add_counts, dict)
    expected = run["n_ok"] + run["n_error"] + run["n_timeout"]
    vkey = (str(conn.engine.url), rid)
    if (complete and run.get("kind", "generate") != "generate" and (total.get("finished") or 0) != expected
            and _VERIFIED.get(vkey) != expected):
        with _CACHE_LOCK:
            _VERIFIED[vkey] = expected
            for k in [k for k in _CACHE if k[:2] == vkey]:
                del _CACHE[k]
        total, _ = _cached_final(conn, rid, "sums", now, _sums_range, _add_counts, dict)
    return {**dict.fromkeys(_SUM_COLS, 0), **total}


def _add_counts(a: dict[Any, int], b: dict[Any, int]) -> dict[Any, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _sources(conn: Connection, rid: int, since: int, until: int | None) -> dict[str, int]:
    sql = "SELECT sources_json FROM series WHERE run_id = :r AND t >= :since AND sources_json != '{}'"
    params: dict[str, Any] = {"r": rid, "since": since}
    if until is not None:
        sql += " AND t < :until"
        params["until"] = until
    out: dict[str, int] = {}
    for (sj,) in conn.execute(text(sql), params):
        for k, v in orjson.loads(sj).items():
            out[k] = out.get(k, 0) + v
    return out


_PARSED: dict[str, tuple[tuple[int, int], ...]] = {}
_PARSED_MAX = 5_000  # the live tail is a few hundred rows; history is folded once, unmemoised


def _parse_hist(h: str) -> tuple[tuple[int, int], ...]:
    """A sketch's text as (bucket, count) pairs, memoised: the same rows are re-read on every poll."""
    got = _PARSED.get(h)
    if got is None:
        nums = list(map(int, h.replace(":", ",").split(",")))
        got = tuple(zip(nums[::2], nums[1::2], strict=True))
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[h] = got
    return got


def _parse_once(h: str) -> tuple[tuple[int, int], ...]:
    nums = list(map(int, h.replace(":", ",").split(",")))
    return tuple(zip(nums[::2], nums[1::2], strict=True))


def _sketch(col: str, counts: dict[int, int]) -> Sketch:
    sk = Sketch(TPS_MIN if col == "tps_hist" else 0.005)
    sk.counts = counts
    return sk


_HIST_COLS = (("lat_hist", "latency_s"), ("ttft_hist", "ttft_s"), ("tps_hist", "tokens_per_s"))


def _hists(conn: Connection, rid: int, since: int, until: int | None) -> dict[str, dict[int, int]]:
    """The three latency sketches of a time range, merged, in one pass over the rows."""
    sql = "SELECT lat_hist, ttft_hist, tps_hist FROM series WHERE run_id = :r AND t >= :since AND lat_hist != ''"
    params: dict[str, Any] = {"r": rid, "since": since}
    if until is not None:
        sql += " AND t < :until"
        params["until"] = until
    # rows of the live tail are re-read on every refresh: memoise their parse; folded history is read once
    parse = _parse_hist if until is None else _parse_once
    out: dict[str, dict[int, int]] = {c: {} for c, _ in _HIST_COLS}
    for row in conn.execute(text(sql), params):
        for (col, _), h in zip(_HIST_COLS, row, strict=True):
            if h:
                counts = out[col]
                for i, c in parse(h):
                    counts[i] = counts.get(i, 0) + c
    return out


def _add_hists(a: dict[str, dict[int, int]], b: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    return {c: _add_counts(a.get(c, {}), b.get(c, {})) for c, _ in _HIST_COLS}


def _latency(conn: Connection, rid: int, now: float, window_s: int) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    qs = (0.5, 0.95, 0.99)
    recent_all = _hists(conn, rid, int(now - window_s), None)
    whole_all, complete = _cached_final(conn, rid, "hists", now, _hists, _add_hists, dict)
    for col, label in _HIST_COLS:
        recent = _sketch(col, recent_all[col])
        whole = _sketch(col, whole_all.get(col, {}))
        r50, r95, r99 = recent.quantiles(qs)
        w50, w95, w99 = whole.quantiles(qs)
        out[label] = {"p50": r50, "p95": r95, "p99": r99, "n": recent.n,
                      "run_p50": w50, "run_p95": w95, "run_p99": w99, "run_n": whole.n, "run_complete": complete}
    return out


_FAILURE_KINDS = (
    ("timeouts", "Records ended in timeout", "bad"),
    ("errors", "Records ended in error", "bad"),
    ("attempt_timeouts", "Attempts timed out", "warn"),
    ("http_429", "HTTP 429 (rate limited)", "warn"),
    ("http_5xx", "HTTP 5xx", "warn"),
    ("http_4xx", "HTTP 4xx (other)", "warn"),
    ("dropped", "Dropped connections", "warn"),
    ("other_errors", "Other attempt errors", "warn"),
    ("retries", "Retries", "info"),
)


def _failures(conn: Connection, rid: int, recent: dict[str, Any],
              total: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    span = recent["span_s"]
    rows = []
    for key, label, sev in _FAILURE_KINDS:
        rows.append({"kind": key, "label": label, "severity": sev, "total": total[key] or 0,
                     "window": recent[key] or 0, "per_min": (recent[key] or 0) * 60 / span})
    codes = [{"status": code, "kind": kind, "n": n} for code, kind, n in conn.execute(text(
        "SELECT status_code, kind, COUNT(*) FROM error_event WHERE run_id = :r"
        " AND id > COALESCE((SELECT MAX(id) FROM error_event WHERE run_id = :r), 0) - 500"
        " GROUP BY status_code, kind ORDER BY COUNT(*) DESC"), {"r": rid})]
    return rows, codes


def _quality(conn: Connection, rid: int, recent: dict[str, Any], total: dict[str, Any],
             now: float) -> dict[str, Any]:
    ok_all, empty_all, length_all = total["ok"] or 0, total["empty_reasoning"] or 0, total["finish_length"] or 0
    sources_recent = _sources(conn, rid, int(now - RECENT_S), None)
    sources, sources_complete = _cached_final(conn, rid, "sources", now, _sources, _add_counts, dict)
    ok_r = recent["ok"]
    return {
        "empty_reasoning_recent": _rate(recent["empty_reasoning"], ok_r),
        "empty_reasoning_all": _rate(empty_all, ok_all),
        "length_recent": _rate(recent["finish_length"], ok_r),
        "length_all": _rate(length_all, ok_all),
        "n_empty_all": empty_all, "n_length_all": length_all, "ok_recent": ok_r, "ok_all": ok_all,
        "sources": sorted(sources.items(), key=lambda kv: -kv[1]),
        "sources_recent": sorted(sources_recent.items(), key=lambda kv: -kv[1]),
        "sources_total": sum(sources.values()),
        "sources_complete": sources_complete,
    }


def _checks(conn: Connection, rid: int) -> list[dict[str, Any]]:
    try:
        rows = conn.execute(text(
            "SELECT check_name, n_fail, n_total, win_fail, win_total, example_record_id, updated_at"
            " FROM check_stat WHERE run_id = :r ORDER BY check_name"), {"r": rid}).mappings().all()
    except OperationalError:
        return []
    out = []
    for r in rows:
        d = dict(r)
        d["rate"] = _rate(d["n_fail"], d["n_total"])
        d["win_rate"] = _rate(d["win_fail"], d["win_total"])
        out.append(d)
    return out


def _endpoints(conn: Connection, rid: int, now: float, window_s: int, working: bool) -> list[dict[str, Any]]:
    rows = conn.execute(text(
        "SELECT endpoint, SUM(ok) AS ok, SUM(finished) AS finished, SUM(timeouts) AS timeouts,"
        " SUM(errors) AS errors, SUM(attempts_failed) AS attempts_failed, SUM(completion_tokens) AS tokens,"
        " SUM(latency_sum) AS latency_sum, SUM(empty_reasoning) AS empty_reasoning"
        " FROM series WHERE run_id = :r AND t >= :since AND endpoint != '' GROUP BY endpoint ORDER BY endpoint"),
        {"r": rid, "since": int(now - window_s)}).mappings().all()
    out = []
    for r in rows:
        d = dict(r)
        d["req_s"] = (d["ok"] or 0) / window_s if working else 0.0
        d["tok_s"] = (d["tokens"] or 0) / window_s if working else 0.0
        d["timeout_share"] = _rate(d["timeouts"] or 0, d["finished"] or 0)
        d["error_share"] = _rate(d["errors"] or 0, d["finished"] or 0)
        d["mean_latency_s"] = _rate(d["latency_sum"] or 0.0, d["ok"] or 0)
        d["empty_share"] = _rate(d["empty_reasoning"] or 0, d["ok"] or 0)
        out.append(d)
    return out


def _workers(conn: Connection, rid: int, now: float) -> list[dict[str, Any]]:
    out = []
    for r in conn.execute(text(
            "SELECT id, host, pid, started_at, heartbeat_at, status, claimed, done, stats_json FROM worker"
            " WHERE run_id = :r ORDER BY id DESC LIMIT 20"), {"r": rid}).mappings():
        d = dict(r)
        try:
            d["stats"] = orjson.loads(d.pop("stats_json") or "{}")
        except orjson.JSONDecodeError:
            d["stats"] = {}
        d["silent_s"] = now - d["heartbeat_at"]
        out.append(d)
    return out


def latest_errors(conn: Connection, rid: int, n: int = 10) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(text(
        "SELECT id, t, record_id, endpoint, kind, status_code, final, message FROM error_event"
        " WHERE run_id = :r ORDER BY id DESC LIMIT :n"), {"r": rid, "n": n}).mappings()]


def control_events(conn: Connection, rid: int, n: int = 30) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(text(
        "SELECT id, t, action, value, actor, detail FROM control_event WHERE run_id = :r"
        " ORDER BY id DESC LIMIT :n"), {"r": rid, "n": n}).mappings()]


def _level(share: float, bad: float, warn: float) -> str:
    return "bad" if share >= bad else ("warn" if share >= warn else "ok")


def _tiles(st: RunStats) -> list[Tile]:
    r = st.recent
    fin = r["finished"]
    tiles: list[Tile] = []
    span_txt = f"last {int(r['span_s'])} s"

    share = _rate(r["timeouts"], fin) or 0.0
    att_to = r["attempt_timeouts"]
    level = _level(share, TIMEOUT_BAD, TIMEOUT_WARN)  # the colour follows the number shown; retries are detail
    tiles.append(Tile("timeouts", level, check_label("timeout"), f"{share * 100:.1f}%",
                      f"{r['timeouts']:,} of {plural(fin, 'record')} timed out ({span_txt});"
                      f" {plural(att_to, 'attempt')} timed out (retried or not);"
                      f" {st.whole['timeouts']:,} in the whole run"))

    eshare = _rate(r["errors"], fin) or 0.0
    att = r["attempts_failed"]
    level = _level(eshare, ERROR_BAD, ERROR_WARN)
    tiles.append(Tile("errors", level, check_label("error"), f"{eshare * 100:.1f}%",
                      f"{plural(r['errors'], 'record')} failed ({span_txt}); {plural(att, 'failed attempt')},"
                      f" {r['retries']:,} retried; {st.whole['errors']:,} in the whole run"))

    return tiles


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
    width = next((w for w in _NICE_WIDTHS if total_span / w <= MAX_POINTS), None)
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
    return {"run_id": rid, "window": window, "bucket_s": width, "start": since, "end": end, "points": points,
            "complete": complete, "server": has_server}


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
    with _CACHE_LOCK:
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
            with _CACHE_LOCK:
                _TS_CACHE[key] = (start, upto, dict(buckets))
            if time.monotonic() - started >= FOLD_BUDGET_S:
                break
    tail = _ts_buckets(conn, rid, width, max(upto, final), None)
    merged = {b: v for b, v in buckets.items() if b >= since}
    merged.update(tail)
    return [merged[b] for b in sorted(merged)], upto >= final
