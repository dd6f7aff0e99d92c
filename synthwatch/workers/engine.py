"""The generation worker: claims prompts from the database queue and runs them against endpoints.

Concurrency is a live number read from the run row (changeable while running). Each claimed
record runs in its own task that turns every attempt into an AttemptResult, retries transient
faults with exponential backoff and jitter, and hands one Outcome to the writer. Cancellation
(immediate stop, second Ctrl-C) is recorded on the record, which goes back to pending, and then
re-raised. Graceful stop: no new claims, in-flight requests finish, the writer flushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..config import RunConfig
from ..quality.alarms import TRANSPORT_RULES
from ..quality.open_items import completion_message
from ..settings import get_settings
from ..store import queue as store
from ..store.versions import versioned_changes
from .autotune import Interval, Tuner, median
from .client import Requester
from .endpoints import EndpointPool
from .gc_tuning import tuned_for_worker
from .record import RecordTasks
from .results import LiveStats
from .server_metrics import Scraper, insert_rows
from .writer import Writer, WriterHook

log = logging.getLogger("synthwatch.worker")

EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 3, "paused": 4}
CLAIM_WAIT_S = 0.05  # longest a free slot waits for a batch of free slots before it is claimed alone
# At high completion rates the worker claims this much work (in seconds of completions) ahead of its free
# slots: each claim is a write transaction with a fixed cost, and claims of a few records at thousands of
# completions per second were a third of the writer's work. Below RESERVE_MIN records it claims only for
# free slots, so that a run against a real model (seconds per request) holds no more than it runs.
RESERVE_S = 0.1
RESERVE_MIN = 32
RESERVE_MAX = 1024


class RunWorker(RecordTasks):
    def __init__(
        self,
        engine: Engine,
        run_id: int,
        config: RunConfig,
        *,
        join: bool = False,
        hooks: list[WriterHook] | None = None,
        on_tick: Callable[[RunWorker], None] | None = None,
    ) -> None:
        self.engine = engine
        self.run_id = run_id
        self.config = config
        self.join = join
        self.hooks = hooks or []
        self.on_tick = on_tick
        if config.autotune.enabled and not join:  # the tuner starts from its own start, not the default concurrency
            at = config.autotune
            config.concurrency = max(at.min, min(at.max, at.start))
        self.pool = EndpointPool(config.endpoints, config.pool)
        self.stats = LiveStats()
        self.tasks: set[asyncio.Task[None]] = set()
        self.local_stop: str | None = None  # "stop" | "stop_now" from signals
        self._done_why = ""  # why the run completed ("done", "cap_done"), for its final message
        self.pause_note = ""  # why the run is paused when an alarm holds it (the terminal prints it)
        self._hold: tuple[str, ...] = ()  # the rules of the alarms that hold the paused run
        self._final = ""  # the state _shutdown stored when it differs from the loop's (every request failed)
        self.state = "running"
        self.worker_id = 0
        self.writer: Writer | None = None
        self._rng = random.Random()
        self._body_base = self._base_body()
        self._wake = asyncio.Event()
        self._wake_at = 1 << 30  # _task_done wakes the loop when at most this many records remain (running + ready)
        # claimed records not started yet (the reserve): started by _task_done as slots free up, returned to
        # pending when the run pauses, stops or its cap changes
        self.ready: deque[store.Claimed] = deque()
        self._slots = 0  # concurrency as last read by the loop
        self._n_done = 0  # finished tasks, for the completion rate
        self._rate = 0.0  # completions per second, smoothed
        self._cap_seen: Any = None  # the cap the reserve was claimed under
        self._claim_fut: Future[tuple[list[store.Claimed], str]] | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self.config_version = 1  # the run's config version this worker generates under (read in _prepare)
        self.scraper: Scraper | None = None
        self._inflight_max = 0  # most requests running at once since the tuner last looked

    # ------------------------------------------------------------ request bodies

    def _base_body(self) -> dict[str, Any]:
        c = self.config
        s = c.sampling
        body: dict[str, Any] = {"model": c.model, "stream": c.stream}
        if c.stream:
            body["stream_options"] = {"include_usage": True}
        for key in ("temperature", "top_p", "max_tokens", "seed", "stop"):
            v = getattr(s, key)
            if v is not None:
                body[key] = v
        if c.request_token_ids:
            body["return_token_ids"] = True
        body.update(s.extra_body)
        return body

    def body_for(self, messages: list[dict[str, Any]] | dict[str, Any]) -> bytes:
        body = dict(self._body_base)
        if isinstance(messages, dict):  # a prompt with tools: {"messages": [...], "tools": [...]}
            body["messages"] = messages["messages"]
            body["tools"] = messages["tools"]
        else:
            body["messages"] = messages
        return orjson.dumps(body)

    # ------------------------------------------------------------ lifecycle

    def _gauges(self) -> tuple[int, int, dict[str, int], dict[str, Any]]:
        conc = int(self.writer.control.get("concurrency") or self.config.concurrency) if self.writer else 0
        return len(self.tasks), conc, self.pool.outstanding(), {
            "in_flight": len(self.tasks), "concurrency": conc, "state": self.state,
            "endpoints": self.pool.public(), "write_error": self.writer.error if self.writer else None,
        }

    def _prepare(self) -> None:
        with self.engine.connect() as conn, store.write_begin(conn):
            store.lock_run(conn, self.run_id)
            others = conn.execute(
                text("SELECT COUNT(*) FROM worker WHERE run_id = :r AND status = 'running' AND heartbeat_at > :t"),
                {"r": self.run_id, "t": time.time() - get_settings().dead_worker_after_s},
            ).scalar_one()
            store.release_dead_claims(conn, self.run_id,
                                      stale_after_s=max(self.config.lease_s, get_settings().dead_worker_after_s))
            if not others:
                store.recount(conn, self.run_id)
            self.worker_id = store.register_worker(conn, self.run_id)
            if not self.join:
                # the settings themselves are the run's current config version (synthwatch.store.versions): a resume
                # never rewrites them; cap and concurrency are controls
                conn.execute(
                    text("UPDATE run SET desired = 'run', cap = :cap, concurrency = :c WHERE id = :r"),
                    {"cap": self.config.cap, "c": self.config.concurrency, "r": self.run_id},
                )
            version, stored = conn.execute(
                text("SELECT config_version, config_json FROM run WHERE id = :r"), {"r": self.run_id}).one()
            self.config_version = int(version or 1)
            try:
                differs = bool(versioned_changes(orjson.loads(stored), self.config.snapshot()))
            except (orjson.JSONDecodeError, TypeError):
                differs = False
            if differs:
                # the run's current config version is the truth every record is labelled with: a worker given
                # other settings (the CLI refuses or versions them first) generates under the stored ones
                log.warning("run %d: this worker's settings differ from the run's config version %d; using the"
                            " run's", self.run_id, self.config_version)
                self.config_version = -1  # adopted by the loop before its first claim
            store.add_event(conn, self.run_id, "worker_start", self.worker_id, actor="worker")
            store.set_status(conn, self.run_id, "running")

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()

        def on_signal(signame: str) -> None:
            if self.local_stop is None:
                log.warning("%s: stopping gracefully (in-flight requests finish); again to stop now", signame)
                self.local_stop = "stop"
            else:
                log.warning("%s: stopping now (in-flight requests go back to pending)", signame)
                self.local_stop = "stop_now"
            self._wake.set()

        for sig, name in ((signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal, name)

    async def main(self) -> str:
        """Run until the run completes, is stopped, or this worker is told to stop. Returns the state."""
        with tuned_for_worker():
            return await self._main()

    async def _main(self) -> str:
        await asyncio.to_thread(self._prepare)
        self.writer = Writer(
            self.engine, self.run_id, self.worker_id,
            flush_interval_s=self.config.flush_interval_ms / 1000, lease_s=self.config.lease_s,
            heartbeat_s=get_settings().worker_heartbeat_s, gauges=self._gauges, hooks=self.hooks,
            on_control=self._loop_wake,
        )
        self.writer.start()
        final = "failed"
        message: str | None = None
        try:
            async with Requester(
                connect_timeout_s=self.config.timeouts.connect_s,
                total_timeout_s=self.config.timeouts.total_s,
                idle_timeout_s=self.config.timeouts.idle_s,
                reasoning_mode=self.config.reasoning.mode,
                think_open=self.config.reasoning.think_open,
                think_close=self.config.reasoning.think_close,
                prefilled_open=self.config.reasoning.prefilled_open,
                limits=self.config.limits,
            ) as self.requester:
                helpers = [t for t in (self._start_scraper(), self._start_tuner()) if t is not None]
                try:
                    final, message = await self._loop()
                finally:
                    for task in helpers:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
        except Exception as exc:
            log.exception("worker failed")
            final, message = "failed", f"{exc.__class__.__name__}: {exc}"
        finally:
            await self._shutdown(final, message)
        return self._final or final

    async def _shutdown(self, final: str, message: str | None) -> None:
        if self.tasks:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        assert self.writer is not None
        writer = self.writer
        with contextlib.suppress(Exception):  # the writer may be gone; the lease then returns them
            await asyncio.shield(self._release_ready())

        def finish(conn: Any) -> None:
            conn.execute(text("UPDATE worker SET status = 'exited', heartbeat_at = :t WHERE id = :w"),
                         {"t": time.time(), "w": self.worker_id})
            others = conn.execute(
                text("SELECT COUNT(*) FROM worker WHERE run_id = :r AND status = 'running' AND id != :w"
                     " AND heartbeat_at > :t"),
                {"r": self.run_id, "w": self.worker_id, "t": time.time() - get_settings().dead_worker_after_s},
            ).scalar_one()
            store.add_event(conn, self.run_id, "worker_exit", f"{self.worker_id}:{final}", actor="worker")
            if not others or final == "completed":
                msg = message
                state = final
                if final == "completed" and self._done_why:
                    # the loop's snapshot of the counters can predate the last records' write, which this
                    # transaction follows: the counters now are the final ones (one snapshot for every number)
                    row = conn.execute(text("SELECT cap, n_ok, n_error, n_timeout FROM run WHERE id = :r"),
                                       {"r": self.run_id}).mappings().first()
                    if row is not None:
                        msg = self._finished_reason(dict(row), self._done_why)
                        if not row["n_ok"] and (row["n_error"] or row["n_timeout"]):
                            # a run in which every request failed is a failure, never a plain "completed"
                            state = self._final = "failed"
                            said = store.last_failure(conn, self.run_id)
                            msg = f"every request failed ({msg})" + (f"; the server said: {said}" if said else "")
                if state == "completed":
                    # a run that leaves open items (an alarm's failing records, quality/open_items.py) is never a
                    # plain "completed"
                    failing = completion_message(conn, self.run_id)
                    if failing:
                        msg = failing + (f" ({msg})" if msg else "")
                store.set_status(conn, self.run_id, state, msg)

        fut = writer.call(finish)
        # the status write must land even if we are being cancelled
        with contextlib.suppress(Exception):
            await asyncio.shield(asyncio.wrap_future(fut))
        await asyncio.to_thread(writer.stop)

    def _start_scraper(self) -> asyncio.Task[None] | None:
        """Scrape each endpoint's own /metrics while the run goes (config server_metrics)."""
        sm = self.config.server_metrics
        if not sm.enabled or self.writer is None:
            return None
        writer, run_id, worker_id = self.writer, self.run_id, self.worker_id

        def write(rows: list[dict[str, Any]]) -> None:
            if rows:
                writer.call(lambda conn: insert_rows(conn, run_id, worker_id, rows))

        self.scraper = Scraper(self.pool.endpoints, interval_s=sm.interval_s, timeout_s=sm.timeout_s, write=write)
        return asyncio.create_task(self.scraper.run(), name="synthwatch-server-metrics")

    def _start_tuner(self) -> asyncio.Task[None] | None:
        at = self.config.autotune
        if not at.enabled or self.join:
            return None
        return asyncio.create_task(self._tune(), name="synthwatch-autotune")

    async def _tune(self) -> None:
        """Self-tuning concurrency (workers/autotune.py), per endpoint: each endpoint has its own tuner and its own
        limit of requests at once (Endpoint.limit); the run's concurrency is their sum. One step per interval,
        each in the audit log naming the endpoint and the reason."""
        at = self.config.autotune
        start = max(at.min, min(at.max, at.start))
        eps = list(self.pool.endpoints)
        tuners = {ep.label: Tuner(start, at.min, at.max, gain=at.gain, latency_factor=at.latency_factor)
                  for ep in eps}
        for ep in eps:
            ep.limit = start
        total = start * len(eps)
        await asyncio.to_thread(store.apply_control, self.engine, self.run_id, "concurrency", total, "autotune",
                                f"self-tuning concurrency starts at {start} per endpoint (min {at.min}, max {at.max})"
                                + (f", {len(eps)} endpoints" if len(eps) > 1 else ""))
        last = {ep.label: (ep.n_timeouts, ep.limited, ep.n_server_errors) for ep in eps}
        scraped = self.scraper.preemptions if self.scraper is not None else {}
        preempted = {k: v.latest for k, v in scraped.items()}  # each server's preemption counter at the previous step
        while True:
            t0 = time.monotonic()
            for ep in eps:
                ep.outstanding_max = ep.outstanding
            await asyncio.sleep(at.interval_s)
            if self.state != "running":
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
                row = self.scraper.latest.get(ep.label) if self.scraper is not None else None
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
                log.info("run %d: concurrency %d (%s)", self.run_id, total, reason)
                await asyncio.to_thread(store.apply_control, self.engine, self.run_id, "concurrency", total,
                                        "autotune", reason[:2000])

    def _loop_wake(self) -> None:
        """Called from the writer thread when a claim is answered."""
        if self._loop_ref is not None:
            self._loop_ref.call_soon_threadsafe(self._wake.set)

    async def _loop(self) -> tuple[str, str | None]:
        assert self.writer is not None
        self._loop_ref = asyncio.get_running_loop()
        writer = self.writer
        claim_backoff = 0.0
        next_claim = 0.0
        last_tick = 0.0
        m_last = time.monotonic()
        paused_since: float | None = None
        free_since: float | None = None  # since when a slot has been free with no claim asked for it
        why = ""
        rate_t, rate_n = m_last, 0
        self._cap_seen = writer.control.get("cap")
        while True:
            if not writer.alive:
                return "failed", "the database writer stopped unexpectedly"
            fut = self._claim_fut
            if fut is not None and fut.done():
                # answered claims are always started, whatever the state: they are ours now
                self._claim_fut = None
                claimed, why = fut.result()
                self._start(claimed)
                if claimed and not why:
                    claim_backoff = 0.0
                else:
                    claim_backoff = min(max(claim_backoff * 2, 0.05), 0.5)
                    next_claim = m_last + claim_backoff
            ctl = writer.control
            version = ctl.get("config_version")
            if version is not None and version != self.config_version:
                await self._adopt_config(int(version))
            desired = self.local_stop or ctl.get("desired", "run")
            m = m_last = time.monotonic()
            if len(self.tasks) > self._inflight_max:
                self._inflight_max = len(self.tasks)
            if m - rate_t >= 0.25:
                inst = (self._n_done - rate_n) / (m - rate_t)
                self._rate = inst if self._rate == 0.0 else 0.5 * self._rate + 0.5 * inst
                rate_t, rate_n = m, self._n_done
            if self.ready and (desired != "run" or ctl.get("cap") != self._cap_seen):
                # the reserve is not ours to run any more (paused, stopping) or may exceed a new cap
                await self._release_ready()
            self._cap_seen = ctl.get("cap")
            if self.on_tick and m - last_tick >= 1.0:
                last_tick = m
                self.on_tick(self)
            if desired == "stop_now":
                self.state = "stopping"
                if self._claim_fut is not None:
                    claimed, why = await asyncio.wrap_future(self._claim_fut)
                    self._claim_fut = None
                    self.ready.extend(claimed)
                await self._release_ready()  # never started: back to pending with no attempt recorded
                for t in list(self.tasks):
                    t.cancel()
                if self.tasks:
                    await asyncio.gather(*self.tasks, return_exceptions=True)
                return "stopped", "stopped immediately; in-flight records returned to pending"
            if desired == "stop":
                if self.state != "stopping":
                    self.state = "stopping"
                    await self._set_status("stopping", f"stopping; {len(self.tasks)} in-flight requests finishing")
                if not self.tasks and self._claim_fut is None and not self.ready:
                    return "stopped", "stopped"
            elif desired == "pause":
                if self.state != "paused":
                    self.state = "paused"
                    paused_since = m
                    await self._set_paused(f"paused; {len(self.tasks)} in-flight requests finishing")
                elif paused_since is not None and not self.tasks:
                    paused_since = None
                    await self._set_paused("paused")
                    if self._hold and set(self._hold) <= TRANSPORT_RULES:
                        # every request fails (wrong model, URL, port): waiting for a resume with the same
                        # settings would do nothing; the terminal gets the server's own words and exit code 4
                        return "paused", self.pause_note
            else:
                if self.state != "running":
                    self.state = "running"
                    await self._set_status("running", None)
                if self._claim_fut is None and why in ("done", "cap_done") and not self.tasks and not self.ready:
                    self._done_why = why  # the message is written with the final counters (_shutdown)
                    return "completed", self._finished_reason(writer.control, why)
                conc = int(ctl.get("concurrency") or self.config.concurrency)
                if conc != self._slots:
                    self._slots = conc
                    self._fill()  # a raised concurrency starts reserved records at once
                # Claim in batches of at least a quarter of the concurrency: each claim is a write transaction
                # (~0.3-1 ms, mostly its commit), and one per finished request was most of the writer's work at
                # high request rates. When requests finish slowly (a real model: seconds each), a free slot waits
                # at most CLAIM_WAIT_S for the batch to fill. When they finish fast, a reserve of RESERVE_S of
                # completions is claimed ahead, in batches of half the reserve, so that claims are few and large
                # and a freed slot starts its next record without waiting for one.
                reserve = min(RESERVE_MAX, int(self._rate * RESERVE_S))
                if reserve < max(RESERVE_MIN, conc // 4):
                    reserve = 0
                batch = max(1, conc // 4, reserve // 2)
                have = len(self.tasks) + len(self.ready)
                want = conc + reserve - have
                if want <= 0:
                    free_since = None
                elif free_since is None:
                    free_since = m
                if self._claim_fut is None and not writer.error and m >= next_claim and want > 0:
                    # database unavailable (e.g. disk full): no new claims until writes succeed.
                    # The claim is not awaited: the loop keeps ticking (progress, controls) meanwhile.
                    if want >= batch or not have or m - (free_since or m) >= CLAIM_WAIT_S:
                        self._claim_fut = writer.claim(min(want, RESERVE_MAX))
                        self._claim_fut.add_done_callback(lambda _f: self._loop_wake())
                        free_since = None
                self._wake_at = conc + reserve - batch
            if self.state != "running":
                self._wake_at = 1 << 30  # pausing or stopping: every finished task matters
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self._wake.wait()

    def _start(self, claimed: list[store.Claimed]) -> None:
        self.ready.extend(claimed)
        self._fill()

    def _fill(self) -> None:
        """Start reserved records while slots are free (and the run is running)."""
        ready, tasks = self.ready, self.tasks
        if self.writer is not None:
            ctl = self.writer.control
            if ctl.get("cap") != self._cap_seen:
                return  # a new cap: the loop hands the reserve back and claims again under it
            if ctl.get("desired", "run") != "run":
                return  # paused (an alarm's auto-pause lands here at once) or stopping: nothing new starts
        while ready and len(tasks) < self._slots and self.state == "running":
            task = asyncio.create_task(self._process(ready.popleft()))
            tasks.add(task)
            task.add_done_callback(self._task_done)

    async def _release_ready(self) -> None:
        """Return claimed records that never started to pending (no attempt is recorded: none was made)."""
        if not self.ready or self.writer is None:
            return
        ids = [c.id for c in self.ready]
        self.ready.clear()
        writer = self.writer

        def release(conn: Any) -> int:  # runs in the writer thread, which alone counts claims
            moved = store.release_claims(conn, self.run_id, self.worker_id, ids)
            writer.claimed -= moved
            return moved

        await asyncio.wrap_future(self.writer.call(release))

    async def _adopt_config(self, version: int) -> None:
        """A new config version of the run: requests started from now on use it (running ones finish as they are)."""
        from ..config import ConfigError, build_config

        def load() -> Any:
            with self.engine.connect() as conn:
                row = conn.execute(text("SELECT config_json, config_version FROM run WHERE id = :r"),
                                   {"r": self.run_id}).first()
                conn.rollback()
            return row

        row = await asyncio.to_thread(load)
        if row is None:
            return
        try:
            cfg = orjson.loads(row[0])
            cfg["name"] = self.config.name
            # cap, concurrency and per-process settings stay this worker's (controls and process settings)
            for key in ("cap", "concurrency", "lease_s", "flush_interval_ms"):
                cfg[key] = getattr(self.config, key)
            new = build_config(cfg, f"config version {row[1]}")
        except (orjson.JSONDecodeError, ConfigError, TypeError) as exc:
            log.error("config version %s of run %d cannot be used (%s); staying on version %d",
                      row[1], self.run_id, exc, self.config_version)
            self.config_version = int(row[1] or version)  # do not retry it on every tick
            return
        old_endpoints = [e.model_dump() for e in self.config.endpoints]
        self.config = new
        self.config_version = int(row[1] or version)
        self._body_base = self._base_body()
        r, t = new.reasoning, new.timeouts
        req = self.requester
        req.mode, req.think_open, req.think_close, req.prefilled_open = (
            r.mode, r.think_open, r.think_close, r.prefilled_open)
        req.connect_timeout_s, req.total_timeout_s, req.idle_timeout_s = t.connect_s, t.total_s, t.idle_s
        if [e.model_dump() for e in new.endpoints] != old_endpoints:
            self.pool = EndpointPool(new.endpoints, new.pool)
        log.warning("run %d: now generating under config version %d", self.run_id, self.config_version)

    def _finished_reason(self, ctl: dict[str, Any], why: str) -> str:
        n_ok = ctl.get("n_ok") or 0
        if why == "cap_done":
            return f"cap of {ctl.get('cap')} ok records reached"
        return (f"all prompts processed: {n_ok} ok, {ctl.get('n_error', 0)} errors,"
                f" {ctl.get('n_timeout', 0)} timeouts")

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._n_done += 1
        if self.ready:
            self._fill()
        # wake the loop only when it has something to do: a batch to claim, or no task left
        if len(self.tasks) + len(self.ready) <= self._wake_at or not self.tasks:
            self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("record task failed: %r", task.exception())

    async def _set_paused(self, base: str) -> None:
        """The paused status, saying which alarm holds the run (read with the claim's gate)."""
        assert self.writer is not None

        def write(conn: Any) -> tuple[str, tuple[str, ...]]:
            reason, rules = store.pause_reason(conn, self.run_id)
            store.set_status(conn, self.run_id, "paused", f"{base}; {reason}" if reason else base)
            return reason, rules

        self.pause_note, self._hold = await asyncio.wrap_future(self.writer.call(write))

    async def _set_status(self, status: str, message: str | None) -> None:
        assert self.writer is not None
        fut = self.writer.call(lambda conn: store.set_status(conn, self.run_id, status, message))
        await asyncio.wrap_future(fut)
