"""The server's own view of a run: each endpoint's Prometheus ``/metrics`` (vLLM, SGLang), scraped while it goes.

The text is parsed with the official Prometheus client library's parser, never by hand. Names differ by
server and version, so each measure has a list of names to look for (vLLM >= 0.10 renamed
``gpu_cache_usage_perc`` to ``kv_cache_usage_perc``; SGLang has its own ``sglang:`` names). Counters become
rates and histograms become quantiles over the interval between two scrapes. A server that exposes none of
these (or no /metrics at all) is "unknown": its rows say so and nothing fails. Scraping never touches the
requests of the run: its own connection, its own timeout, and any error is a value in a row.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..outbound import OutboundError, fetch, register, run_sync, session
from ..redact import clip, redact

log = logging.getLogger("synthwatch.server_metrics")

MAX_BODY = 4 << 20  # a /metrics page is tens of KB; anything past 4 MB is not one

# measure -> names to look for, first found wins (family names as the parser reports them: counters without
# their _total suffix)
GAUGES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "gen_throughput": ("sglang:gen_throughput",),
    # older vLLM and SGLang publish the prefix-cache hit rate as a gauge; newer vLLM as two counters (below)
    "prefix_hit_rate": ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"),
}
COUNTERS = {
    "gen_tokens": ("vllm:generation_tokens", "sglang:generation_tokens"),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens"),
    "preemptions": ("vllm:num_preemptions", "sglang:num_preemptions"),
    "prefix_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "sglang_aborted": ("sglang:num_aborted_requests",),
}
HISTOGRAMS = {
    "queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
}
# vLLM counts finished requests by why they finished: "abort" (the client went away or the server gave up)
# and "error" are what an operator watches beside the successes
FINISHED = ("vllm:request_success",)
WAITING_BY_REASON = ("vllm:num_requests_waiting_by_reason",)
# vLLM publishes its KV-cache sizing as the labels of an info gauge: how many requests of the longest length fit
CACHE_INFO = ("vllm:cache_config_info",)


@dataclass
class CounterSpan:
    """A server counter as first scraped (before this worker's requests had any effect) and as last scraped."""

    first: float
    latest: float = 0.0

    def __post_init__(self) -> None:
        self.latest = self.latest or self.first


@dataclass
class Snapshot:
    t: float
    kind: str = "unknown"
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # measure -> [(le, cumulative)]
    sums: dict[str, tuple[float, float]] = field(default_factory=dict)  # measure -> (_sum, _count)
    finished: dict[str, float] = field(default_factory=dict)  # finished_reason -> count (vLLM)
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    max_concurrency: float | None = None  # requests of max_model_len that fit the KV cache (vLLM's own estimate)


def _number(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f >= 0 else None


def parse(body: str, t: float) -> Snapshot:
    """A /metrics page -> the measures synthwatch keeps (summed over label sets: engines, models)."""
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    snap = Snapshot(t)
    if any(n.startswith("vllm:") for n in fams):
        snap.kind = "vllm"
    elif any(n.startswith("sglang:") for n in fams):
        snap.kind = "sglang"
    for measure, names in GAUGES.items():
        for n in names:
            if n in fams:
                snap.gauges[measure] = sum(s.value for s in fams[n].samples)
                break
    for measure, names in COUNTERS.items():
        for n in names:
            f = fams.get(n) or fams.get(n + "_total")
            if f is not None:
                snap.counters[measure] = sum(s.value for s in f.samples if s.name.endswith("_total"))
                break
    for measure, names in HISTOGRAMS.items():
        for n in names:
            if n in fams:
                by_le: dict[float, float] = {}
                total_sum = total_count = 0.0
                for s in fams[n].samples:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels.get("le", "inf"))
                        by_le[le] = by_le.get(le, 0.0) + s.value
                    elif s.name.endswith("_sum"):
                        total_sum += s.value
                    elif s.name.endswith("_count"):
                        total_count += s.value
                snap.buckets[measure] = sorted(by_le.items())
                snap.sums[measure] = (total_sum, total_count)
                break
    for n in FINISHED:
        f = fams.get(n) or fams.get(n + "_total")
        if f is not None:
            for s in f.samples:
                if s.name.endswith("_total"):
                    reason = s.labels.get("finished_reason", "")
                    snap.finished[reason] = snap.finished.get(reason, 0.0) + s.value
    for n in WAITING_BY_REASON:
        if n in fams:
            for s in fams[n].samples:
                reason = s.labels.get("reason", "")
                snap.waiting_by_reason[reason] = snap.waiting_by_reason.get(reason, 0.0) + s.value
    for n in CACHE_INFO:
        if n in fams:
            found = [_number(s.labels.get("kv_cache_max_concurrency")) for s in fams[n].samples]
            values = [v for v in found if v]
            if values:
                snap.max_concurrency = sum(values)  # one info sample per engine: the engines add up
    return snap


def quantile(buckets: list[tuple[float, float]], q: float) -> dict[str, float] | None:
    """The q-quantile of a histogram given as cumulative (le, count) pairs, where the buckets can tell it.

    Inside a bucket with a lower bound it is interpolated linearly, as Prometheus' histogram_quantile does. In
    the first bucket there is no lower bound to interpolate from (interpolating from 0 made a queue time with a
    mean of 0.07 ms read "p50 150 ms"), so the answer is only ``{"below": le}``; past the last finite bound it
    is ``{"above": le}``. Otherwise ``{"value": v}``. None when the interval observed nothing."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le: float | None = None
    prev_c = 0.0
    for le, c in buckets:
        if c >= rank and c > 0:
            if math.isinf(le):
                return {"above": prev_le} if prev_le is not None else None
            if prev_le is None:
                return {"below": le}
            if c == prev_c:
                return {"value": le}
            return {"value": prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)}
        prev_le, prev_c = le, c
    return {"above": buckets[-1][0]}


def _delta(prev: Snapshot, cur: Snapshot, get: Callable[[Snapshot], float | None]) -> float | None:
    """A counter's change over the interval; a counter that went down means the server restarted: what it counted
    since then is the change."""
    a, b = get(prev), get(cur)
    if a is None or b is None:
        return None
    return b - a if b >= a else b


def interval_row(prev: Snapshot | None, cur: Snapshot) -> dict[str, Any]:
    """What one scrape adds to the run's view: gauges as they are, and everything counted over the interval since
    the previous scrape (rates, counts, means from _sum/_count, quantiles the buckets resolve). The first scrape
    has no interval: it gives gauges only (its counters and histograms cover the server's whole lifetime)."""
    row: dict[str, Any] = {"kind": cur.kind, "running": cur.gauges.get("running"),
                           "waiting": cur.gauges.get("waiting"), "kv_usage": cur.gauges.get("kv_usage"),
                           "max_concurrency": cur.max_concurrency,
                           # a label is the server's text (it may echo a key): redacted like every error
                           "waiting_by_reason": (redact(orjson.dumps(cur.waiting_by_reason).decode())
                                                 if cur.waiting_by_reason else None)}
    if "prefix_hit_rate" in cur.gauges:
        row["prefix_hit_rate"] = cur.gauges["prefix_hit_rate"]
    if prev is None or cur.t <= prev.t:
        if cur.kind == "sglang" and "gen_throughput" in cur.gauges:
            row["gen_tokens_s"] = cur.gauges["gen_throughput"]  # the server's own rate: no interval needed
        return row
    dt = cur.t - prev.t
    row["interval_s"] = dt
    for measure, col in (("gen_tokens", "gen_tokens_s"), ("prompt_tokens", "prompt_tokens_s"),
                         ("preemptions", "preemptions_s")):
        d = _delta(prev, cur, lambda s, m=measure: s.counters.get(m))  # type: ignore[misc]
        row[col] = d / dt if d is not None else None
    row["preemptions"] = _delta(prev, cur, lambda s: s.counters.get("preemptions"))
    if row["gen_tokens_s"] is None and "gen_throughput" in cur.gauges:
        row["gen_tokens_s"] = cur.gauges["gen_throughput"]
    if cur.finished or prev.finished:
        row["aborted"] = _delta(prev, cur, lambda s: s.finished.get("abort", 0.0))
        row["errored"] = _delta(prev, cur, lambda s: s.finished.get("error", 0.0))
    elif "sglang_aborted" in cur.counters:
        row["aborted"] = _delta(prev, cur, lambda s: s.counters.get("sglang_aborted"))
    queries = _delta(prev, cur, lambda s: s.counters.get("prefix_queries"))
    hits = _delta(prev, cur, lambda s: s.counters.get("prefix_hits"))
    if queries and hits is not None:
        row["prefix_hit_rate"] = min(1.0, hits / queries)
    honest: dict[str, Any] = {}
    for measure in ("queue", "ttft"):
        now = cur.buckets.get(measure) or []
        before = dict(prev.buckets.get(measure) or [])
        diff = [(le, c - before.get(le, 0.0)) for le, c in now]
        if diff and any(c < 0 for _, c in diff):  # the server restarted: its counters started over
            diff = now
        s0, n0 = prev.sums.get(measure, (0.0, 0.0))
        s1, n1 = cur.sums.get(measure, (0.0, 0.0))
        if n1 < n0:
            s0 = n0 = 0.0
        mean = (s1 - s0) / (n1 - n0) if n1 > n0 else None
        row[f"{measure}_mean_s"] = mean
        q50, q95 = quantile(diff, 0.5), quantile(diff, 0.95)
        # the plain columns hold only what the buckets resolve (charts draw them); the JSON says "< 0.3 s" too
        row[f"{measure}_p50_s"] = q50.get("value") if q50 else None
        row[f"{measure}_p95_s"] = q95.get("value") if q95 else None
        if q50 or q95 or mean is not None:
            honest[measure] = {"p50": q50, "p95": q95, "mean": mean, "n": n1 - n0 if n1 >= n0 else n1}
    row["quantiles"] = orjson.dumps(honest).decode() if honest else None
    return row


def server_root(base_url: str) -> str:
    """http://host:8000/v1 -> http://host:8000 (where vLLM and SGLang serve /metrics and /version)."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


class Scraper:
    """Scrapes every endpoint of a run at a steady interval and hands the rows to `write` (the writer)."""

    def __init__(self, endpoints: list[Any], *, interval_s: float, timeout_s: float,
                 write: Callable[[list[dict[str, Any]]], Any]) -> None:
        self.endpoints = endpoints
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.write = write
        self.prev: dict[str, Snapshot | None] = {}
        self.latest: dict[str, dict[str, Any]] = {}  # label -> the newest row (the concurrency tuner reads it)
        # label -> the server's preemption counter, first and last scraped: the tuner takes its change over a whole
        # step, where one scrape's rate (0.25 s) can miss preemptions that came in bursts earlier in the step
        self.preemptions: dict[str, CounterSpan] = {}
        self.version: dict[str, tuple[str | None, str | None]] = {}  # label -> (kind, version)
        # label -> the requests the server says it can run at once (SGLang's /get_server_info
        # max_running_requests); vLLM's comes with every scrape (cache_config_info)
        self.ceiling: dict[str, float] = {}

    async def run(self) -> None:
        # the one door out (synthwatch/outbound.py): no ~/.netrc (a login there for the model server's host is not
        # sent to its metrics), a proxy only as each endpoint's, from HTTP(S)_PROXY and NO_PROXY at start-up
        # (outbound.env_proxy), as the worker's requests use; each request ends within timeout_s in all
        async with session("server_metrics") as sess:
            while True:
                t0 = time.monotonic()
                rows = await self.scrape(sess)
                for r in rows:
                    if r is not None:
                        self.latest[r["endpoint"]] = r
                try:
                    self.write([r for r in rows if r is not None])
                except Exception as exc:  # the writer is gone: the worker is ending
                    log.debug("server metrics not written: %s", exc)
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    async def scrape(self, sess: aiohttp.ClientSession) -> list[dict[str, Any] | None]:
        """One scrape of every endpoint, each within its deadline (never raises)."""
        return list(await asyncio.gather(*(self._one(sess, ep) for ep in self.endpoints)))

    async def _get(self, sess: aiohttp.ClientSession, url: str, headers: dict[str, str], ep: Any) -> tuple[int, bytes]:
        r = await fetch(sess, "GET", url, cap=MAX_BODY, deadline_s=self.timeout_s, headers=headers, ssl=ep.ssl,
                        proxy=ep.proxy, proxy_headers=ep.proxy_headers)
        return r.status, r.body

    async def _one(self, session: aiohttp.ClientSession, ep: Any) -> dict[str, Any] | None:
        root = server_root(ep.base_url)
        headers = {k: v for k, v in ep.headers.items() if k.lower() in ("authorization",)}
        label = ep.label
        t = time.time()
        if label not in self.version:
            kind, version, ceiling = await self._identify(session, root, headers, ep)
            self.version[label] = (kind, version)
            if ceiling:
                self.ceiling[label] = ceiling
        kind, version = self.version[label]
        row: dict[str, Any] = {"endpoint": label, "t": t, "kind": kind or "unknown", "version": version}
        try:
            status, body = await self._get(session, root + "/metrics", headers, ep)
            if status != 200:
                row["error"] = f"no metrics: GET /metrics answered HTTP {status}"
                return row
            snap = parse(body.decode("utf-8", "replace"), t)
        except OutboundError as exc:
            row["error"] = f"no metrics: {clip(exc.message, 200)}"
            return row
        except (ValueError, UnicodeError) as exc:  # not the Prometheus text format
            row["error"] = f"no metrics: {exc.__class__.__name__}: {clip(str(exc), 200)}"
            return row
        vals = interval_row(self.prev.get(label), snap)
        self.prev[label] = snap
        if "preemptions" in snap.counters:
            span = self.preemptions.setdefault(label, CounterSpan(snap.counters["preemptions"]))
            span.latest = snap.counters["preemptions"]
        if vals.get("max_concurrency") is None and label in self.ceiling:
            vals["max_concurrency"] = self.ceiling[label]
        if snap.kind == "unknown":
            row["error"] = "no metrics: /metrics has no vLLM or SGLang names"
            return row
        row.update(vals)
        row["kind"] = kind if kind and kind != "unknown" else snap.kind
        return row

    async def _identify(self, session: aiohttp.ClientSession, root: str, headers: dict[str, str],
                        ep: Any) -> tuple[str | None, str | None, float | None]:
        """(kind, version, the requests it runs at once where it says so) from vLLM's /version or SGLang's
        /get_server_info; (None, None, None) when neither answers."""
        for path, kind in (("/version", "vllm"), ("/get_server_info", "sglang")):
            try:
                status, body = await self._get(session, root + path, headers, ep)
                if status == 200:
                    data = orjson.loads(body)
                    if isinstance(data, dict) and isinstance(data.get("version"), str):
                        return kind, clip(data["version"], 100, ""), _number(data.get("max_running_requests"))
            except (OutboundError, ValueError, orjson.JSONDecodeError):
                continue
        return None, None, None


_COLS = ("run_id", "worker_id", "endpoint", "t", "kind", "version", "running", "waiting", "kv_usage",
         "preemptions_s", "gen_tokens_s", "prompt_tokens_s", "queue_p50_s", "queue_p95_s", "ttft_p50_s",
         "ttft_p95_s", "error", "interval_s", "preemptions", "queue_mean_s", "ttft_mean_s", "quantiles", "aborted",
         "errored", "prefix_hit_rate", "max_concurrency", "waiting_by_reason")
_INSERT = text(f"INSERT INTO server_metric ({', '.join(_COLS)}) VALUES ({', '.join(':' + c for c in _COLS)})")


def insert_rows(conn: Connection, run_id: int, worker_id: int, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(_INSERT, [{c: r.get(c) for c in _COLS} | {"run_id": run_id, "worker_id": worker_id}
                               for r in rows])


@register("server_metrics", "the scrape of each endpoint's /version, /get_server_info and /metrics"
          " (workers/server_metrics.py)", 8.0)
def _drive_scrape(base_url: str, key_env: str) -> str:
    from ..config import EndpointConfig, EndpointPoolConfig
    from .endpoints import EndpointPool

    async def go() -> str:
        eps = EndpointPool([EndpointConfig(base_url=base_url, api_key_env=key_env)], EndpointPoolConfig()).endpoints
        scraper = Scraper(eps, interval_s=1.0, timeout_s=2.0, write=lambda rows: None)
        async with session("server_metrics") as sess:
            rows = await scraper.scrape(sess)
        return orjson.dumps(rows, default=str).decode()

    return run_sync(go())
