"""Self-tuning concurrency (`concurrency = "auto"`): as many requests in flight as the servers can serve.

The worker runs one tuner per endpoint (:func:`tune`): each endpoint gets its own limit of requests at once
(Endpoint.limit, respected by the pool), fed by that endpoint's own answers, failures and /metrics; the run's
concurrency is the sum of the limits.

Every ``interval_s`` the tuner looks at what the last interval gave and decides one step, each recorded in
the audit log with its reason (and visible as the concurrency line of the in-flight chart):

- **back off** (x0.7, or to what the servers actually run) on any request timeout, 429, 5xx or preemption,
  or when a server's own queue (``waiting`` from its /metrics, see server_metrics.py) holds requests: past
  the knee a request only waits, and waiting is what turns into timeouts;
- **raise** (x1.5) while output tokens/s still grows by at least ``gain`` over the best interval seen, never
  above the servers' batch size once their queue has shown it (the knee), nor above the requests the server
  says fit at once where it publishes that (vLLM's ``cache_config_info`` ``kv_cache_max_concurrency``, SGLang's
  ``max_running_requests``);
- **back to the best** when the median time per output token (a request's latency over its tokens) went past
  ``latency_factor`` of the lowest seen, but only where the server's own metrics back it with a queue or
  preemptions, or where the server shows no metrics at all. A batch that grows makes every token slower on a
  real GPU while total tokens/s still rises: that alone is not the knee (a real vLLM stopped the tuner at 12
  where a fixed 32 gave a third more tokens/s, its queue empty and room for 1,024 sequences);
- **hold** otherwise (a plateau: more requests in flight would only queue).

It never leaves [min, max]. A server that shows no metrics is tuned on tokens/s, latency and errors alone.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ..store import queue as store
from . import faults

log = logging.getLogger("synthwatch.worker")


@dataclass
class Interval:
    """What one interval gave: tokens/s, median latency, failures by kind, and the servers' own view."""

    tokens_s: float
    s_per_token_p50: float | None  # median of (latency / completion tokens) over the interval's ok records
    in_flight_max: int
    timeouts: int = 0
    rate_limited: int = 0
    server_errors: int = 0
    preemptions: float = 0.0
    server_waiting: float | None = None  # summed over endpoints with metrics; None: no endpoint has them
    server_running: float | None = None
    in_flight_now: int = 0  # this worker's requests running at the end of the interval
    server_ceiling: float | None = None  # what the server says fits at once (None: it does not say)


@dataclass
class Tuner:
    current: int
    low: int
    high: int
    gain: float = 0.05
    latency_factor: float = 2.0
    best_tokens_s: float = 0.0
    best_at: int = 0
    lowest_s_per_token: float | None = None
    ceiling: int | None = None  # the servers' batch size, once their queue showed it (the knee)
    server_ceiling: int | None = None  # what the server publishes as the most requests that fit at once
    pressure_seen: bool = False  # the server's metrics showed a queue or preemptions since the last raise
    history: list[tuple[int, int, str]] = field(default_factory=list)  # (from, to, reason)

    def step(self, iv: Interval) -> tuple[int, str] | None:
        """The next concurrency and why, or None to hold."""
        cur = self.current
        if iv.s_per_token_p50 is not None:
            if self.lowest_s_per_token is None or iv.s_per_token_p50 < self.lowest_s_per_token:
                self.lowest_s_per_token = iv.s_per_token_p50
        failures = []
        if iv.timeouts:
            failures.append(f"{iv.timeouts} timed out")
        if iv.rate_limited:
            failures.append(f"{iv.rate_limited} rate-limited (429)")
        if iv.server_errors:
            failures.append(f"{iv.server_errors} server errors (5xx)")
        if iv.preemptions > 0:
            failures.append(f"the server preempted {iv.preemptions:g} requests")
        if iv.server_ceiling:
            self.server_ceiling = max(1, int(iv.server_ceiling))
        if iv.preemptions > 0 or (iv.server_waiting or 0) >= 1:
            self.pressure_seen = True
        if failures:
            return self._set(int(cur * 0.7), "back off: " + ", ".join(failures))
        if iv.server_waiting is not None and iv.server_waiting >= 1:
            if iv.server_running and iv.in_flight_now and iv.in_flight_now <= iv.server_running:
                return None  # the queue is not ours (other clients, or requests sent before the last step)
            if iv.server_running:
                # the servers run this many at once: the knee. Above it a request only waits, so stay at it
                self.ceiling = int(iv.server_running)
            target = int(iv.server_running) if iv.server_running and iv.server_running < cur else int(cur * 0.9)
            return self._set(target, f"back off: the servers queue {iv.server_waiting:g} requests (running "
                                     f"{iv.server_running or 0:g}): past the knee requests only wait")
        if iv.in_flight_max < cur * 0.8:
            return None  # not enough work in flight to judge this concurrency
        per_token = iv.s_per_token_p50
        # slower tokens alone are what a bigger batch costs; they mean the knee only with a queue or preemptions
        # behind them, or where the server shows nothing either way
        backed = iv.server_waiting is None or self.pressure_seen
        if (backed and per_token is not None and self.lowest_s_per_token is not None
                and per_token > self.latency_factor * self.lowest_s_per_token and cur > self.best_at > 0):
            return self._set(self.best_at, f"back to {self.best_at}: time per output token {per_token * 1000:.0f} ms"
                                           f" is over {self.latency_factor:g}x the lowest seen"
                                           + (" with the server queueing or preempting"
                                              if iv.server_waiting is not None else ""))
        if iv.tokens_s > self.best_tokens_s * (1 + self.gain):
            self.best_tokens_s, self.best_at = iv.tokens_s, cur
            limit = min((c for c in (self.ceiling, self.server_ceiling) if c is not None), default=None)
            if limit is not None and cur >= limit:
                return None  # at the knee the servers showed, or at what the server says fits
            up = max(cur + 1, int(cur * 1.5))
            why = f"raise: output tokens/s grew to {iv.tokens_s:,.0f}"
            if limit is not None and up > limit:
                up = limit
                why += (f" (up to the {limit} requests the server says fit at once)" if limit == self.server_ceiling
                        and limit != self.ceiling else f" (up to the knee the server's queue showed, {limit})")
            self.pressure_seen = False
            return self._set(up, why)
        return None

    def _set(self, n: int, reason: str) -> tuple[int, str] | None:
        n = max(self.low, min(self.high, n))
        if n == self.current:
            return None
        self.history.append((self.current, n, reason))
        self.current = n
        return n, reason


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


async def tune(worker: Any) -> None:
    """A worker's self-tuning concurrency (its task while the run goes), per endpoint: each endpoint has its own
    tuner and its own limit of requests at once (Endpoint.limit); the run's concurrency is their sum. One step per
    interval, each in the audit log naming the endpoint and the reason."""
    at = worker.config.autotune
    start = max(at.min, min(at.max, at.start))
    eps = list(worker.pool.endpoints)
    tuners = {ep.label: Tuner(start, at.min, at.max, gain=at.gain, latency_factor=at.latency_factor)
              for ep in eps}
    for ep in eps:
        ep.limit = start
    total = start * len(eps)
    await asyncio.to_thread(store.apply_control, worker.engine, worker.run_id, "concurrency", total, "autotune",
                            f"self-tuning concurrency starts at {start} per endpoint (min {at.min}, max {at.max})"
                            + (f", {len(eps)} endpoints" if len(eps) > 1 else ""))
    last = {ep.label: (ep.n_timeouts, ep.limited, ep.n_server_errors) for ep in eps}
    scraped = worker.scraper.preemptions if worker.scraper is not None else {}
    preempted = {k: v.latest for k, v in scraped.items()}  # each server's preemption counter at the previous step
    while True:
        t0 = time.monotonic()
        for ep in eps:
            ep.outstanding_max = ep.outstanding
        await asyncio.sleep(at.interval_s)
        faults.hit("tuner")
        if worker.state != "running":
            last = {ep.label: (ep.n_timeouts, ep.limited, ep.n_server_errors) for ep in eps}
            preempted = {k: v.latest for k, v in scraped.items()}
            continue
        dt = time.monotonic() - t0
        changes = []
        for ep in eps:
            done = [(tk, spt) for ts, tk, spt in ep.done if ts >= t0]
            lat = [spt for _tk, spt in done if spt is not None]
            now = (ep.n_timeouts, ep.limited, ep.n_server_errors)
            prev = last[ep.label]
            last[ep.label] = now
            waiting = running = ceiling = None
            preempt = 0.0
            row = worker.scraper.latest.get(ep.label) if worker.scraper is not None else None
            span = scraped.get(ep.label)
            if row and not row.get("error") and row.get("t", 0) >= time.time() - 2 * at.interval_s:
                waiting, running = row.get("waiting") or 0.0, row.get("running") or 0.0
                ceiling = row.get("max_concurrency")
                # the counter's change over the whole step (from the first scrape when tuning began before
                # any): one scrape's rate misses earlier bursts
                before = preempted.get(ep.label, span.first if span is not None else None)
                if span is not None and before is not None:
                    preempt = span.latest - before if span.latest >= before else span.latest  # a restart
                else:
                    preempt = row.get("preemptions") or 0.0
            if span is not None:
                preempted[ep.label] = span.latest
            iv = Interval(sum(tk for tk, _ in done) / dt, median(lat) if len(lat) >= 10 else None,
                          ep.outstanding_max, now[0] - prev[0], now[1] - prev[1], now[2] - prev[2], preempt,
                          waiting, running, in_flight_now=ep.outstanding, server_ceiling=ceiling)
            tuner = tuners[ep.label]
            tuner.current = ep.limit or tuner.current
            decision = tuner.step(iv)
            if decision is not None:
                ep.limit = decision[0]
                changes.append(f"{ep.label}: {tuner.history[-1][0]} -> {decision[0]}, {decision[1]}")
        if changes:
            total = sum(ep.limit for ep in eps)
            reason = "; ".join(changes)
            log.info("run %d: concurrency %d (%s)", worker.run_id, total, reason)
            await asyncio.to_thread(store.apply_control, worker.engine, worker.run_id, "concurrency", total,
                                    "autotune", reason[:2000])
