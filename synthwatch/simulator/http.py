"""HTTP/1.1 on a raw asyncio.Protocol: request parsing, keep-alive, chunked streams, error bodies."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from .config import MAX_BODY_BYTES, MAX_HEADER_BYTES

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------------

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}
JSON_TYPE = b"application/json"
SSE_TYPE = b"text/event-stream; charset=utf-8"
_date_cache: list[Any] = [0, b""]


def _http_date() -> bytes:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True).encode()
    value: bytes = _date_cache[1]
    return value


def response_head(status: int, ctype: bytes, length: int | None, keep_alive: bool, extra: bytes = b"") -> bytes:
    if length is None:
        framing = b"transfer-encoding: chunked\r\n"
    elif length < 0:  # the body ends when the connection closes (streams to HTTP/1.0 clients)
        framing = b""
    else:
        framing = b"content-length: %d\r\n" % length
    return b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: synthwatch-sim\r\ncontent-type: %s\r\n%s%s%s\r\n" % (
        status,
        _REASONS.get(status, "Unknown").encode(),
        _http_date(),
        ctype,
        framing,
        extra,
        b"" if keep_alive else b"connection: close\r\n",
    )


def error_json(status: int, kind: str, message: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def chunk_frame(data: bytes, chunked: bool) -> bytes:
    """Frame stream data: HTTP/1.1 gets chunked encoding, HTTP/1.0 a body that ends at close."""
    return b"%x\r\n%s\r\n" % (len(data), data) if chunked else data


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    body: bytes
    keep_alive: bool
    http11: bool = True


class ConnOwner(Protocol):
    """What a connection needs from the server that accepted it (the Simulator): its books and its router."""

    stats: dict[str, Any]
    conns: set[Conn]
    tasks: set[asyncio.Task[None]]

    def dispatch(self, conn: Conn, req: HttpRequest) -> None: ...


class Conn(asyncio.Protocol):
    """One client connection: parses requests in order, one response at a time."""

    def __init__(self, sim: ConnOwner) -> None:
        self.sim = sim
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pending: tuple[str, str, dict[bytes, bytes], int, bool] | None = None
        self.sent_continue = False
        self.http11 = True
        self.busy = False
        self.closed = False  # the transport is gone
        self.closing = False  # we closed it, or are about to
        self.paused = False
        self.task: asyncio.Task[None] | None = None
        self._drain: asyncio.Future[None] | None = None

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sim.conns.add(self)
        stats = self.sim.stats
        stats["connections"] += 1
        stats["max_connections"] = max(stats["max_connections"], stats["connections"])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.sim.conns.discard(self)
        self.sim.stats["connections"] -= 1
        if self.task is not None and not self.task.done():
            self.sim.stats["client_disconnects"] += 1
            self.task.cancel()
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buf += data
        if not self.busy:
            self.process()

    # helpers
    def _wake(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self.paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def write(self, data: bytes) -> None:
        if not self.closing and not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def respond(
        self, status: int, body: bytes, keep_alive: bool, ctype: bytes = JSON_TYPE, extra: bytes = b""
    ) -> None:
        self.write(response_head(status, ctype, len(body), keep_alive, extra) + body)
        if not keep_alive:
            self.close()

    def process(self) -> None:
        """Handle every complete request in the buffer, unless a streamed reply is running."""
        while not self.busy and not self.closing and not self.closed:
            request = self._parse()
            if request is None:
                return
            try:
                self.sim.dispatch(self, request)
            except Exception:
                log.exception("simulator: request failed")
                self.busy = False
                self.respond(500, error_json(500, "InternalServerError", "simulator bug"), False)
                return

    def _parse(self) -> HttpRequest | None:
        buf = self.buf
        if self.pending is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    self.respond(431, error_json(431, "BadRequestError", "headers too large"), False)
                return None
            head = bytes(buf[:end])
            del buf[: end + 4]
            line_end = head.find(b"\r\n")
            if line_end < 0:
                line_end = len(head)
            parts = head[:line_end].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                self.respond(400, error_json(400, "BadRequestError", "bad request line"), False)
                return None
            headers: dict[bytes, bytes] = {}
            for line in head[line_end + 2 :].lower().split(b"\r\n"):
                name, _, value = line.partition(b":")
                headers[name.strip()] = value.strip()
            connection = headers.get(b"connection", b"")
            self.http11 = parts[2] == b"HTTP/1.1"
            if self.http11:
                keep_alive = b"close" not in connection
            else:
                keep_alive = b"keep-alive" in connection
            if headers.get(b"transfer-encoding", b"identity") != b"identity":
                self.respond(411, error_json(411, "BadRequestError", "send a Content-Length body"), False)
                return None
            try:
                length = int(headers.get(b"content-length", b"0"))
                if length < 0:
                    raise ValueError
            except ValueError:
                self.respond(400, error_json(400, "BadRequestError", "bad Content-Length"), False)
                return None
            if length > MAX_BODY_BYTES:
                message = f"request body over {MAX_BODY_BYTES} bytes"
                self.respond(413, error_json(413, "BadRequestError", message), False)
                return None
            path = parts[1].partition(b"?")[0].decode("latin-1")
            self.pending = (parts[0].decode("latin-1"), path, headers, length, keep_alive)
            self.sent_continue = False
        method, path, headers, length, keep_alive = self.pending
        if len(buf) < length:
            if not self.sent_continue and headers.get(b"expect") == b"100-continue":
                self.sent_continue = True
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return None
        body = bytes(buf[:length])
        del buf[:length]
        self.pending = None
        return HttpRequest(method, path, body, keep_alive, self.http11)

    def start_task(self, coro: Any) -> None:
        self.busy = True
        self.task = asyncio.get_running_loop().create_task(coro)
        self.sim.tasks.add(self.task)
        self.task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.sim.tasks.discard(task)
        self.task = None
        self.busy = False
        if not task.cancelled() and task.exception() is not None:
            log.error("simulator: stream failed", exc_info=task.exception())
            self.close()
            return
        if not self.closed and not self.closing and self.buf:
            self.process()
