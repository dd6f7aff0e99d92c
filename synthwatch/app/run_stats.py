"""One run's page: its counters, progress, rates, latencies, quality, endpoints and workers as tiles,
its latest errors and control events."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from ..quality import passk
from ..quality.detection import Problems, open_items, run_problems
from ..store.models import LIVE_STATUSES
from ..workers.sketch import TPS_MIN, Sketch
from .problem_counts import in_words
from .quality_tiles import quality_tiles
from .stats import (
    CACHE,
    CACHE_LOCK,
    ERROR_BAD,
    ERROR_WARN,
    RECENT_S,
    SUM_COLS,
    TIMEOUT_BAD,
    TIMEOUT_WARN,
    WORKING_STATUSES,
    cached_final,
    duration,
    recent_rates,
    safe_rate,
    sums,
    sums_range,
    window_span_s,
)
from .words import check_label, plural

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
    open_items: list[dict[str, Any]] = field(default_factory=list)
    problems: Problems = field(default_factory=Problems)  # the one count (detection.problem_counts) every page shows
    samples: dict[str, Any] | None = None  # samples_per_prompt > 1: per-prompt progress and pass@k (quality.passk)

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
            "in_flight": self.gauge, "open_items": self.open_items, "samples": self.samples,
            "problems": {"alarms": self.problems.alarms, "unacknowledged": self.problems.unacked,
                         "episodes": self.problems.episodes, "open_items": self.problems.items,
                         "records_failing": self.problems.failing},
        }


def get_run(conn: Connection, run_id: int) -> dict[str, Any] | None:
    row = conn.execute(text("SELECT * FROM run WHERE id = :r"), {"r": run_id}).mappings().first()
    if row is None:
        return None
    r = dict(row)
    r["live"] = r["status"] in LIVE_STATUSES
    r["duration_s"] = duration(r, time.time())
    try:
        r["config"] = orjson.loads(r.pop("config_json") or "{}")
    except orjson.JSONDecodeError:
        r["config"] = {}
    return r


def run_stats(conn: Connection, run: dict[str, Any], window_s: int = RECENT_S) -> RunStats:
    now = time.time()
    rid = run["id"]
    recent = sums(conn, rid, now - window_s)
    span = window_span_s(recent, now, window_s)
    recent.update({k: v for k, v in recent_rates(recent, span).items()})
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
    if not st.live:  # ended: averages over the run, as the runs list shows (#37: "0.00 ok req/s" beside 3.69)
        d = run.get("duration_s") or 0
        recent.update(req_s=safe_rate(run["n_ok"], d), tok_s=safe_rate(total["completion_tokens"], d),
                      tok_s_reasoning=safe_rate(total["reasoning_tokens"], d),
                      tok_s_content=safe_rate(total["content_tokens"], d), average=True)
    st.latency = _latency(conn, rid, now, window_s)
    st.failures, st.status_codes = _failures(conn, rid, recent, total)
    st.quality = _quality(conn, rid, recent, total, now, window_s)
    st.checks = _checks(conn, rid)
    st.endpoints = _endpoints(conn, rid, now, window_s, span, recent["working"])
    st.workers = _workers(conn, rid, now)
    st.errors = latest_errors(conn, rid, 8)
    st.tiles = _tiles(st) + [Tile(**t) for t in quality_tiles(conn, run, st.checks)]
    st.open_items = [{**it, "text": in_words(it)} for it in open_items.items(conn, rid)]
    st.problems = run_problems(conn, rid)  # the card's header counts with the runs list, the banner and the tiles
    st.samples = passk.samples_view(conn, run)
    return st


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
    """Conversations regenerated turn by turn (synthwatch.capture.turns): turns stored / turns to write; None when
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
    # Claimed records include answers already back and waiting for the writer, and requests started before the
    # concurrency was lowered: the tile never reads "18 / 16" (#37); the rest is said as claims beyond it.
    claimed, cap = int(run["n_in_flight"] or 0), int(run["concurrency"] or 0)
    shown = min(claimed, cap) if cap else claimed
    return {"in_flight": shown, "claimed_beyond": claimed - shown, "worker_in_flight": inflight,
            "concurrency": run["concurrency"], "worker_concurrency": conc, "t": t}


_VERIFIED: dict[tuple[str, int], int] = {}


def _whole_sums(conn: Connection, run: dict[str, Any], now: float) -> dict[str, Any]:
    """The series summed over the whole run.

    The fold trusts that no row older than SERIES_FINAL_AFTER_S changes again. That holds for
    workers, not for `watch`/`import`, which write rows at the timestamps read from their files. For
    those runs the run's own counters (written in the same transaction as the rows) tell when the fold
    missed rows; the run's folds are then dropped and redone, once per change of the counters."""
    rid = run["id"]
    total, complete = cached_final(conn, rid, "sums", now, sums_range, _add_counts, dict)
    expected = run["n_ok"] + run["n_error"] + run["n_timeout"]
    vkey = (str(conn.engine.url), rid)
    if (complete and run.get("kind", "generate") != "generate" and (total.get("finished") or 0) != expected
            and _VERIFIED.get(vkey) != expected):
        with CACHE_LOCK:
            _VERIFIED[vkey] = expected
            for k in [k for k in CACHE if k[:2] == vkey]:
                del CACHE[k]
        total, _ = cached_final(conn, rid, "sums", now, sums_range, _add_counts, dict)
    return {**dict.fromkeys(SUM_COLS, 0), **total}


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
    whole_all, complete = cached_final(conn, rid, "hists", now, _hists, _add_hists, dict)
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
             now: float, window_s: int) -> dict[str, Any]:
    ok_all, empty_all, length_all = total["ok"] or 0, total["empty_reasoning"] or 0, total["finish_length"] or 0
    sources_recent = _sources(conn, rid, int(now - window_s), None)
    sources, sources_complete = cached_final(conn, rid, "sources", now, _sources, _add_counts, dict)
    ok_r = recent["ok"]
    return {
        "empty_reasoning_recent": safe_rate(recent["empty_reasoning"], ok_r),
        "empty_reasoning_all": safe_rate(empty_all, ok_all),
        "length_recent": safe_rate(recent["finish_length"], ok_r),
        "length_all": safe_rate(length_all, ok_all),
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
        d["rate"] = safe_rate(d["n_fail"], d["n_total"])
        d["win_rate"] = safe_rate(d["win_fail"], d["win_total"])
        out.append(d)
    return out


def _endpoints(conn: Connection, rid: int, now: float, window_s: int, span: float,
               working: bool) -> list[dict[str, Any]]:
    rows = conn.execute(text(
        "SELECT endpoint, SUM(ok) AS ok, SUM(finished) AS finished, SUM(timeouts) AS timeouts,"
        " SUM(errors) AS errors, SUM(attempts_failed) AS attempts_failed, SUM(completion_tokens) AS tokens,"
        " SUM(latency_sum) AS latency_sum, SUM(empty_reasoning) AS empty_reasoning"
        " FROM series WHERE run_id = :r AND t >= :since AND endpoint != '' GROUP BY endpoint ORDER BY endpoint"),
        {"r": rid, "since": int(now - window_s)}).mappings().all()
    out = []
    for r in rows:
        d = dict(r)
        d["req_s"] = (d["ok"] or 0) / span if working else 0.0  # over the time the window covers, as the tiles
        d["tok_s"] = (d["tokens"] or 0) / span if working else 0.0
        d["timeout_share"] = safe_rate(d["timeouts"] or 0, d["finished"] or 0)
        d["error_share"] = safe_rate(d["errors"] or 0, d["finished"] or 0)
        d["mean_latency_s"] = safe_rate(d["latency_sum"] or 0.0, d["ok"] or 0)
        d["empty_share"] = safe_rate(d["empty_reasoning"] or 0, d["ok"] or 0)
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
    if not st.live:  # ended: the whole run, not the last seconds before now (#37: "(last 57 s)" minutes after)
        w = st.whole
        tiles.append(Tile("timeouts", _level(safe_rate(w["timeouts"], w["finished"]) or 0.0, TIMEOUT_BAD, TIMEOUT_WARN),
                          check_label("timeout"), f"{(safe_rate(w['timeouts'], w['finished']) or 0.0) * 100:.1f}%",
                          f"{w['timeouts']:,} of {plural(w['finished'], 'record')} timed out in the whole run"))
        tiles.append(Tile("errors", _level(safe_rate(w["errors"], w["finished"]) or 0.0, ERROR_BAD, ERROR_WARN),
                          check_label("error"), f"{(safe_rate(w['errors'], w['finished']) or 0.0) * 100:.1f}%",
                          f"{w['errors']:,} of {plural(w['finished'], 'record')} failed in the whole run"))
        return tiles
    span_txt = f"last {int(r['span_s'])} s"

    share = safe_rate(r["timeouts"], fin) or 0.0
    att_to = r["attempt_timeouts"]
    level = _level(share, TIMEOUT_BAD, TIMEOUT_WARN)  # the colour follows the number shown; retries are detail
    tiles.append(Tile("timeouts", level, check_label("timeout"), f"{share * 100:.1f}%",
                      f"{r['timeouts']:,} of {plural(fin, 'record')} timed out ({span_txt});"
                      f" {plural(att_to, 'attempt')} timed out (retried or not);"
                      f" {st.whole['timeouts']:,} in the whole run"))

    eshare = safe_rate(r["errors"], fin) or 0.0
    att = r["attempts_failed"]
    level = _level(eshare, ERROR_BAD, ERROR_WARN)
    tiles.append(Tile("errors", level, check_label("error"), f"{eshare * 100:.1f}%",
                      f"{plural(r['errors'], 'record')} failed ({span_txt}); {plural(att, 'failed attempt')},"
                      f" {r['retries']:,} retried; {st.whole['errors']:,} in the whole run"))

    return tiles
