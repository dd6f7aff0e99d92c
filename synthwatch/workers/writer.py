"""The single writer: every database write of a worker goes through one thread and one connection.

Results, failed attempts, claims and status changes are queued by the asyncio side and applied
in batched transactions (``BEGIN IMMEDIATE`` on SQLite). A commit that fails with a transient error (locked
database, full disk, lost connection: workers/refusals.py) keeps the batch in memory and retries it, showing
"writes stalled" so the worker pauses; nothing queued is dropped. A permanent error is never retried: the batch
is written again record by record (workers/record_writes.py) and each record the store refuses becomes that
record's error (kind ``store_refused``) while the rest commits. The time series is accumulated here as records
arrive (workers/series.py: once per record, however often a flush is retried) and upserted per bucket.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..quality import detection  # noqa: F401  - registers the claim's alarm gate with the store (#35)
from ..settings import get_settings
from ..store import queue as store
from ..store import rows as store_rows
from . import faults, long_texts
from .record_writes import RecordWrites
from .refusals import describe_stall, is_transient, refusal_reason, refuse, storable_text, value_class
from .results import AttemptFailure, Outcome
from .series import Bucket, SeriesAccumulator

log = logging.getLogger("synthwatch.writer")
CHECKPOINT_EVERY_S = 1.0
# Finished records are checked at least this often, before their flush: a check whose alarm pauses the run
# then pauses it before this worker's next claim, whatever the request rate (a flush interval at thousands of
# records per second let hundreds more records through).
CHECK_EVERY_S = 0.02
WAKE_AT_RESULTS = 2000  # finished records that wake the writer before its flush interval is up
MAX_BATCH = 5000  # queued items taken into one write transaction

class WriterHook(Protocol):
    """Extension point (data-quality checks): runs in the writer thread."""

    def on_outcomes(self, outcomes: list[Outcome]) -> None: ...

    def on_flush(self, conn: Connection, t: float) -> None: ...

    def pause_due(self) -> bool: ...

    def take_paused(self) -> bool: ...

    # optional: after_commit() once a flush's transaction committed (the extended checks queue its records then,
    # so they never read a record before it is stored); close(grace_s) when the worker shuts down


class Writer:
    def __init__(
        self,
        engine: Engine,
        run_id: int,
        worker_id: int,
        *,
        flush_interval_s: float = 0.2,
        lease_s: float = 30.0,
        heartbeat_s: float = 1.0,
        control_interval_s: float = 0.25,
        gauges: Callable[[], tuple[int, int, dict[str, int], dict[str, Any]]] | None = None,
        hooks: list[WriterHook] | None = None,
        on_control: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.run_id = run_id
        self.worker_id = worker_id
        self.whole_prompts = False  # samples_in_one_request: a claim takes the rest of its last prompt's samples
        self.flush_interval_s = flush_interval_s
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s
        self.control_interval_s = control_interval_s
        self.gauges = gauges
        self.hooks = hooks or []
        for hook in self.hooks:  # the checks hook tells its own records from other workers' (quality.detection)
            if hasattr(hook, "worker_id"):
                hook.worker_id = worker_id
        self.on_control = on_control  # told (from the writer thread) when the control changed under it
        self.q: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Finished records and failed attempts wait here without waking the thread: a wake per record (a
        # futex wake, two context switches and a GIL handover on the worker's one core) cost about as much
        # as writing the record. Claims, calls and stops go through q, which wakes it at once.
        self._results: deque[tuple[Any, ...]] = deque()
        self.control: dict[str, Any] = {}
        self.error: str | None = None  # last write failure, None when healthy
        self.written = 0
        self.claimed = 0
        self._thread = threading.Thread(target=self._run, name="synthwatch-writer", daemon=True)
        self._stop = threading.Event()
        self.series = SeriesAccumulator(run_id, worker_id)
        self._touched: dict[tuple[str, int], Bucket] = {}  # series buckets changed since the last flush
        self.records = RecordWrites(run_id, worker_id)
        # long texts go into the store in pieces from a spool file (workers/long_texts.py)
        self.spool_over_chars = get_settings().long_text_spool_chars
        self.spool_dir = long_texts.spool_dir_of(engine)
        self._crashed: BaseException | None = None
        self._control_event = threading.Event()
        self._conn: Connection | None = None  # the writer thread's own connection (_write_conn)
        self._ckpt_stop = threading.Event()
        self._ckpt_thread: threading.Thread | None = None
        if engine.dialect.name == "sqlite":
            self._ckpt_thread = threading.Thread(target=self._checkpoints, name="synthwatch-checkpoint", daemon=True)

    # ------------------------------------------------------------ API (any thread)

    def start(self) -> None:
        """Start the writer's threads. Both are running when this returns (Thread.start waits for that): a
        supervisor that looks at them from another thread never sees one between its start and its run, where
        is_alive() says False (it once took the checkpoint thread's start for its end and stopped the worker)."""
        self._read_control()
        self._thread.start()
        if self._ckpt_thread is not None:
            self._ckpt_thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def threads(self) -> dict[str, threading.Thread]:
        """This writer's threads by what they do, for the worker's supervisor (synthwatch.workers.supervisor)."""
        threads = {"database writer thread": self._thread}
        if self._ckpt_thread is not None:
            threads["WAL checkpoint thread"] = self._ckpt_thread
        return threads

    def submit(self, outcome: Outcome) -> None:
        self._add_result(("o", outcome))

    def submit_failure(self, failure: AttemptFailure) -> None:
        self._add_result(("f", failure))

    def _add_result(self, item: tuple[Any, ...]) -> None:
        self._results.append(item)
        if len(self._results) == WAKE_AT_RESULTS:
            self.q.put(("w",))

    def claim(self, n: int) -> Future[tuple[list[store.Claimed], str]]:
        fut: Future[tuple[list[store.Claimed], str]] = Future()
        self.q.put(("c", n, fut))
        return fut

    def submit_turn(self, outcome: Outcome) -> None:
        """A stored earlier turn (status "turn"), for the time series only: its tokens and timing."""
        self._add_result(("s", outcome))

    def write_turn(self, record_id: int, turns: list[dict[str, Any]], attempts: int) -> Future[bool]:
        """Store a conversation's finished turns while the record stays claimed (synthwatch.capture.turns); the future
        is True once committed, False when the claim is no longer this worker's (the turn is not stored)."""
        turns_json = orjson.dumps(turns, option=orjson.OPT_NON_STR_KEYS).decode()

        def write(conn: Connection) -> bool:
            t = time.time()
            moved = conn.execute(_TURN_UPDATE, {"j": turns_json, "d": len(turns), "a": attempts, "l": t + self.lease_s,
                                                "id": record_id, "w": self.worker_id}).rowcount
            if moved:
                conn.execute(text("UPDATE run SET n_turns_done = n_turns_done + 1, updated_at = :t WHERE id = :r"),
                             {"t": t, "r": self.run_id})
            return bool(moved)

        return self.call(write)

    def call(self, fn: Callable[[Connection], Any]) -> Future[Any]:
        """Run fn(conn) inside the next write transaction."""
        fut: Future[Any] = Future()
        self.q.put(("x", fn, fut))
        return fut

    def refresh_control(self) -> None:
        self._control_event.set()
        self.q.put(("w",))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Flush everything queued, then end the thread."""
        self._stop.set()
        self.q.put(("w",))
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("writer did not finish flushing within %.0f s", timeout_s)

    # ------------------------------------------------------------ thread

    def _run(self) -> None:
        try:
            self._main()
        finally:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
            # Stopped as asked, the checkpoints end with the writer. A writer that dies leaves its checkpoint
            # thread to end by itself once this thread is gone: ended here, it would end first, and the
            # supervisor would name it (without a cause) instead of the writer and the exception it died of.
            if self._stop.is_set() and self._ckpt_thread is not None:
                self._ckpt_stop.set()
                if self._ckpt_thread.is_alive():
                    self._ckpt_thread.join(10)
            # whoever still waits for a claim or a call must not wait forever on a thread that is gone; a crash
            # answers with its own exception, so whichever waiter notices first names the real cause
            gone = self._crashed or RuntimeError("the database writer stopped")
            while True:
                try:
                    it = self.q.get_nowait()
                except queue.Empty:
                    break
                if it[0] in ("c", "x") and not it[-1].done():
                    it[-1].set_exception(gone)

    def _main(self) -> None:
        pending: list[tuple[Any, ...]] = []
        last_flush = last_control = last_beat = last_lease = time.monotonic()
        backoff = 0.5
        while True:
            results = self._results
            timeout = self.flush_interval_s if not pending and not results else max(
                0.0, self.flush_interval_s - (time.monotonic() - last_flush))
            if self.hooks:
                timeout = min(timeout, CHECK_EVERY_S)
            try:
                item = self.q.get(timeout=timeout)
                pending.append(item)
                while len(pending) < MAX_BATCH:
                    pending.append(self.q.get_nowait())
            except queue.Empty:
                pass
            fresh: list[Outcome] = []
            series_in: list[Outcome] = []
            fails: list[AttemptFailure] = []
            while results and len(pending) < MAX_BATCH:
                it = results.popleft()
                pending.append(it)
                if it[0] == "o":
                    fresh.append(it[1])
                    series_in.append(it[1])
                elif it[0] == "f":
                    fails.append(it[1])
                else:
                    series_in.append(it[1])
            pause_due = bool(fresh) and self._check_early(fresh)
            if series_in or fails:
                # counted once, as they arrive: a retried flush upserts the same buckets, never counts twice
                self._touched.update(self.series.add(series_in, fails))
            m = time.monotonic()
            urgent = pause_due or any(it[0] == "x" for it in pending)
            claims = any(it[0] == "c" for it in pending)
            stopping = self._stop.is_set()
            beat = m - last_beat >= self.heartbeat_s
            lease = m - last_lease >= self.lease_s / 3
            if pending or beat or lease or stopping:
                full = urgent or stopping or beat or lease or len(pending) >= WAKE_AT_RESULTS \
                    or m - last_flush >= self.flush_interval_s
                if claims and not full:
                    # A claim is answered at once, in a transaction of its own; finished records wait for the
                    # next regular flush, so that the per-flush work (checks, series, counters, commit) is
                    # shared by every record of a flush interval instead of repeated for each claim.
                    asked = [it for it in pending if it[0] == "c"]
                    try:
                        short = self._flush_claims(asked)
                    except Exception as exc:
                        if not is_transient(exc):  # a bug in the claim SQL: surfaces, is never retried
                            self._crash(exc, pending)
                            raise
                        backoff = self._write_failed(exc, backoff)
                        continue
                    except BaseException as exc:
                        self._crash(exc, pending)
                        raise
                    pending = [it for it in pending if it[0] != "c"]
                    # a short answer ("empty", "cap") may only reflect results not written yet: write them
                    # now, so that the next claim sees the run as it is
                    full = short and any(it[0] == "o" for it in pending)
                if full:
                    work = [it for it in pending if it[0] != "w"]
                    try:
                        failed = self._flush_safely(work, beat, lease)
                    except BaseException as exc:  # a bug here must surface, not hang the worker
                        self._crash(exc, pending)
                        raise
                    if failed is not None:
                        backoff = self._write_failed(failed, backoff)
                        pending = work
                        if stopping and backoff >= 5.0 and m - last_flush > 60:
                            log.error("giving up flushing after 60 s of failures: %s", self.error)
                            return
                        continue
                    self.error = None
                    backoff = 0.5
                    pending = []
                    last_flush = m
                    if any(h.take_paused() for h in self.hooks if hasattr(h, "take_paused")):
                        # this worker's checks paused the run: its loop hands back its reserve and claims
                        # nothing more from now on, without waiting for the next control refresh
                        self.control = {**self.control, "desired": "pause"}
                        if self.on_control is not None:
                            self.on_control()
                    if beat:
                        last_beat = m
                    if lease:
                        last_lease = m
            if m - last_control >= self.control_interval_s or self._control_event.is_set():
                self._control_event.clear()
                try:
                    self._read_control()
                except DBAPIError as exc:
                    self.error = describe_stall(exc)
                last_control = m
            if stopping and not pending and self.q.empty() and not self._results:
                return

    def _check_early(self, outcomes: list[Outcome]) -> bool:
        """Run the checks on records as they arrive; True when their alarm would pause the run now."""
        due = False
        for hook in self.hooks:
            if hasattr(hook, "pause_due"):
                self._run_hook(hook, outcomes)
                due = hook.pause_due() or due
        return due

    @staticmethod
    def _run_hook(hook: WriterHook, outcomes: list[Outcome]) -> None:
        """hook.on_outcomes; when it fails, record by record, and a record it fails on is refused (its own
        error): a hook's bug on one record never stops its batch (the checks stage each record once)."""
        try:
            hook.on_outcomes(outcomes)
            return
        except Exception as exc:
            log.exception("checks failed on a batch (%s): checking its records one by one", value_class(exc))
        for o in outcomes:
            try:
                hook.on_outcomes([o])
            except Exception as exc:
                refuse(o, refusal_reason(exc, "running its checks"))

    @contextlib.contextmanager
    def _write_conn(self) -> Iterator[Connection]:
        """The writer's own connection, kept for the thread's life: SQLite drops a connection's page cache
        whenever another connection wrote since its last transaction, and with pooled connections taking
        turns every write transaction re-read its pages (measured: ~0.3 ms per claim). Replaced after an error."""
        if self._conn is None:
            self._conn = self.engine.connect()
            if self._conn.dialect.name == "sqlite":
                # checkpoints (copying the WAL into the database, with an fsync) happen in _checkpoints instead
                # of inside whichever commit crossed 1,000 pages: the writer never waits for the disk there
                self._conn.connection.driver_connection.execute(  # type: ignore[union-attr]
                    "PRAGMA wal_autocheckpoint = 0")  # on the driver: no transaction begun around it
        try:
            yield self._conn
        except BaseException:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                conn.close()
            raise

    def _checkpoints(self) -> None:
        """Checkpoint the WAL every CHECKPOINT_EVERY_S, on a connection of its own (SQLite). PASSIVE never
        blocks the writer or readers; a checkpoint that readers hold back finishes on a later round."""
        conn = None
        try:
            while not self._ckpt_stop.wait(CHECKPOINT_EVERY_S):
                if not self._thread.is_alive():
                    return  # the writer died (see _run): its supervisor has its exception by now
                try:
                    if conn is None:
                        conn = self.engine.connect()
                    # on the driver connection (autocommit): a checkpoint inside a transaction would hold a
                    # read snapshot that keeps later checkpoints from finishing
                    conn.connection.driver_connection.execute(  # type: ignore[union-attr]
                        "PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except (DBAPIError, sqlite3.Error) as exc:  # busy, disk full: the next round tries again
                    log.debug("checkpoint failed: %s", exc)
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            conn.close()
                    conn = None
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _write_failed(self, exc: BaseException, backoff: float) -> float:
        """Record a failed transient write (disk full, busy), wait, and return the next, doubled wait."""
        self.error = describe_stall(exc)
        log.warning("database write failed, will retry: %s", self.error)
        self._control_event.set()
        time.sleep(backoff)
        return min(backoff * 2, 5.0)

    def _crash(self, exc: BaseException, pending: list[tuple[Any, ...]]) -> None:
        self._crashed = exc
        log.exception("writer crashed")
        for it in pending:
            if it[0] in ("c", "x") and not it[-1].done():
                it[-1].set_exception(exc)

    def _flush_claims(self, claims: list[tuple[Any, ...]]) -> bool:
        """Answer claims in one write transaction; True if any came back short."""
        answers: list[tuple[Future[Any], Any]] = []
        with self._write_conn() as conn, store.write_begin(conn):
            store.lock_run(conn, self.run_id)
            for it in claims:
                res = store.claim(conn, self.run_id, self.worker_id, it[1], self.lease_s,
                                  whole_prompts=self.whole_prompts)
                answers.append((it[2], res))
            claimed = self.claimed + sum(len(res[0]) for _, res in answers)
            # the workers table shows what each worker holds, even one killed before its next heartbeat
            conn.execute(text("UPDATE worker SET claimed = :c WHERE id = :w"), {"c": claimed, "w": self.worker_id})
        self.claimed = claimed
        short = False
        for fut, res in answers:
            short = short or bool(res[1])
            fut.set_result(res)
        if short:  # the run may be ending: fresh counters for the worker's final message
            self._control_event.set()
        return short

    def _read_control(self) -> None:
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT status, desired, cap, concurrency, n_ok, n_in_flight, n_pending, n_error,"
                     " n_timeout, config_version, repair_seq, n_rerun, pause_in_flight FROM run WHERE id = :r"),
                {"r": self.run_id},
            ).mappings().first()
            conn.rollback()
        if row is not None:
            self.control = dict(row)

    def _flush_safely(self, work: list[tuple[Any, ...]], beat: bool, lease: bool) -> BaseException | None:
        """Flush; a permanent error writes the batch again record by record. Returns a transient error (to be
        retried); raises only when even the isolated flush fails for good (a bug: the writer stops)."""
        try:
            self._flush(work, beat, lease)
            return None
        except Exception as exc:
            if is_transient(exc):
                return exc
            log.warning("the store refused a write (%s: %s): writing the batch again record by record",
                        value_class(exc), type(exc).__name__)
        try:
            self._flush(work, beat, lease, isolate=True)
            return None
        except Exception as exc:
            if is_transient(exc):
                return exc
            raise

    def _flush(self, work: list[tuple[Any, ...]], beat: bool, lease: bool, isolate: bool = False) -> None:
        outcomes = [it[1] for it in work if it[0] == "o"]
        if outcomes:
            faults.hit("writer")  # a test's way to kill this thread (workers/faults.py THREAD_STAGES)
        failures = [it[1] for it in work if it[0] == "f"]
        claims = [it for it in work if it[0] == "c"]
        calls = [it for it in work if it[0] == "x"]
        t = time.time()
        if outcomes:
            for hook in self.hooks:
                self._run_hook(hook, outcomes)
            if self.spool_over_chars:  # the checks have read the texts: a long one need not stay in memory
                long_texts.spool(outcomes, self.spool_over_chars, self.spool_dir)
        touched = self._gauge_buckets()
        self.records.refused = []
        claim_results: list[tuple[Future[Any], Any, bool]] = []
        with self._write_conn() as conn, store.write_begin(conn):
            store.lock_run(conn, self.run_id)
            if outcomes:
                self.records.write(conn, outcomes, isolate)
            events = [{"r": self.run_id, "t": f.t, "rec": f.record_id, "ep": f.endpoint, "k": f.kind,
                       "sc": f.status_code, "final": f.final, "msg": storable_text(f.message[:4000])}
                      for f in failures] + self.records.refused
            if events:  # sanitised, redacted, each row isolated if the batch is refused (store/rows.py)
                store_rows.write(conn, "error_event", events)
            if isolate:
                self._isolated(conn, "the time series", self.series.write, conn, touched)
                for hook in self.hooks:
                    self._isolated(conn, "the checks' totals", hook.on_flush, conn, t)
            else:
                self.series.write(conn, touched)
                for hook in self.hooks:
                    hook.on_flush(conn, t)
            for it in calls:
                if isolate:
                    ok, res = self._isolated(conn, "a call", it[1], conn)
                    claim_results.append((it[2], res, ok))
                else:
                    claim_results.append((it[2], it[1](conn), True))
            for it in claims:
                res = store.claim(conn, self.run_id, self.worker_id, it[1], self.lease_s,
                                  whole_prompts=self.whole_prompts)
                self.claimed += len(res[0])
                claim_results.append((it[2], res, True))
            if lease:
                conn.execute(
                    text("UPDATE record SET lease_until = :l WHERE run_id = :r AND status = 'in_flight'"
                         " AND worker_id = :w"),
                    {"l": t + self.lease_s, "r": self.run_id, "w": self.worker_id},
                )
                # claims of workers that died (kill -9, lost host) go back to the queue for the others
                moved = store.release_dead_claims(conn, self.run_id, stale_after_s=self.lease_s)
                if moved:
                    log.warning("%d claims of dead workers returned to pending", moved)
            if beat or claims:
                stats = self.gauges()[3] if self.gauges else {}
                conn.execute(
                    text("UPDATE worker SET heartbeat_at = :t, claimed = :c, done = :d, stats_json = :s,"
                         " status = CASE WHEN status = 'dead' THEN 'running' ELSE status END WHERE id = :w"),
                    {"t": t, "c": self.claimed, "d": self.written, "s": orjson.dumps(stats).decode(),
                     "w": self.worker_id},
                )
        self.written += len(outcomes)
        self._touched = {}
        if outcomes:
            long_texts.release(outcomes)
            for hook in self.hooks:
                after = getattr(hook, "after_commit", None)
                if after is not None:
                    try:
                        after()
                    except Exception:  # the records are stored; their extended checks stay pending (re-checkable)
                        log.exception("a writer hook failed after a commit")
        for fut, res, ok in claim_results:
            if ok:
                fut.set_result(res)
            else:
                fut.set_exception(res)
        if claims:
            self._control_event.set()

    @staticmethod
    def _isolated(conn: Connection, what: str, step: Any, *args: Any) -> tuple[bool, Any]:
        """One step of an isolated flush in a SAVEPOINT: (True, its result), or (False, the permanent error,
        logged; the step's changes are undone and the rest of the flush commits). A transient error raises."""
        sp = conn.begin_nested()
        try:
            res = step(*args)
            sp.commit()
            return True, res
        except Exception as exc:
            sp.rollback()
            if is_transient(exc):
                raise
            log.error("the store refused %s: %s [%s]", what, value_class(exc), type(exc).__name__)
            return False, exc

    # ------------------------------------------------------------ series

    def _gauge_buckets(self) -> list[Bucket]:
        """The buckets changed since the last flush, with the gauge rows, refreshed on every flush so the
        in-flight chart is live."""
        touched = self._touched
        t = time.time()
        g = self.series.bucket("", t)
        if self.gauges is not None:
            inflight, conc, per_ep, _ = self.gauges()
            g.inflight, g.concurrency = inflight, conc
            for ep, n in per_ep.items():
                eb = self.series.bucket(ep, t)
                eb.inflight = n
                touched[(eb.endpoint, eb.t)] = eb
        touched[("", g.t)] = g
        # keep memory bounded: buckets older than two minutes will not change again
        self.series.forget_before(t - 120)
        return list(touched.values())


_TURN_UPDATE = text(
    "UPDATE record SET turns_json = :j, turns_done = :d, attempts = :a, attempts_json = NULL, lease_until = :l"
    " WHERE id = :id AND status = 'in_flight' AND worker_id = :w"
)
