"""The worker's streams in flight (#36): each streamed attempt's :class:`LiveStream`, judged while it is written
(synthwatch.quality.inflight), its verdicts handed to the writer's alarm path in small batches.

The client calls :meth:`LiveStream.seen` after each network read of a stream (synthwatch.workers.client): one clock
read and two comparisons once the stream's first deltas are judged; the judge itself runs only on the first
deltas, then at the loop detector's cadence (quality/inflight.py says what each costs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import orjson
from sqlalchemy import text

from ..quality.inflight import DOOMED_CHECKS, JudgeRules, StreamJudge, Verdict, deliver
from ..redact import redact
from ..store import rows as store_rows

log = logging.getLogger("synthwatch.worker")

STREAM_FIELDS = ("reasoning", "reasoning_content", "thinking", "reasoning_details", "content")
_monotonic = time.monotonic  # one global lookup per read instead of two
BATCH_S = 0.05  # verdicts of streams judged within this time go to the writer in one call

__all__ = ["DOOMED_CHECKS", "LiveStream", "StreamBoard"]


class LiveStream:
    """One streamed attempt of a record while it runs."""

    __slots__ = ("board", "record_id", "endpoint", "started", "last", "acc", "judge", "sizes", "field")

    def __init__(self, board: StreamBoard, record_id: int, endpoint: str, judge: StreamJudge | None) -> None:
        self.board = board
        self.record_id = record_id
        self.endpoint = endpoint
        self.started = self.last = time.monotonic()
        self.acc: Any = None  # the attempt's StreamAccumulator, once a read came
        self.judge = judge
        self.sizes: dict[str, int] = {}  # characters per field at the last snapshot
        self.field = ""  # the field text arrived in since the last snapshot

    def view(self, now: float, tail_chars: int) -> dict[str, Any]:
        """A bounded snapshot of this stream for the live view (never its whole text)."""
        acc = self.acc
        age = now - self.started
        out: dict[str, Any] = {"record_id": self.record_id, "endpoint": self.endpoint, "age_s": round(age, 2),
                               "since_token_s": round(now - self.last, 2), "tokens": 0, "tokens_per_s": 0.0,
                               "field": "", "reasoning_field": "", "reasoning": "", "content": ""}
        if acc is None:
            return out
        n = acc.n_chunks
        out["tokens"] = n  # deltas: one token each on vLLM and SGLang (an estimate elsewhere)
        out["tokens_per_s"] = round(n / age, 2) if age > 0 else 0.0
        sizes = {k: acc.chars(k) for k in STREAM_FIELDS}
        grown = [k for k in STREAM_FIELDS if sizes[k] > self.sizes.get(k, 0)]
        if grown:
            self.field = grown[-1]
        self.sizes = sizes
        out["field"] = self.field
        rf = next((k for k in STREAM_FIELDS[:-1] if sizes[k]), "")
        out["reasoning_field"] = rf
        if tail_chars > 0:
            # model text into the store: storable and redacted like every other row's text (store/rows.py, #34);
            # room for a marker longer than the key it replaced, so the newest characters are never the ones cut
            limit = tail_chars + 64
            out["reasoning"] = (store_rows.clean_text(acc.tail(rf, tail_chars), limit) or "") if rf else ""
            out["content"] = store_rows.clean_text(acc.tail("content", tail_chars), limit) or ""
        return out

    def seen(self, acc: Any) -> None:
        """After a network read of this stream (the per-chunk hot path: keep it cheap)."""
        self.acc = acc
        self.last = _monotonic()
        j = self.judge
        if j is not None and (j.first_open or acc.n_chunks >= j.next_loop):
            verdicts = j.observe(acc)
            if verdicts:
                self.board.emit(verdicts)


class StreamBoard:
    """The streams in flight of one worker; verdicts go to ``send`` (the writer's call) in batches."""

    def __init__(self, rules: JudgeRules | None, send: Callable[[list[Verdict]], Future[Any] | None]) -> None:
        self.rules = rules  # None: no in-flight checks (the run has no checks hooks)
        self.streams: dict[int, LiveStream] = {}
        self._send = send
        self._pending: list[Verdict] = []
        self._scheduled = False
        self.n_verdicts = 0

    @classmethod
    def for_writer(cls, rules: JudgeRules | None, writer: Any, hooks: list[Any]) -> StreamBoard:
        """A board whose verdicts reach the alarm path: one writer call per batch (quality.inflight.deliver)."""

        def send(verdicts: list[Verdict]) -> Future[Any]:
            return writer.call(lambda conn: deliver(conn, time.time(), hooks, verdicts))

        judged = rules if any(hasattr(h, "observe_early") for h in hooks) else None
        return cls(judged, send)

    def open(self, record_id: int, endpoint: str) -> LiveStream:
        rules = self.rules
        s = LiveStream(self, record_id, endpoint, StreamJudge(record_id, endpoint, rules) if rules else None)
        self.streams[record_id] = s
        return s

    def close(self, stream: LiveStream) -> None:
        if self.streams.get(stream.record_id) is stream:
            del self.streams[stream.record_id]

    def snapshot(self, tail_chars: int, max_streams: int) -> list[dict[str, Any]]:
        """The live view's rows: the ``max_streams`` oldest streams, each bounded to ``tail_chars`` per text."""
        now = time.monotonic()
        oldest = sorted(self.streams.values(), key=lambda s: s.started)[:max_streams]
        return [s.view(now, tail_chars) for s in oldest]

    def emit(self, verdicts: list[Verdict]) -> None:
        self._pending.extend(verdicts)
        self.n_verdicts += len(verdicts)
        if not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_later(BATCH_S, self.flush)
            except RuntimeError:  # no loop (a test driving a judge by hand): at once
                self.flush()

    def flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            fut = self._send(batch)
        except Exception as exc:  # the writer is gone: the finished records still carry their own verdicts
            log.warning("in-flight verdicts not delivered: %s: %s", exc.__class__.__name__, exc)
            return
        if fut is not None:
            fut.add_done_callback(_log_failure)


def _log_failure(fut: Future[Any]) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("in-flight verdicts not recorded: %s: %s", exc.__class__.__name__, exc)


async def publish_streams(board: StreamBoard, writer: Any, worker_id: int, refresh_s: float, tail_chars: int,
                          max_streams: int) -> None:
    """Write this worker's snapshot of its streams in flight every ``refresh_s`` (its writer's transaction: one
    UPDATE of its worker row), until cancelled; the last write empties it."""
    last: str | None = None

    def write(conn: Any, data: str | None) -> None:
        conn.execute(text("UPDATE worker SET streams_json = :j, streams_at = :t WHERE id = :w"),
                     {"j": data, "t": time.time(), "w": worker_id})

    try:
        while True:
            try:
                rows = board.snapshot(tail_chars, max_streams)
                data = orjson.dumps({"n": len(board.streams), "streams": rows}).decode()
            except Exception as exc:  # noqa: BLE001 - one bad snapshot never ends the live view for the run
                log.warning("streams snapshot not written: %s: %s", type(exc).__name__, redact(str(exc))[:300])
            else:
                if data != last or rows:
                    last = data
                    writer.call(lambda conn, d=data: write(conn, d)).add_done_callback(_log_failure)
            await asyncio.sleep(refresh_s)
    finally:
        if writer.alive:
            writer.call(lambda conn: write(conn, None)).add_done_callback(_log_failure)


def pause_cancels(choice: str | None, hold: tuple[str, ...] | list[str]) -> str | None:
    """Why a pause cancels the requests in flight, or None when they finish (#36 item 2): the person's choice
    (``run.pause_in_flight``: cancel / finish), else the check that paused it (a doomed output is cancelled)."""
    if choice == "finish":
        return None
    doomed = sorted(DOOMED_CHECKS.intersection(hold))
    if choice is None and doomed:
        return f"cancelled: the run paused on {', '.join(doomed)}"
    if choice == "cancel":
        return "cancelled: the run was paused with its requests in flight cancelled"
    return None


async def cancel_running(worker: Any, why: str, wait_s: float) -> int:
    """Cancel a worker's requests in flight while it goes on (paused): closing each connection makes vLLM and SGLang
    abort the request and free its KV cache; each record's task records its attempt as interrupted (``why``) and
    hands the record back to pending, never counted as generated (synthwatch.workers.record)."""
    tasks = list(worker.tasks)
    worker.stop_reason = why
    try:
        for t in tasks:
            t.cancel()
        _, pending = await asyncio.wait(tasks, timeout=wait_s)
        if pending:
            log.error("%d cancelled record tasks did not end; their records return to pending", len(pending))
    finally:
        worker.stop_reason = ""
    log.warning("run %d: %d requests in flight cancelled (%s)", worker.run_id, len(tasks), why)
    return len(tasks)


def start_publisher(worker: Any) -> asyncio.Task[None] | None:
    """The task that publishes a worker's snapshot of its streams while the run goes (settings live_streams_*)."""
    from ..settings import get_settings

    st = get_settings()
    if not st.live_streams_refresh_ms or not worker.config.stream or worker.writer is None:
        return None
    task = asyncio.create_task(publish_streams(
        worker.streams, worker.writer, worker.worker_id, st.live_streams_refresh_ms / 1000, st.live_stream_tail_chars,
        st.live_streams_max), name="synthwatch-streams")
    worker.supervisor.watch_task(task, "the live streams publisher task")
    return task
