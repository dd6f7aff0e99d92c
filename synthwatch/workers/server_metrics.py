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

log = logging.getLogger("synthwatch.server_metrics")

MAX_BODY = 4 << 20  # a /metrics page is tens of KB; anything past 4 MB is not one

# measure -> names to look for, first found wins (family names as the parser reports them: counters without
# their _total suffix)
GAUGES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "gen_throughput": ("sglang:gen_throughput",),
}
COUNTERS = {
    "gen_tokens": ("vllm:generation_tokens", "sglang:generation_tokens"),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens"),
    "preemptions": ("vllm:num_preemptions", "sglang:num_preemptions"),
}
HISTOGRAMS = {
    "queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
}


@dataclass
class Snapshot:
    t: float
    kind: str = "unknown"
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # measure -> [(le, cumulative)]


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
                for s in fams[n].samples:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels.get("le", "inf"))
                        by_le[le] = by_le.get(le, 0.0) + s.value
                snap.buckets[measure] = sorted(by_le.items())
                break
    return snap


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a (non-cumulative-difference) histogram given as cumulative (le, count) pairs,
    interpolated linearly inside its bucket, as Prometheus' histogram_quantile does."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return buckets[-1][0]


def interval_row(prev: Snapshot | None, cur: Snapshot) -> dict[str, Any]:
    """What one scrape adds to the run's view: gauges as they are, counters as rates since the previous
    scrape, histograms as quantiles of the requests observed in between."""
    row: dict[str, Any] = {"kind": cur.kind, "running": cur.gauges.get("running"),
                           "waiting": cur.gauges.get("waiting"), "kv_usage": cur.gauges.get("kv_usage")}
    dt = cur.t - prev.t if prev is not None else 0.0
    for measure, col in (("gen_tokens", "gen_tokens_s"), ("prompt_tokens", "prompt_tokens_s"),
                         ("preemptions", "preemptions_s")):
        a = prev.counters.get(measure) if prev is not None else None
        b = cur.counters.get(measure)
        row[col] = max(0.0, (b - a) / dt) if a is not None and b is not None and dt > 0 and b >= a else None
    if row["gen_tokens_s"] is None and "gen_throughput" in cur.gauges:
        row["gen_tokens_s"] = cur.gauges["gen_throughput"]
    for measure in ("queue", "ttft"):
        now = cur.buckets.get(measure) or []
        before = dict(prev.buckets.get(measure) or []) if prev is not None else {}
        diff = [(le, c - before.get(le, 0.0)) for le, c in now]
        if diff and any(c < 0 for _, c in diff):  # the server restarted: its counters started over
            diff = now
        row[f"{measure}_p50_s"] = quantile(diff, 0.5)
        row[f"{measure}_p95_s"] = quantile(diff, 0.95)
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
        # label -> the server's preemption counter as last scraped: the tuner takes its change over a whole step,
        # where one scrape's rate (0.25 s) can miss preemptions that came in bursts earlier in the step
        self.preemptions: dict[str, float] = {}
        self.preemptions_first: dict[str, float] = {}  # ... and at the first scrape (before this worker's requests)
        self.version: dict[str, tuple[str | None, str | None]] = {}  # label -> (kind, version)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=True) as session:
            while True:
                t0 = time.monotonic()
                rows = await asyncio.gather(*(self._one(session, ep) for ep in self.endpoints))
                for r in rows:
                    if r is not None:
                        self.latest[r["endpoint"]] = r
                try:
                    self.write([r for r in rows if r is not None])
                except Exception as exc:  # the writer is gone: the worker is ending
                    log.debug("server metrics not written: %s", exc)
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    async def _get(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                   tls: Any = True) -> tuple[int, bytes]:
        async with session.get(url, headers=headers, allow_redirects=False, ssl=tls) as resp:
            body = await resp.content.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                raise ValueError(f"more than {MAX_BODY >> 20} MB")
            return resp.status, body

    async def _one(self, session: aiohttp.ClientSession, ep: Any) -> dict[str, Any] | None:
        root = server_root(ep.base_url)
        headers = {k: v for k, v in ep.headers.items() if k.lower() in ("authorization",)}
        label = ep.label
        t = time.time()
        if label not in self.version:
            self.version[label] = await self._identify(session, root, headers, ep.ssl)
        kind, version = self.version[label]
        row: dict[str, Any] = {"endpoint": label, "t": t, "kind": kind or "unknown", "version": version}
        try:
            status, body = await self._get(session, root + "/metrics", headers, ep.ssl)
            if status != 200:
                row["error"] = f"no metrics: GET /metrics answered HTTP {status}"
                return row
            snap = parse(body.decode("utf-8", "replace"), t)
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeError) as exc:
            row["error"] = f"no metrics: {exc.__class__.__name__}: {str(exc)[:200]}"
            return row
        vals = interval_row(self.prev.get(label), snap)
        self.prev[label] = snap
        if "preemptions" in snap.counters:
            self.preemptions[label] = snap.counters["preemptions"]
            self.preemptions_first.setdefault(label, snap.counters["preemptions"])
        if snap.kind == "unknown":
            row["error"] = "no metrics: /metrics has no vLLM or SGLang names"
            return row
        row.update(vals)
        row["kind"] = kind if kind and kind != "unknown" else snap.kind
        return row

    async def _identify(self, session: aiohttp.ClientSession, root: str, headers: dict[str, str],
                        tls: Any) -> tuple[str | None, str | None]:
        """(kind, version) from vLLM's /version or SGLang's /get_server_info; (None, None) when neither answers."""
        for path, kind in (("/version", "vllm"), ("/get_server_info", "sglang")):
            try:
                status, body = await self._get(session, root + path, headers, tls)
                if status == 200:
                    data = orjson.loads(body)
                    if isinstance(data, dict) and isinstance(data.get("version"), str):
                        return kind, data["version"][:100]
            except (aiohttp.ClientError, TimeoutError, ValueError, orjson.JSONDecodeError):
                continue
        return None, None


_COLS = ("run_id", "worker_id", "endpoint", "t", "kind", "version", "running", "waiting", "kv_usage",
         "preemptions_s", "gen_tokens_s", "prompt_tokens_s", "queue_p50_s", "queue_p95_s", "ttft_p50_s",
         "ttft_p95_s", "error")
_INSERT = text(f"INSERT INTO server_metric ({', '.join(_COLS)}) VALUES ({', '.join(':' + c for c in _COLS)})")


def insert_rows(conn: Connection, run_id: int, worker_id: int, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(_INSERT, [{c: r.get(c) for c in _COLS} | {"run_id": run_id, "worker_id": worker_id}
                               for r in rows])
