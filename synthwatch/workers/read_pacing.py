"""Read pacing for streams that trickle: one network read per few tokens instead of one per token (#39).

A stream from a reasoning server brings one event of ~150-300 bytes per token, and a server sends each as a TCP
segment of its own. With a core to itself the worker's event loop wakes for every segment: an epoll wake-up, a
``recv``, aiohttp's ``data_received`` (the chunked framing in llhttp), a StreamReader feed and a task wake-up, about
7-8 µs together against ~3 µs for everything our code does per event (docs/benchmarks.md, the profile of the scale
run). At 2,048 streams x 30 tokens/s that per-read cost alone is half a core.

So after a small read of a stream that has been running for a while, the stream's transport stops reading
(``transport.pause_reading()``: the socket leaves the selector) and one timer per worker resumes every held
transport ``interval_s`` later. Meanwhile the kernel collects the segments that arrive (its receive buffer,
``outbound.SOCKET_RCVBUF_BYTES``), and the next read brings them all: one wake-up, one ``recv``, one
``data_received`` for several events. Waiting in the task instead (a sleep after each read) saved nothing, because
the transport kept reading each segment as it came (tried and dropped, docs/benchmarks.md).

What it changes, by design:
- tokens reach the capture up to ``interval_s`` late: the live view, the in-flight checks (5 s budget) and the idle
  timeout see them that much later; the first token is never held (the time to first token stays exact), nor a
  stream younger than ``warmup_s`` (short replies are not slowed down);
- a stream whose reads are large (a fast stream, more than ``small_read_bytes`` per read) is never held, so pacing
  caps nobody's throughput below the kernel's buffer per interval;
- memory: while a transport is held, the kernel holds the bytes (bounded by its receive buffer, then the TCP window
  stops the server); aiohttp's own flow control still pauses a transport whose buffer is full, and a transport it
  paused is never resumed here (only those held here are).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("synthwatch.worker")

# Raised by a transport without flow control, or one closing; both are harmless here (as in aiohttp's own code).
_PAUSE_ERRORS = (AttributeError, NotImplementedError, RuntimeError)


class ReadPacer:
    """The held transports of one event loop and the one timer that resumes them."""

    __slots__ = ("handle", "held", "interval_s", "loop", "small_read_bytes", "warmup_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float, *, warmup_s: float = 1.0,
                 small_read_bytes: int = 4096) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.warmup_s = warmup_s
        self.small_read_bytes = small_read_bytes
        self.held: list[Any] = []
        self.handle: asyncio.TimerHandle | None = None

    def hold(self, transport: Any) -> None:
        """Stop reading ``transport`` until the next tick (the caller's read just took everything it had)."""
        try:
            transport.pause_reading()
        except _PAUSE_ERRORS:
            return
        self.held.append(transport)
        if self.handle is None:
            self.handle = self.loop.call_later(self.interval_s, self.release)

    def release(self) -> None:
        """Resume every held transport (a closed one ignores it; one paused by aiohttp itself is not held here).
        One that fails to resume cannot leave the others paused: each is resumed on its own, and its failure is
        logged (its stream then ends at its idle timeout, recorded on its record)."""
        self.handle = None
        held, self.held = self.held, []
        for transport in held:
            try:
                transport.resume_reading()
            except _PAUSE_ERRORS:
                pass
            except Exception:
                log.exception("read pacing: a held connection could not be resumed")

    def close(self) -> None:
        """Resume everything now (the worker is stopping: no transport stays paused behind it)."""
        if self.handle is not None:
            self.handle.cancel()
        self.release()
