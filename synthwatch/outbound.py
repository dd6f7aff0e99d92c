"""The one door out: every HTTP request synthwatch sends goes through this module (#34).

The worker's generations, the judge, the run's preflight, ``synthwatch probe`` and the dashboard's probe button,
the server-metrics scraper, alarm webhooks and the demo's simulator calls all take their aiohttp session from
:func:`session` (or :func:`worker_session`) and, except for the worker's streamed reads, read their replies with
:func:`fetch`. So every request gets, from this one place:

- **no credentials from the environment**: ``trust_env`` is off in every session (aiohttp's would read
  ``~/.netrc`` and send its login to whatever host a URL names); a proxy is used only when the caller passes
  one, and the only proxy a caller may pass is the operator's ``HTTP(S)_PROXY`` / ``NO_PROXY`` for that URL,
  read once by :func:`env_proxy` (its credentials registered as secrets);
- **TLS** as the caller's endpoint says (``ssl``), no cookies kept, no redirect followed;
- **reply limits** (docs/limits.md): header sizes and counts, and a body cap counted *after* decompression with
  a bounded decompressor (a 1 MB gzip bomb is never inflated past the cap: :func:`read_capped`);
- **a total deadline per request** (connect, headers and body together);
- **redaction**: every failure is an :class:`OutboundError` whose message went through :func:`redact.redact`.

Every caller is also registered here by name (:func:`register`) with a ``drive`` function that runs it once
against a base URL: ``tests/test_outbound_properties.py`` runs each registered caller against hostile replies,
so a caller added later is covered without new test code, and :func:`session` refuses a caller that is not
registered.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import socket
import ssl as ssl_
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp

from .redact import add_secret, clip, redact

__all__ = ["CALLERS", "Caller", "OutboundError", "Reply", "env_proxy", "fetch", "read_capped", "register", "run_sync",
           "session", "worker_session"]

USER_AGENT = "synthwatch (aiohttp)"
MAX_HEADER_BYTES = 8190  # docs/limits.md: limits.max_header_bytes' default
MAX_HEADERS = 128  # limits.max_headers' default
MAX_ERROR_CHARS = 500  # of a reply's text quoted in an OutboundError
_READ_CHUNK = 1 << 16  # decompressed bytes produced per step of the bounded decompressor
# What one reply of the generation path may hold in the worker before its reader takes it (docs/limits.md, #39):
# aiohttp stops reading the socket once its buffer holds twice READ_BUFSIZE_BYTES, and one socket read brings at
# most what the kernel's receive buffer holds, set to SOCKET_RCVBUF_BYTES (the kernel doubles it for its own
# bookkeeping). The rest waits in the kernel's and the server's buffers: TCP's backpressure.
READ_BUFSIZE_BYTES = 1 << 14
SOCKET_RCVBUF_BYTES = 1 << 16
REPLY_HELD_MAX_BYTES = 2 * READ_BUFSIZE_BYTES + 2 * SOCKET_RCVBUF_BYTES  # 160 KiB: the bound of docs/limits.md

T = TypeVar("T")


class OutboundError(Exception):
    """A request that failed: ``kind`` (connect, timeout, too_large, bad_encoding, http) and a redacted message."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = redact(message)
        super().__init__(self.message)


# ------------------------------------------------------------------------------------------- the callers


@dataclass(frozen=True)
class Caller:
    """A path that sends requests. ``drive(base_url, key_env)`` runs it once against ``base_url`` with the API key
    held in environment variable ``key_env`` and returns the text it would show or store (its result or its error);
    it must never raise and must end within ``deadline_s`` whatever the server does."""

    name: str
    what: str
    deadline_s: float
    drive: Callable[[str, str], str] = field(compare=False)


CALLERS: dict[str, Caller] = {}


def register(name: str, what: str, deadline_s: float) -> Callable[[Callable[[str, str], str]],
                                                                   Callable[[str, str], str]]:
    """Decorator: ``drive`` is caller ``name``'s test drive (see :class:`Caller`)."""
    def deco(drive: Callable[[str, str], str]) -> Callable[[str, str], str]:
        CALLERS[name] = Caller(name, what, deadline_s, drive)
        return drive
    return deco


# ------------------------------------------------------------------------------------------- sessions


def env_proxy(url: str) -> tuple[str | None, dict[str, str] | None]:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``, ``NO_PROXY``), and the
    headers that authenticate to it (credentials in the proxy URL are secrets like keys).

    Read once per endpoint at start-up: aiohttp's ``trust_env`` reads the environment and ~/.netrc in a
    thread for every request, which tripled the client's CPU per request (and would add netrc credentials)."""
    u = urlsplit(url)
    if not u.hostname or proxy_bypass(u.hostname):
        return None, None
    proxy = getproxies().get(u.scheme)
    if not proxy:
        return None, None
    p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
    headers = None
    if p.username is not None:
        user, password = unquote(p.username), unquote(p.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        for secret in (password, token):
            add_secret(secret)
        headers = {"Proxy-Authorization": f"Basic {token}"}
        host = p.hostname or ""
        p = p._replace(netloc=(f"[{host}]" if ":" in host else host) + (f":{p.port}" if p.port else ""))
    return urlunsplit(p), headers


def _check(caller: str) -> None:
    if caller not in CALLERS:
        raise RuntimeError(f"outbound caller {caller!r} is not registered (synthwatch.outbound.register)")


def session(caller: str, *, headers: dict[str, str] | None = None, ssl: ssl_.SSLContext | bool = True,
            connect_timeout_s: float | None = None, max_header_bytes: int = MAX_HEADER_BYTES,
            max_headers: int = MAX_HEADERS, limit: int = 16) -> aiohttp.ClientSession:
    """A session for ``caller`` (registered): no environment credentials, no cookies, header limits, replies not
    decompressed by aiohttp (:func:`read_capped` does it, bounded). Use as ``async with``."""
    _check(caller)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ssl=ssl),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s),  # each request's deadline: fetch
        trust_env=False, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
        headers={"User-Agent": USER_AGENT, **(headers or {})},
        max_line_size=max_header_bytes, max_field_size=max_header_bytes, max_headers=max_headers)


def worker_session(caller: str, *, connect_timeout_s: float, max_header_bytes: int,
                   max_headers: int) -> aiohttp.ClientSession:
    """The generation path's session (the worker's requests and the judge's): the same policy as :func:`session`,
    with no connection limit (the run's concurrency is the limit), idle connections dropped after 4 s (before
    common servers drop them: uvicorn's 5 s), and aiohttp's own decompression, which the worker's streamed reader
    counts against ``limits.max_reply_bytes`` as it reads (workers/client.py); the total and idle deadlines are
    the worker's own (per attempt)."""
    _check(caller)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, socket_factory=_bounded_socket),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s), read_bufsize=READ_BUFSIZE_BYTES,
        trust_env=False, cookie_jar=aiohttp.DummyCookieJar(), headers={"User-Agent": USER_AGENT},
        max_line_size=max_header_bytes, max_field_size=max_header_bytes, max_headers=max_headers)


def _bounded_socket(addr_info: Any) -> socket.socket:
    """A socket whose kernel receive buffer is SOCKET_RCVBUF_BYTES (set before connecting, so the TCP window is
    sized by it): the most one read of it can bring into the worker, whatever the pace of reads (#39)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_RCVBUF_BYTES)
    except OSError:
        sock.close()
        raise
    return sock


# ------------------------------------------------------------------------------------------- requests


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes  # decoded (decompressed), at most the cap given to fetch

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def head(self, n: int) -> str:
        """The start of the body as text, for a message: a bounded prefix (16 bytes per character shown), so that
        quoting a reply of megabytes costs kilobytes."""
        return self.body[: 16 * n].decode("utf-8", "replace")

    def quoted(self, n: int = 300) -> str:
        """The start of the body for a message, white space folded: redacted, then clipped to ``n`` characters."""
        return clip(" ".join(self.head(n).split()), n)


def _decompressor(coding: str) -> Any:
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return _Deflate()
    raise OutboundError("bad_encoding", f"reply body in content coding {clip(coding, 40)!r}, which is not read")


class _Deflate:
    """HTTP's "deflate" is zlib-wrapped, but some servers send raw deflate: decided on the first bytes."""

    def __init__(self) -> None:
        self.d: Any = None
        self.unconsumed_tail = b""

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if self.d is None:
            self.d = zlib.decompressobj(zlib.MAX_WBITS if data[:1] and (data[0] & 0x0F) == 8 else -zlib.MAX_WBITS)
        out: bytes = self.d.decompress(data, max_length)
        self.unconsumed_tail = self.d.unconsumed_tail
        return out


async def read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, decompressed with a bounded decompressor; OutboundError ``too_large`` past ``cap`` decoded
    bytes (memory stays about ``cap`` plus one read, whatever the compression ratio)."""
    length = resp.content_length
    coding = resp.headers.get("Content-Encoding", "")
    if length is not None and length > cap and not coding:
        raise OutboundError("too_large", f"reply body of {length:,} bytes (Content-Length) exceeds {cap:,} bytes")
    d = _decompressor(coding)
    pieces: list[bytes] = []
    got = 0
    try:
        while True:
            data = await resp.content.readany()
            if not data:
                break
            while data:
                if d is None:
                    out, data = data, b""
                else:
                    out = d.decompress(data, min(_READ_CHUNK, cap + 1 - got))
                    data = d.unconsumed_tail
                got += len(out)
                if got > cap:
                    raise OutboundError("too_large", f"reply body exceeded {cap:,} bytes (decoded size)")
                pieces.append(out)
                if d is not None and not out and data:
                    break  # the decompressor wants more input before it gives more output
    except zlib.error as exc:
        raise OutboundError("bad_encoding", f"reply body could not be decoded ({exc})") from None
    return b"".join(pieces)


def describe(exc: BaseException, deadline_s: float) -> OutboundError:
    """Any failure of a request as an OutboundError (redacted)."""
    if isinstance(exc, OutboundError):
        return exc
    if isinstance(exc, TimeoutError):
        return OutboundError("timeout", f"no complete reply within the deadline of {deadline_s:g} s")
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return OutboundError("connect", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError) and ("too long" in str(exc).lower()
                                                         or "too many headers" in str(exc).lower()):
        return OutboundError("too_large", f"reply headers over the limits: {type(exc).__name__}: {exc}")
    if isinstance(exc, aiohttp.ClientError | OSError | ValueError):
        return OutboundError("http", f"{type(exc).__name__}: {exc}")
    return OutboundError("internal_error", f"{type(exc).__name__}: {exc}")


async def fetch(sess: aiohttp.ClientSession, method: str, url: str, *, cap: int, deadline_s: float,
                body: bytes | None = None, headers: dict[str, str] | None = None,
                ssl: ssl_.SSLContext | bool | None = None, proxy: str | None = None,
                proxy_headers: dict[str, str] | None = None) -> Reply:
    """One request, read whole: the reply (any status) within ``deadline_s`` in all and ``cap`` decoded bytes, or
    OutboundError (redacted). Redirects are not followed (a 3xx is a reply like any other)."""
    try:
        async with asyncio.timeout(deadline_s):
            kw: dict[str, Any] = {"data": body, "headers": headers, "allow_redirects": False, "proxy": proxy,
                                  "proxy_headers": proxy_headers}
            if ssl is not None:
                kw["ssl"] = ssl
            async with sess.request(method, url, **kw) as resp:
                raw = await read_capped(resp, cap)
                return Reply(resp.status, {k: v for k, v in resp.headers.items()}, raw)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise describe(exc, deadline_s) from None


def run_sync(coro: Awaitable[T]) -> T:
    """asyncio.run, also from a thread whose event loop is already running (a caller inside a loop, or a host such
    as Playwright's sync API): there it runs on a thread of its own with a loop of its own."""
    async def main() -> T:
        return await coro

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="outbound") as pool:
        return pool.submit(asyncio.run, main()).result()
