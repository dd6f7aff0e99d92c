"""The generation worker: claims prompts from the database queue and runs them against endpoints.

Concurrency is a live number read from the run row (changeable while running). Each claimed
record runs in its own task (workers/record.py) that turns every attempt into an AttemptResult,
retries transient faults with exponential backoff and jitter, and hands one Outcome to the writer.
Graceful stop: no new claims, in-flight requests finish, the writer flushes; after a signal, within
the grace period (``shutdown_grace_s``), after which they are interrupted. Interrupting a request
(grace over, immediate stop, second signal, the worker failing) is recorded on its record, which
goes back to pending. Every part of the worker is supervised (workers/supervisor.py): one that dies
stops the worker, whose claims go back to pending, and the process exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from ..quality.detection.alarms import TRANSPORT_RULES
from ..quality.inflight import run_rules
from ..quality.token_checks import think_ids
from ..settings import get_settings
from ..store import queue as store
from ..store.versions import versioned_changes
from .autotune import tune
from .client import Requester
from .endpoints import EndpointPool
from .gc_tuning import tuned_for_worker
from .inflight import StreamBoard, cancel_running, pause_cancels, start_publisher
from .record import RecordTasks
from .results import LiveStats, Outcome
from .server_metrics import Scraper, insert_rows
from .supervisor import (
    HURRY_S,
    STOP_MARGIN_S,
    Supervisor,
    describe,
    finished_reason,
    in_daemon_thread,
    release_directly,
    write_exit,
    writer_result,
)
from .writer import Writer, WriterHook

log = logging.getLogger("synthwatch.worker")

# The `synthwatch run` exit code of each way a worker ends (2 is the CLI's, for bad input). "failed": a part of the
# worker died (the writer thread, a helper task, ...) or its loop raised; the log's line names it, its claims went
# back to pending, and running the same command again resumes the run.
EXIT_CODES = {"completed": 0, "failed": 1, "stopped": 3, "paused": 4}
STEP_S = 3.0  # the longest interrupted record tasks may take to end (cancelling them is immediate unless a bug)
# the longest the writer's last flush may take before claims are returned without it, and the worker's own last
# transaction (after a signal or a failure the program's deadline comes first: workers/supervisor.py)
FLUSH_S = 30.0
FINAL_S = 10.0
CLAIM_WAIT_S = 0.05  # longest a free slot waits for a batch of free slots before it is claimed alone
# At high completion rates the worker claims this much work (in seconds of completions) ahead of its free
# slots: each claim is a write transaction with a fixed cost, and claims of a few records at thousands of
# completions per second were a third of the writer's work. Below RESERVE_MIN records it claims only for
# free slots, so that a run against a real model (seconds per request) holds no more than it runs.
RESERVE_S = 0.1
RESERVE_MIN = 32
RESERVE_MAX = 1024


class RunWorker:
    """One worker of a run. ``hard_exit``: this is the `synthwatch` program itself, whose process may be ended
    when stopping overruns its deadline (never a worker inside another program, such as a test)."""

    requester: Requester  # while main() runs

    def __init__(
        self,
        engine: Engine,
        run_id: int,
        config: RunConfig,
        *,
        join: bool = False,
        hooks: list[WriterHook] | None = None,
        on_tick: Callable[[RunWorker], None] | None = None,
        hard_exit: bool = False,
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
        self.stop_reason = ""  # why requests cancelled now were interrupted (recorded on their attempts)
        self.interrupted: list[Outcome] = []  # interrupted records' outcomes, for a release without the writer
        self.records = RecordTasks(self)
        self.streams = StreamBoard(None, lambda _v: None)  # the writer's board from main() on
        self.supervisor = Supervisor(self._failed, hard_exit=hard_exit)
        self._abort: tuple[str, str] | None = None  # (final state, message) when the loop was cut short
        self._loop_task: asyncio.Task[tuple[str, str | None]] | None = None
        self._done_why = ""  # why the run completed ("done", "cap_done"), for its final message
        self.pause_note = ""  # why the run is paused when an alarm holds it (the terminal prints it)
        self._hold: tuple[str, ...] = ()  # the rules of the alarms that hold the paused run
        self._final = ""  # the state _shutdown stored when it differs from the loop's (every request failed)
        self.state = "running"
        self.worker_id = 0
        self.writer: Writer | None = None
        self._body_base = self.config.request_body_base()
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

    def body_for(self, messages: list[dict[str, Any]] | dict[str, Any], sample_index: int = 0, n: int = 1) -> bytes:
        body = dict(self._body_base)
        seed = self.config.sample_seed(sample_index)
        if seed is not None:  # samples_per_prompt > 1: each sample of a prompt asks with its own seed
            body["seed"] = seed
        if n > 1:  # samples_in_one_request: n samples of a prompt, from sample_index on, in one request
            body["n"] = n
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
        for sig, name in ((signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.on_signal, name)

    def on_signal(self, signame: str) -> None:
        """SIGTERM / SIGINT: the first stops claiming and gives in-flight requests the grace period; the second
        stops at once (the loop is cancelled whatever it waits for; claims go back to pending, best effort)."""
        if self.local_stop is None:
            grace = self.config.shutdown_grace_s
            log.warning("%s: stopping gracefully (in-flight requests have %g s to finish); again to stop now",
                        signame, grace)
            self.local_stop = "stop"
            # a timer, not a check in the loop: the loop may be waiting for the writer when the grace ends
            asyncio.get_running_loop().call_later(grace, self._grace_over, signame, grace)
            self.supervisor.deadline(grace + STOP_MARGIN_S, EXIT_CODES["stopped"], f"{signame}: stopping")
        else:
            log.warning("%s: stopping now (in-flight requests go back to pending)", signame)
            self.local_stop = "stop_now"
            self.stop_reason = self.stop_reason or f"interrupted by a second {signame}"
            self._cut_loop("stopped", "stopped immediately; in-flight records returned to pending")
            self.supervisor.deadline(HURRY_S, EXIT_CODES[self._abort[0] if self._abort else "stopped"],
                                     f"{signame} again: stopping now")
        self._wake.set()

    def _grace_over(self, signame: str, grace: float) -> None:
        if self._loop_task is None or self._loop_task.done():
            return  # stopped within the grace period
        n = len(self.tasks)
        log.warning("%s: the grace period of %g s is over; interrupting %d in-flight requests", signame, grace, n)
        self.stop_reason = self.stop_reason or f"interrupted: the grace period of {grace:g} s after {signame} ran out"
        self._cut_loop("stopped", f"stopped: {n} in-flight requests interrupted after the grace period of {grace:g} s,"
                                  " their records returned to pending")

    def _failed(self, why: str) -> None:
        """The supervisor's report that a part of the worker died (on the event loop)."""
        log.error("worker stopping: %s; in-flight requests are interrupted and every claim goes back to pending"
                  " (exit code %d)", why, EXIT_CODES["failed"])
        self.stop_reason = f"interrupted: the worker stopped ({why})"
        self._abort = ("failed", why)  # whatever stop was under way: the outcome is this failure
        self._cut_loop("failed", why)

    def _cut_loop(self, final: str, message: str) -> None:
        if self._abort is None:
            self._abort = (final, message)
        if self._loop_task is not None and not self._loop_task.done():
            self._loop_task.cancel()
        self._wake.set()

    async def main(self) -> str:
        """Run until the run completes, is stopped, or this worker is told to stop. Returns the state."""
        with tuned_for_worker():
            return await self._main()

    async def _main(self) -> str:
        await asyncio.to_thread(self._prepare)
        cfg = self.config
        think = await asyncio.to_thread(  # loading a tokenizer takes seconds: off the loop
            think_ids, cfg.tokenizer.model_dump() if cfg.tokenizer else None, cfg.reasoning.think_open,
            cfg.reasoning.think_close, cfg.request_token_ids)
        self.writer = Writer(
            self.engine, self.run_id, self.worker_id,
            flush_interval_s=self.config.flush_interval_ms / 1000, lease_s=self.config.lease_s,
            heartbeat_s=get_settings().worker_heartbeat_s, gauges=self._gauges, hooks=self.hooks,
            on_control=self._loop_wake,
        )
        self.writer.whole_prompts = self.config.samples_in_one_request and self.config.samples_per_prompt > 1
        self.writer.start()
        judged = run_rules(cfg) if get_settings().inflight_checks else None  # inflight_checks: the switch
        self.streams = StreamBoard.for_writer(judged, self.writer, self.hooks)
        sup = self.supervisor
        for part, thread in self.writer.threads.items():
            sup.watch_thread(thread, f"the {part}")
        sup.start()
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
                think_ids=think,
            ) as self.requester:
                helpers = [t for t in (self._start_scraper(), self._start_tuner(), start_publisher(self))
                           if t is not None]
                self._loop_task = asyncio.create_task(self._loop(), name="synthwatch-loop")
                try:
                    final, message = await self._loop_task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if self._abort is None or (current is not None and current.cancelling()):
                        raise  # the worker itself is being cancelled
                    final, message = self._abort
                finally:
                    await self._interrupt()  # while the HTTP session is still open: no request fails for its close
                    for task in helpers:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                    if self._abort is not None and self._abort[0] == "failed":
                        final, message = self._abort  # a part died as the loop ended: that is the outcome
        except Exception as exc:
            why = describe("the worker's loop", exc)
            log.error("worker failed: %s", why)
            log.debug("worker failed", exc_info=True)
            final, message = "failed", why
        finally:
            try:
                await self._shutdown(final, message)
                await self._close_hooks()
            finally:
                await sup.close()  # a deadline armed stays: the program must still end in time
        return self._final or final

    async def _close_hooks(self) -> None:
        """Hooks with work of their own (the extended checks, #30) drain within their grace, after the records are
        written and the claims returned; what they leave stays pending and re-checkable."""
        for hook in self.hooks:
            close = getattr(hook, "close", None)
            if close is not None:
                try:
                    await asyncio.to_thread(close)
                except Exception as exc:
                    log.warning("a writer hook did not close cleanly: %s", describe("closing", exc))

    async def _interrupt(self) -> None:
        """Cancel the requests still running: each record's task records its attempt as interrupted and hands
        the record back to pending (synthwatch.workers.record)."""
        tasks = list(self.tasks)
        if not tasks:
            return
        if not self.stop_reason:
            self.stop_reason = "interrupted: the worker stopped"
        for t in tasks:
            t.cancel()
        _, pending = await asyncio.wait(tasks, timeout=STEP_S)
        if pending:
            log.error("%d record tasks did not end when interrupted; their records return to pending", len(pending))

    async def _shutdown(self, final: str, message: str | None) -> None:
        """The writer flushes what it has and ends; then one short transaction of the worker's own hands back
        every claim still held (records never started, claims answered while stopping, and, when the writer died
        or did not finish, every record it did not write: the interrupted ones with their attempt recorded) and
        writes the worker's and the run's end. Each wait is bounded."""
        assert self.writer is not None
        writer = self.writer
        sup = self.supervisor
        sup.closing = True  # the writer's end is expected from here
        await self._interrupt()  # tasks started after the loop's end (none, unless a claim came back late)
        self.ready.clear()  # never started: the release below returns them untouched
        if writer.alive:
            try:
                await in_daemon_thread(lambda: writer.stop(FLUSH_S), FLUSH_S + 1, "synthwatch-stop")
            except Exception as exc:
                log.warning("the writer did not finish its last flush (%s: %s)", exc.__class__.__name__, exc)
        wrote = not writer.alive and not sup.crashed(writer.threads["database writer thread"])
        try:
            moved = await in_daemon_thread(
                lambda: release_directly(self.engine, self.run_id, self.worker_id, [] if wrote else self.interrupted,
                                         lambda conn: self._finish(conn, final, message)),
                FINAL_S, "synthwatch-release")
        except Exception as exc:
            log.error("claims could not be returned to pending (%s); they return when the run is started again",
                      describe("the release", exc))
            return
        if moved and not wrote:
            log.warning("without the writer: %d claimed records returned to pending", moved)
        elif moved:
            log.info("%d claimed records not started returned to pending", moved)

    def _finish(self, conn: Any, final: str, message: str | None) -> None:
        reason = (lambda row: finished_reason(row, self._done_why)) if self._done_why else None
        state = write_exit(conn, self.run_id, self.worker_id, final, message, reason)
        if state != final:
            self._final = state  # every request failed: the run failed

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
        task = asyncio.create_task(self.scraper.run(), name="synthwatch-server-metrics")
        self.supervisor.watch_task(task, "the server-metrics scraper task")
        return task

    def _start_tuner(self) -> asyncio.Task[None] | None:
        at = self.config.autotune
        if not at.enabled or self.join:
            return None
        task = asyncio.create_task(tune(self), name="synthwatch-autotune")
        self.supervisor.watch_task(task, "the concurrency tuner task")
        return task

    def _loop_wake(self) -> None:
        """Called from the writer thread when a claim is answered."""
        if self._loop_ref is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the worker is gone
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
            if self._abort is not None:
                return self._abort
            if not writer.alive:  # seen before the supervisor's next look: it says which thread and why
                self.supervisor.scan()
                return self._abort or ("failed", "the database writer thread ended unexpectedly")
            fut = self._claim_fut
            if fut is not None and fut.done():
                # answered claims are always started, whatever the state: they are ours now
                self._claim_fut = None
                if fut.exception() is not None:  # only a writer that died fails a claim (a busy database is retried)
                    self.supervisor.fail(describe("the database writer thread", fut.exception()))
                    continue
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
            if desired == "stop_now":  # the run's control (a signal's second stop cuts the loop short instead)
                self.state = "stopping"
                self.stop_reason = self.stop_reason or "interrupted by an immediate stop"
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
                    cancel = pause_cancels(ctl.get("pause_in_flight"), self._hold) if self.tasks else None
                    if cancel is not None:  # the requests in flight are cancelled, back to pending (#36)
                        n = await cancel_running(self, cancel, STEP_S)
                        await self._set_paused(f"paused; {n} in-flight requests cancelled")
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
                    return "completed", finished_reason(writer.control, why)
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
            if ctl.get("desired", "run") != "run" or self.local_stop is not None:
                return  # paused (an alarm's auto-pause lands here at once) or stopping: nothing new starts
        group = self.config.samples_in_one_request and self.config.samples_per_prompt > 1
        while ready and len(tasks) < self._slots and self.state == "running":
            first = ready.popleft()
            if group and first.n_turns == 1 and first.prompt_idx >= 0:
                # the prompt's other claimed samples (next in the reserve) go with it, as one request with n = k
                batch = [first]
                while ready and ready[0].prompt_idx == first.prompt_idx and ready[0].n_turns == 1:
                    batch.append(ready.popleft())
                if len(batch) > 1:
                    task = asyncio.create_task(self.records.process_group(batch))
                    tasks.add(task)
                    task.add_done_callback(self._task_done)
                    continue
            task = asyncio.create_task(self.records.process(first))
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

        await writer_result(writer, writer.call(release))

    async def _adopt_config(self, version: int) -> None:
        """A new config version of the run: requests started from now on use it (running ones finish as they are)."""
        from ..config import ConfigError
        from ..store.versions import worker_config

        def load() -> tuple[RunConfig, int] | None:
            with self.engine.connect() as conn:
                try:
                    return worker_config(conn, self.run_id, self.config)
                finally:
                    conn.rollback()

        try:
            got = await asyncio.to_thread(load)
        except (orjson.JSONDecodeError, ConfigError, TypeError) as exc:
            log.error("config version %s of run %d cannot be used (%s); staying on version %d",
                      version, self.run_id, exc, self.config_version)
            self.config_version = version  # do not retry it on every tick
            return
        if got is None:
            return
        new, stored_version = got
        old_endpoints = [e.model_dump() for e in self.config.endpoints]
        self.config = new
        self.config_version = stored_version or version
        self._body_base = self.config.request_body_base()
        r, t = new.reasoning, new.timeouts
        req = self.requester
        req.mode, req.think_open, req.think_close, req.prefilled_open = (
            r.mode, r.think_open, r.think_close, r.prefilled_open)
        req.connect_timeout_s, req.total_timeout_s, req.idle_timeout_s = t.connect_s, t.total_s, t.idle_s
        if [e.model_dump() for e in new.endpoints] != old_endpoints:
            self.pool = EndpointPool(new.endpoints, new.pool)
        log.warning("run %d: now generating under config version %d", self.run_id, self.config_version)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._n_done += 1
        if self.ready:
            self._fill()
        # wake the loop only when it has something to do: a batch to claim, or no task left
        if len(self.tasks) + len(self.ready) <= self._wake_at or not self.tasks:
            self._wake.set()
        if not task.cancelled() and task.exception() is not None:  # a bug: nothing is to escape a record's task
            self.supervisor.fail(describe("a record's task", task.exception()))

    async def _set_paused(self, base: str) -> None:
        """The paused status, saying which alarm holds the run (read with the claim's gate)."""
        assert self.writer is not None

        def write(conn: Any) -> tuple[str, tuple[str, ...]]:
            reason, rules = store.pause_reason(conn, self.run_id)
            store.set_status(conn, self.run_id, "paused", f"{base}; {reason}" if reason else base)
            return reason, rules

        self.pause_note, self._hold = await writer_result(self.writer, self.writer.call(write))

    async def _set_status(self, status: str, message: str | None) -> None:
        assert self.writer is not None
        fut = self.writer.call(lambda conn: store.set_status(conn, self.run_id, status, message))
        await writer_result(self.writer, fut)
