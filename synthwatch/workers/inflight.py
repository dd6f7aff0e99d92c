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

from ..quality.inflight import DOOMED_CHECKS, JudgeRules, StreamJudge, Verdict, deliver

log = logging.getLogger("synthwatch.worker")

BATCH_S = 0.05  # verdicts of streams judged within this time go to the writer in one call

__all__ = ["DOOMED_CHECKS", "LiveStream", "StreamBoard"]


class LiveStream:
    """One streamed attempt of a record while it runs."""

    __slots__ = ("board", "record_id", "endpoint", "started", "last", "acc", "judge")

    def __init__(self, board: StreamBoard, record_id: int, endpoint: str, judge: StreamJudge | None) -> None:
        self.board = board
        self.record_id = record_id
        self.endpoint = endpoint
        self.started = self.last = time.monotonic()
        self.acc: Any = None  # the attempt's StreamAccumulator, once a read came
        self.judge = judge

    def seen(self, acc: Any) -> None:
        """After a network read of this stream (the per-chunk hot path: keep it cheap)."""
        self.acc = acc
        self.last = time.monotonic()
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
