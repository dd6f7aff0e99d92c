"""Nothing can leave a worker alive but stuck: its supervisor, and the deadlines of its stop.

Every part of a worker that runs on its own is watched: the writer thread and its checkpoint thread, the
server-metrics scraper and concurrency tuner tasks, each record's task, the metrics server's thread. Each is
meant to run until the worker stops, so when one ends early, with an exception or without, the worker fails at
once: one log line names the part and the exception's class, the worker's loop is cancelled (whatever it was
waiting for), in-flight requests are interrupted, claims go back to pending (in a short transaction of the
worker's own after the writer's end, whether it flushed or died: :func:`release_directly`) and the process
exits 1.

A stop has deadlines. After the first SIGTERM or SIGINT, in-flight requests have the grace period
(``shutdown_grace_s``) to finish; then they are interrupted, and interrupting them, handing their records back and
the last flush have ``STOP_MARGIN_S``. A second signal leaves ``HURRY_S`` for handing claims back. A part that died
leaves ``FAILED_EXIT_S``. Whatever is still running when a deadline passes (a database that does not answer, a
thread that does not end), the process exits there and then (only the `synthwatch` program itself: see
``hard_exit``); claims it still holds go back to pending when the run is started again (a worker on the same host
whose process is gone is noticed at once) or, for other workers, when their lease ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..quality.detection.open_items import completion_message
from ..redact import redact
from ..settings import get_settings
from ..store import queue as store
from .results import Outcome

log = logging.getLogger("synthwatch.worker")
T = TypeVar("T")

STOP_MARGIN_S = 5.0  # after the grace period: interrupting in-flight requests, releasing claims, the last flush
HURRY_S = 2.0  # after a second signal
FAILED_EXIT_S = 10.0  # after a part of the worker died
WATCH_EVERY_S = 0.1  # how often the supervisor looks at the threads it watches
WRITER_POLL_S = 0.25  # how often a wait for the writer checks that its thread is still there


class WriterGone(RuntimeError):
    """The writer thread ended without answering."""


# ------------------------------------------------------------------ threads' exceptions

_watched: dict[threading.Thread, Supervisor] = {}
_previous_hook: Callable[[Any], Any] | None = None


def _excepthook(args: Any) -> None:
    """threading.excepthook while a supervisor watches threads: a watched thread's exception is its supervisor's
    (reported as one line); any other thread's goes to the hook that was there before."""
    sup = _watched.get(args.thread) if args.thread is not None else None
    if sup is None:
        (_previous_hook or threading.__excepthook__)(args)
        return
    sup.died[args.thread] = args.exc_value if args.exc_value is not None else args.exc_type()


def describe(part: str, exc: BaseException | None) -> str:
    if exc is None:
        return f"{part} ended unexpectedly"
    text = redact(str(exc))[:300]
    return f"{part} died ({exc.__class__.__name__}{': ' + text if text else ''})"


class Supervisor:
    """Watches a worker's threads and tasks; ``on_failure(why)`` is called once, on the event loop, when one ends.

    ``hard_exit``: the process itself may be ended when a stop overruns its deadline (the `synthwatch` program:
    never when a worker runs inside another program, such as a test)."""

    def __init__(self, on_failure: Callable[[str], None], *, hard_exit: bool = False) -> None:
        self.on_failure = on_failure
        self.hard_exit = hard_exit
        self.failure: str | None = None
        self.closing = False  # the worker is stopping: its threads' end is expected, failures are only logged
        self.died: dict[threading.Thread, BaseException] = {}  # filled by the excepthook, in the dying thread
        self._threads: dict[threading.Thread, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._timer: threading.Timer | None = None
        self._timer_at = float("inf")

    # -------------------------------------------------------------- watching

    def start(self) -> None:
        global _previous_hook
        if threading.excepthook is not _excepthook:
            _previous_hook, threading.excepthook = threading.excepthook, _excepthook
        self._task = asyncio.create_task(self._watch(), name="synthwatch-supervisor")

    def watch_thread(self, thread: threading.Thread, part: str) -> None:
        """Watch a thread that is to run until the worker stops. It must have been started (its start() has
        returned): a thread between start() and its run says is_alive() False, as an ended one does."""
        if thread.ident is None:
            raise ValueError(f"{part}: a thread is watched once it has started")
        self._threads[thread] = part
        _watched[thread] = self

    def watch_task(self, task: asyncio.Task[Any], part: str) -> None:
        """Watch a task that is to run until the worker cancels it."""

        def done(t: asyncio.Task[Any]) -> None:
            if t.cancelled():
                return
            self.fail(describe(part, t.exception()))

        task.add_done_callback(done)

    def fail(self, why: str) -> None:
        """A part of the worker failed (call on the event loop): the worker stops, once."""
        if self.closing:
            log.error("while stopping: %s", why)
            return
        if self.failure is not None:
            return
        self.failure = why
        self.deadline(FAILED_EXIT_S, 1, "stopping after a failure")
        self.on_failure(why)

    def scan(self) -> None:
        """Look at the watched threads now (the supervisor's task does every WATCH_EVERY_S)."""
        ended = [t for t in self._threads if not t.is_alive()]
        # one that died of an exception first: a thread that ended because another died (the writer's checkpoint
        # thread) must not be reported, without a cause, in place of the one that did
        ended.sort(key=lambda t: t not in self.died)
        for thread in ended:
            part = self._threads.pop(thread)
            if self.closing:
                continue  # expected now
            exc = self.died.get(thread)
            if exc is not None:
                log.debug("%s", part, exc_info=(type(exc), exc, exc.__traceback__))
            self.fail(describe(part, exc))

    async def _watch(self) -> None:
        try:
            while True:
                self.scan()
                await asyncio.sleep(WATCH_EVERY_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the watcher itself: a bug here must stop the worker too, not blind it
            self.fail(describe("the supervisor", exc))

    def crashed(self, thread: threading.Thread) -> BaseException | None:
        """The exception a watched thread died of, if it did."""
        return self.died.get(thread)

    async def close(self) -> None:
        """End watching (the worker has stopped); restore the thread excepthook when no supervisor is left."""
        global _previous_hook
        self.closing = True
        # a thread still ending (the writer's, after a crash) stays ours: its exception is reported already
        for thread in [t for t, sup in _watched.items() if not t.is_alive() and (sup is self or t.ident)]:
            del _watched[thread]
        self._threads.clear()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not _watched and threading.excepthook is _excepthook:
            threading.excepthook = _previous_hook or threading.__excepthook__
            _previous_hook = None

    # -------------------------------------------------------------- deadlines

    def deadline(self, after_s: float, code: int, what: str) -> None:
        """The process ends ``after_s`` from now with ``code`` if it is still running (``hard_exit`` only); an
        earlier deadline already set stays."""
        if not self.hard_exit:
            return
        at = time.monotonic() + after_s
        if at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = threading.Timer(after_s, _exit_now, (code, f"{what}: not finished within {after_s:g} s"))
        self._timer.name = "synthwatch-deadline"
        self._timer.daemon = True
        self._timer.start()


def _exit_now(code: int, why: str) -> None:
    """The last resort of a stop that overran its deadline: the process ends here, whatever still runs."""
    with contextlib.suppress(Exception):
        log.error("%s; exiting now (exit code %d). Claims still held go back to pending when the run is started"
                  " again", why, code)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# ------------------------------------------------------------------ waiting without hanging


async def writer_result(writer: Any, fut: concurrent.futures.Future[T], timeout_s: float | None = None) -> T:
    """The result of a writer call or claim, waited for without hanging on a writer thread that has died
    (:class:`WriterGone`) and, with ``timeout_s``, no longer than that (TimeoutError).

    Never cancels ``fut``, not even when the caller is cancelled: the writer answers every future it takes, and
    answering a cancelled one raises InvalidStateError in the writer thread, which would end it."""
    afut = asyncio.wrap_future(fut)
    loop = asyncio.get_running_loop()
    end = None if timeout_s is None else loop.time() + timeout_s
    while True:
        wait = WRITER_POLL_S if end is None else max(0.0, min(WRITER_POLL_S, end - loop.time()))
        done, _ = await asyncio.wait({afut}, timeout=wait)
        if done:
            return afut.result()
        if not writer.alive:
            await asyncio.sleep(0)  # an answer given as the thread ended is on its way to afut
            if afut.done():
                return afut.result()
            raise WriterGone("the database writer thread has ended")
        if end is not None and loop.time() >= end:
            raise TimeoutError


async def in_daemon_thread(fn: Callable[[], T], timeout_s: float, name: str) -> T:
    """fn() in a daemon thread of its own, waited for at most timeout_s (TimeoutError). Unlike
    asyncio.to_thread, a call that never returns neither keeps the event loop's executor from closing nor the
    interpreter from exiting."""
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():  # cancelled before it began: a running one cannot be
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)


# ------------------------------------------------------------------ releasing claims without the writer


def interrupted_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """The interrupted records' attempt history, as store.release_worker takes it."""
    return [{"id": o.record_id, "attempts": len(o.attempts) + o.prior_attempts,
             "attempts_json": orjson.dumps(o.attempts).decode() if o.attempts else None,
             "error_kind": o.error_kind, "error": o.error} for o in outcomes]


def release_directly(engine: Engine, run_id: int, worker_id: int, interrupted: list[Outcome],
                     finish: Callable[[Connection], None]) -> int:
    """Every claim this worker still holds back to pending, in one short transaction on a connection of its own
    (after its writer thread ended, flushed or dead): ``interrupted``, the records whose request was cut short,
    with their attempt recorded (when the writer could not write them), the others (never started, answered while
    stopping, or finished with a result a dead writer never wrote) as they were. Then, in a second transaction,
    ``finish(conn)`` (the worker's exit, the run's status). Returns how many records went back."""
    with engine.connect() as conn:
        with store.write_begin(conn):
            store.lock_run(conn, run_id)
            moved = store.release_worker(conn, run_id, worker_id, interrupted_rows(interrupted))
        try:  # a transaction of its own: whatever fails here cannot undo the release
            with store.write_begin(conn):
                finish(conn)
        except Exception as exc:
            log.error("the worker's end could not be recorded (%s: %s)", exc.__class__.__name__, exc)
    return moved


def finished_reason(ctl: dict[str, Any], why: str) -> str:
    """A completed run's closing words, from its counters ("cap_done": the cap was reached)."""
    n_ok = ctl.get("n_ok") or 0
    if why == "cap_done":
        return f"cap of {ctl.get('cap')} ok records reached"
    return f"all prompts processed: {n_ok} ok, {ctl.get('n_error', 0)} errors, {ctl.get('n_timeout', 0)} timeouts"


def write_exit(conn: Connection, run_id: int, worker_id: int, final: str, message: str | None,
               reason: Callable[[dict[str, Any]], str] | None = None) -> str:
    """The worker's exit and, when no other worker runs the run (or it completed), the run's final status; returns
    the state stored ("failed" for a completed run in which every request failed). ``reason``: the completed run's
    message from its final counters (the loop's snapshot of them can predate the last records' write, which this
    transaction follows: one snapshot for every number)."""
    t = time.time()
    conn.execute(text("UPDATE worker SET status = 'exited', heartbeat_at = :t WHERE id = :w"), {"t": t, "w": worker_id})
    others = conn.execute(
        text("SELECT COUNT(*) FROM worker WHERE run_id = :r AND status = 'running' AND id != :w AND heartbeat_at > :t"),
        {"r": run_id, "w": worker_id, "t": t - get_settings().dead_worker_after_s},
    ).scalar_one()
    store.add_event(conn, run_id, "worker_exit", f"{worker_id}:{final}", actor="worker")
    if others and final != "completed":
        return final
    msg = message
    state = final
    if final == "completed" and reason is not None:
        row = conn.execute(text("SELECT cap, n_ok, n_error, n_timeout FROM run WHERE id = :r"),
                           {"r": run_id}).mappings().first()
        if row is not None:
            msg = reason(dict(row))
            if not row["n_ok"] and (row["n_error"] or row["n_timeout"]):
                # a run in which every request failed is a failure, never a plain "completed"
                state = "failed"
                said = store.last_failure(conn, run_id)
                msg = f"every request failed ({msg})" + (f"; the server said: {said}" if said else "")
    if state == "completed":
        # a run that leaves open items (an alarm's failing records, quality/detection/open_items.py) is never plain "completed"
        failing = completion_message(conn, run_id)
        if failing:
            msg = failing + (f" ({msg})" if msg else "")
    store.set_status(conn, run_id, state, msg)
    return state
