"""A lean HTTP/1.1 client for the worker: POST a JSON body, read the reply whole or as it streams.

Why not aiohttp's ClientSession: on these machines its request and response objects, header
multidicts, URL objects and per-read timers cost ~0.2 ms of CPU per request, 4-5x what this module
spends (docs/benchmarks.md); for short replies that was most of the worker's CPU. Streamed body
bytes go from ``data_received`` straight to the caller's sink, with no task wake-up per read.

Scope is what OpenAI-compatible endpoints need: http and https, keep-alive connections per host,
Content-Length, chunked and close-delimited bodies, gzip/deflate bodies, interim 1xx responses
skipped. No proxies, redirects (a 3xx is returned like any status), cookies or HTTP/2.

Failures raise :class:`HttpFailure` with a kind the worker records: ``connect``,
``connect_timeout``, ``idle_timeout`` (no byte for idle_s while a stream was awaited), ``dropped``
(the connection ended before the reply did) or ``http_error`` (not a valid HTTP/1.x reply).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Exchange", "HttpClient", "HttpFailure"]

_MAX_HEAD = 64 * 1024
_MAX_CHUNK_LINE = 4096
_CRLF = b"\r\n"
_HEAD_END = b"\r\n\r\n"

# body framing
_LENGTH, _CHUNKED, _UNTIL_CLOSE, _NONE = range(4)
# chunked decoder states
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)

Sink = Callable[[bytes], bool]  # returns False to stop reading (the connection is then closed)


class HttpFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Target:
    """What one URL needs to open a connection and send a request to it."""

    __slots__ = ("host", "key", "port", "prefix", "server_hostname", "tls")

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.tls else 80)
        self.server_hostname = self.host if self.tls else None
        self.key = (self.tls, self.host, self.port)
        host = f"[{self.host}]" if ":" in self.host else self.host
        if u.port is not None:
            host += f":{u.port}"
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        lines = [f"POST {target} HTTP/1.1", f"Host: {host}", "User-Agent: synthwatch"]
        for name, value in headers.items():
            if any(c in name or c in value for c in "\r\n\0") or ":" in name:
                # a header smuggling a line break would let the value rewrite the request
                raise ValueError(f"HTTP header {name.split(':')[0][:40]!r} holds a line break, NUL or colon in its name")
            if name.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
                lines.append(f"{name}: {value}")
        self.prefix = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")


class _Conn(asyncio.Protocol):
    """One connection; carries one exchange at a time (no pipelining)."""

    def __init__(self, client: HttpClient, key: tuple[bool, str, int]) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle = False  # parked in the client's idle list
        self._loop = client.loop
        self._reset()

    def _reset(self) -> None:
        self.active = True  # carrying an exchange, from sending the request until released
        self.head_done = False
        self.done = False  # the reply's body ended where its framing said
        self.reusable = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.n_received = 0
        self._buf = b""
        self._framing = _NONE
        self._left = 0
        self._chunk = _SIZE
        self._keep_alive = False
        self._inflate: Any = None
        self._sink: Sink | None = None
        self._pending: list[bytes] = []
        self._pending_n = 0
        self._stopped = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._idle_s: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last = 0.0

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle:
            self.client._forget(self)
        if not self.active or self.done or self._error is not None:
            self._stop_idle_timer()
            return
        if self.head_done and self._framing == _UNTIL_CLOSE:
            self._finish()
            return
        why = f"{exc.__class__.__name__}: {exc}" if exc else "the server closed the connection"
        where = "while sending the reply body" if self.head_done else "before a complete reply head"
        self._fail(HttpFailure("dropped", f"connection dropped {where} ({why})"))

    def data_received(self, data: bytes) -> None:
        if self._error is not None or self._stopped:
            return
        if self.done:
            # bytes after a complete reply (none was asked for): this connection's framing cannot be trusted
            self.reusable = False
            if self.transport is not None:
                self.transport.abort()
            return
        self.n_received += len(data)
        if self._idle_s is not None:
            self._last = self._loop.time()
        if not self.head_done:
            data = self._buf + data if self._buf else data
            self._buf = b""
            data = self._parse_head(data)
            if not self.head_done or self._error is not None:
                return
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if self._framing == _NONE:
                self._finish()
                return
            if not data:
                return
        try:
            if self._framing == _LENGTH:
                self._feed_length(data)
            elif self._framing == _CHUNKED:
                self._feed_chunked(data)
            else:
                self._deliver(data)
        except Exception as exc:  # bad framing (HttpFailure), or a bug in the caller's sink: raised where awaited
            self._fail(exc)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost decides whether the reply was complete

    # -- framing ----------------------------------------------------------------------------

    def _parse_head(self, data: bytes) -> bytes:
        while True:
            end = data.find(_HEAD_END)
            if end < 0:
                if len(data) > _MAX_HEAD:
                    self._fail(HttpFailure("http_error", f"reply head longer than {_MAX_HEAD} bytes"))
                else:
                    self._buf = data
                return b""
            try:
                lines = data[:end].decode("latin-1").split("\r\n")
                version, _, rest = lines[0].partition(" ")
                if version not in ("HTTP/1.1", "HTTP/1.0"):
                    raise ValueError(f"status line {lines[0][:100]!r}")
                status = int(rest[:3])
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if not sep:
                        raise ValueError(f"header line {line[:100]!r}")
                    name = name.strip().lower()
                    value = value.strip()
                    headers[name] = f"{headers[name]}, {value}" if name in headers else value
            except ValueError as exc:
                self._fail(HttpFailure("http_error", f"not an HTTP/1.x reply: {exc}"))
                return b""
            data = data[end + 4:]
            if 100 <= status < 200 and status != 101:
                continue  # interim reply (100 Continue, 103 Early Hints): the real one follows
            break
        self.status = status
        self.headers = headers
        conn = headers.get("connection", "").lower()
        self._keep_alive = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
        te = headers.get("transfer-encoding", "").lower()
        enc = headers.get("content-encoding", "").lower().strip()
        try:
            if status in (101, 204, 304):  # other 1xx replies were skipped above
                self._framing = _NONE
            elif te:
                if not te.endswith("chunked"):
                    raise ValueError(f"transfer-encoding {te!r}")
                self._framing = _CHUNKED
            elif "content-length" in headers:
                n = int(headers["content-length"])
                if n < 0:
                    raise ValueError(f"content-length {n}")
                self._framing, self._left = (_LENGTH, n) if n else (_NONE, 0)
            else:
                self._framing = _UNTIL_CLOSE
                self._keep_alive = False
            if enc in ("gzip", "x-gzip", "deflate"):
                self._inflate = zlib.decompressobj(47)  # gzip or zlib header, detected
            elif enc not in ("", "identity"):
                raise ValueError(f"content-encoding {enc!r} is not supported")
        except ValueError as exc:
            self._fail(HttpFailure("http_error", f"bad reply framing: {exc}"))
            return b""
        self.head_done = True
        return data

    def _feed_length(self, data: bytes) -> None:
        n = len(data)
        if n < self._left:
            self._left -= n
            self._deliver(data)
            return
        piece = data[: self._left] if n > self._left else data
        extra = n > self._left
        self._left = 0
        self._deliver(piece)
        if extra:
            self._keep_alive = False  # bytes beyond the body: the connection's framing is lost
        self._finish()

    def _feed_chunked(self, data: bytes) -> None:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        pos, n = 0, len(data)
        while pos < n:
            st = self._chunk
            if st == _DATA:
                take = min(self._left, n - pos)
                self._deliver(data[pos:pos + take] if take != n else data)
                pos += take
                self._left -= take
                if self._left == 0:
                    self._chunk = _DATA_END
            elif st == _SIZE:
                end = data.find(_CRLF, pos)
                if end < 0:
                    self._keep(data, pos)
                    return
                line = data[pos:end].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise HttpFailure("http_error", f"bad chunk size line {data[pos:end][:60]!r}") from None
                pos = end + 2
                if size:
                    self._chunk, self._left = _DATA, size
                else:
                    self._chunk = _TRAILER
            elif st == _DATA_END:
                if n - pos < 2:
                    self._keep(data, pos)
                    return
                if data[pos:pos + 2] != _CRLF:
                    raise HttpFailure("http_error", "chunk data not followed by CRLF")
                pos += 2
                self._chunk = _SIZE
            else:  # trailer lines until an empty one
                end = data.find(_CRLF, pos)
                if end < 0:
                    self._keep(data, pos)
                    return
                empty = end == pos
                pos = end + 2
                if empty:
                    if pos < n:
                        self._keep_alive = False
                    self._finish()
                    return

    def _keep(self, data: bytes, pos: int) -> None:
        rest = data[pos:]
        if len(rest) > _MAX_CHUNK_LINE:
            raise HttpFailure("http_error", "chunk size or trailer line too long")
        self._buf = rest

    def _deliver(self, piece: bytes) -> None:
        if self._stopped:
            return  # the sink said it has what it needs: one read can hold several more pieces (chunks)
        if self._inflate is not None:
            try:
                piece = self._inflate.decompress(piece)
            except zlib.error as exc:
                raise HttpFailure("http_error", f"body does not decompress: {exc}") from None
            if not piece:
                return
        sink = self._sink
        if sink is None:
            self._collect(piece)
        elif not sink(piece):
            self._stop()

    def _collect(self, piece: bytes) -> None:
        """Keep body bytes until the caller reads them."""
        self._pending.append(piece)
        self._pending_n += len(piece)

    # -- ends ---------------------------------------------------------------------------------

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        self._stop_idle_timer()
        if self._inflate is not None:
            tail = self._inflate.flush()
            self._inflate = None
            if tail:
                self._deliver(tail)
        self.reusable = self._keep_alive and not self.closed and not self._stopped
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None or self.done:
            return
        self._error = exc
        self._stop_idle_timer()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def _stop(self) -> None:
        """The caller has what it needs: stop reading; the connection cannot carry another reply."""
        self._stopped = True
        self._stop_idle_timer()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- idle timeout: one timer per idle period, re-armed lazily (not one per read) ------------

    def _arm_idle(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._last = self._loop.time()
        self._idle_timer = self._loop.call_at(self._last + idle_s, self._idle_check)

    def _idle_check(self) -> None:
        assert self._idle_s is not None
        due = self._last + self._idle_s
        if self._loop.time() >= due:
            self._idle_timer = None
            self._fail(HttpFailure("idle_timeout", f"no data for {self._idle_s:g} s"))
        else:
            self._idle_timer = self._loop.call_at(due, self._idle_check)

    def _stop_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._idle_s = None

    # -- used by Exchange ------------------------------------------------------------------------

    async def wait(self) -> None:
        if self._error is not None:
            raise self._error
        fut = self._waiter = self._loop.create_future()
        try:
            await fut
        finally:
            self._waiter = None


class Exchange:
    """One request and its reply. Read the body with :meth:`read` or :meth:`stream`, then
    :meth:`release` (always: it returns the connection to the pool or closes it)."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body, or its first ``limit`` bytes (the rest is not read)."""
        c = self._conn
        if limit is not None:
            def cap(piece: bytes) -> bool:
                c._collect(piece)
                return c._pending_n < limit
            if c._pending_n >= limit:
                c._stop()
            else:
                c._sink = cap
        while not (c.done or c._stopped):
            await c.wait()
        body = b"".join(c._pending) if len(c._pending) != 1 else c._pending[0]
        c._pending = []
        return body[:limit] if limit is not None else body

    async def stream(self, sink: Sink) -> None:
        """Hand every body piece to ``sink`` as it arrives, until the body ends or sink returns False."""
        c = self._conn
        pending, c._pending, c._pending_n = c._pending, [], 0
        for piece in pending:
            if not sink(piece):
                c._stop()
                return
        c._sink = sink
        while not (c.done or c._stopped):
            await c.wait()

    def release(self) -> None:
        self._conn.client._release(self._conn)


class HttpClient:
    def __init__(self, *, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.loop = asyncio.get_running_loop()
        self._idle: dict[tuple[bool, str, int], list[_Conn]] = {}
        self._targets: dict[tuple[str, tuple[tuple[str, str], ...]], _Target] = {}
        self._ssl: ssl.SSLContext | None = None
        self._open: set[_Conn] = set()

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, idle_s: float | None) -> Exchange:
        """Send ``body`` and wait for the reply's status and headers.

        ``idle_s``: the longest silence allowed from sending until the body ends (for streams);
        None lets a reply take as long as the caller's own timeout allows."""
        key = (url, tuple(headers.items()))
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = _Target(url, headers)
        request = b"%b%d\r\n\r\n%b" % (target.prefix, len(body), body)
        conn, reused = await self._acquire(target)
        try:
            return await self._exchange(conn, request, idle_s)
        except HttpFailure as exc:
            if not (reused and exc.kind == "dropped" and conn.n_received == 0):
                raise
        # a kept-alive connection the server had closed before our request reached it: the
        # request was never read, so it goes again on a fresh connection (as browsers do)
        conn, _ = await self._acquire(target, fresh=True)
        return await self._exchange(conn, request, idle_s)

    async def _exchange(self, conn: _Conn, request: bytes, idle_s: float | None) -> Exchange:
        try:
            conn._reset()
            if idle_s is not None:
                conn._arm_idle(idle_s)
            assert conn.transport is not None
            conn.transport.write(request)
            while not conn.head_done:
                await conn.wait()
            return Exchange(conn)
        except BaseException:
            self._release(conn)
            raise

    async def _acquire(self, target: _Target, fresh: bool = False) -> tuple[_Conn, bool]:
        idle = self._idle.get(target.key)
        while idle and not fresh:
            conn = idle.pop()
            conn.idle = False
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
        ssl_ctx = None
        if target.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ssl_ctx = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await self.loop.create_connection(
                    lambda: _Conn(self, target.key), target.host, target.port, ssl=ssl_ctx,
                    server_hostname=target.server_hostname)
        except TimeoutError:
            raise HttpFailure("connect_timeout", f"no connection within {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise HttpFailure("connect", f"cannot connect to {target.host}:{target.port}: {exc}") from None
        self._open.add(proto)
        return proto, False

    def _release(self, conn: _Conn) -> None:
        conn.active = False
        conn._sink = None
        conn._pending = []
        conn._stop_idle_timer()
        if conn.reusable and not conn.closed:  # reusable: ended by its framing, no error, not stopped early
            conn.idle = True
            self._idle.setdefault(conn.key, []).append(conn)
            return
        self._open.discard(conn)
        if conn.transport is not None and not conn.closed:
            conn.transport.abort()
        conn.closed = True

    def _forget(self, conn: _Conn) -> None:
        conn.idle = False
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        conns = list(self._open)
        self._open.clear()
        self._idle.clear()
        for conn in conns:
            if conn.transport is not None and not conn.closed:
                conn.transport.close()
        if conns:
            await asyncio.sleep(0)  # let the transports run their close callbacks
