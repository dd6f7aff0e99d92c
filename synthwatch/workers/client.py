"""One request attempt against an OpenAI-compatible endpoint, over aiohttp.

HTTP is aiohttp's (its C parser, connection pool, TLS, proxies); what is
ours is the SSE parsing, the capture and the bookkeeping. The streamed path hands each read of
the response body (``readany``: whatever the socket delivered) straight to the SSE parser and
feeds plain dicts (orjson) to the reasoning accumulator: no model object per chunk and no
per-read timer (the idle timeout is one lazily re-armed timer per request).

Every failure comes back as an :class:`AttemptResult` with a kind and a message, secrets
redacted; nothing raises except cancellation, which the caller records. Limits (body size, one
event's size, header sizes) end the attempt with a kind of their own; a redirect is not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import http_exceptions

from ..capture.choices import ChoiceStreams, choice_usage, split_response
from ..capture.logprobs import pack_extracted as pack_logprobs
from ..capture.reasoning import Extracted, ResponseShapeError, extract_response
from ..capture.safety import DEEP_MIN_BYTES, LARGE_REPLY_BYTES, MAX_JSON_DEPTH, depth_over, loads_reply, may_be_deep
from ..capture.stream import StreamAccumulator
from ..capture.token_count import reasoning_from_ids
from ..config import LimitsConfig
from ..outbound import register, run_sync, worker_session
from ..redact import clip, redact
from ..settings import get_settings
from .endpoints import Endpoint
from .read_pacing import ReadPacer
from .results import AttemptResult
from .sse import SSEParser

_MAX_ERROR_BODY = 2000
_NO_IDLE = contextlib.nullcontext()  # a reply that is not streamed has no idle timeout
_ERROR_BODY_READ = 64 * 1024
_AFTER_DONE_S = 1.0  # how long the end of a body is awaited after [DONE] before the connection is dropped
_AFTER_DONE_BYTES = 64 * 1024  # bytes after [DONE] read (and ignored) at most


class _Limit(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _IdleWatch:
    """The idle timeout: no body bytes for ``idle_s`` ends the request.

    One timer per request, re-armed only when it fires (to ``last + idle_s`` if bytes came since),
    so a read costs one clock call instead of cancelling and scheduling a timer."""

    __slots__ = ("cm", "fired", "handle", "idle_s", "last", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, cm: asyncio.Timeout, idle_s: float) -> None:
        self.loop, self.cm, self.idle_s = loop, cm, idle_s
        self.fired = False
        self.last = loop.time()
        self.handle = loop.call_at(self.last + idle_s, self._check)

    def _check(self) -> None:
        due = self.last + self.idle_s
        now = self.loop.time()
        if now >= due:
            self.fired = True
            self.cm.reschedule(now)  # cancels the request's task; the timeout context turns it into TimeoutError
        else:
            self.handle = self.loop.call_at(due, self._check)

    def cancel(self) -> None:
        self.handle.cancel()


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Retry-After as seconds to wait: a number of seconds or an HTTP date (RFC 9110), at most 300; None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return min(max(float(value), 0.0), 300.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return min(max(when.timestamp() - (time.time() if now is None else now), 0.0), 300.0)


class Requester:
    """Holds the HTTP session (connection pool) and the per-run request settings."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        total_timeout_s: float,
        idle_timeout_s: float,
        reasoning_mode: str = "auto",
        think_open: str = "<think>",
        think_close: str = "</think>",
        prefilled_open: bool = False,
        limits: LimitsConfig | None = None,
        think_ids: tuple[list[int], list[int]] | None = None,
        caller: str = "worker",
        read_batch_ms: int | None = None,
    ) -> None:
        self.caller = caller  # the outbound caller this requester sends for (worker, judge)
        self.connect_timeout_s = connect_timeout_s
        self.total_timeout_s = total_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.mode = reasoning_mode
        self.think_open = think_open
        self.think_close = think_close
        self.prefilled_open = prefilled_open
        self.limits = limits or LimitsConfig()
        # (think-open ids, think-close ids) of the run's tokenizer: the reasoning tokens of a reply with ids
        self.think_ids = think_ids
        self._session: aiohttp.ClientSession | None = None
        # read pacing of streams that trickle (workers/read_pacing.py); 0: every segment is read as it comes
        self.read_batch_ms = get_settings().stream_read_batch_ms if read_batch_ms is None else read_batch_ms
        self._pacer: ReadPacer | None = None

    async def __aenter__(self) -> Requester:
        lim = self.limits
        if self.read_batch_ms > 0:
            # never a quarter of the idle timeout or more: a held stream must not look silent to it
            interval_s = min(self.read_batch_ms / 1000, self.idle_timeout_s / 4)
            self._pacer = ReadPacer(asyncio.get_running_loop(), interval_s)
        # the one door out (synthwatch/outbound.py): no environment credentials, no cookies, the header limits;
        # proxies: each endpoint's, from the environment at start-up (outbound.env_proxy), not trust_env
        self._session = worker_session(self.caller, connect_timeout_s=self.connect_timeout_s,
                                       max_header_bytes=lim.max_header_bytes, max_headers=lim.max_headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pacer is not None:
            self._pacer.close()
            self._pacer = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def accumulator(self) -> StreamAccumulator:
        return StreamAccumulator(self.mode, self.think_open, self.think_close, self.prefilled_open)

    async def attempt(self, ep: Endpoint, body: bytes, stream: bool, live: Any = None,
                      n_choices: int = 1) -> AttemptResult:
        """One request. ``live``: the stream's synthwatch.workers.inflight.LiveStream, told after each read.
        ``n_choices``: the choices the body asks for (its ``n``); with more than one, each choice that came is in
        ``res.choices`` (capture/choices.py)."""
        session = self._session
        assert session is not None, "use `async with Requester(...)`"
        t0 = time.perf_counter()
        acc: Any = (self.accumulator() if n_choices == 1 else ChoiceStreams(self.accumulator, n_choices)) \
            if stream else None
        res = AttemptResult(ok=False, endpoint=ep.label)
        watch: _IdleWatch | None = None
        try:
            async with asyncio.timeout(self.total_timeout_s):
                # The idle timeout is the longest silence from sending until a stream ends. A reply that is
                # not streamed arrives only when it is fully generated: minutes of silence are normal there,
                # so only the connect and total timeouts apply to it.
                idle_cm = asyncio.timeout(None) if stream else None
                async with idle_cm or _NO_IDLE:
                    if idle_cm is not None:
                        watch = _IdleWatch(asyncio.get_running_loop(), idle_cm, self.idle_timeout_s)
                    async with session.post(ep.url, data=body, headers=ep.headers, allow_redirects=False,
                                            ssl=ep.ssl, proxy=ep.proxy, proxy_headers=ep.proxy_headers) as resp:
                        status = res.status_code = resp.status
                        if status >= 300 or status < 200:
                            await self._not_ok(resp, res)
                        elif acc is not None:
                            await self._read_stream(resp, acc, res, t0, watch, live)
                        else:
                            await self._read_whole(resp, res, n_choices)
        except _Limit as exc:
            res.kind, res.message = exc.kind, exc.message
        except aiohttp.ConnectionTimeoutError:
            res.kind = "connect_timeout"
            res.message = f"no connection within the connect timeout of {self.connect_timeout_s:g} s"
        except TimeoutError:
            if watch is not None and watch.fired:
                res.kind = "idle_timeout"
                n = acc.n_chunks if acc is not None else 0
                what = "reply headers" if res.status_code is None else "data"
                res.message = (f"no {what} for {self.idle_timeout_s:g} s (after {time.perf_counter() - t0:.1f} s,"
                               f" {n} chunks received)")
            else:
                res.kind = "timeout"
                res.message = f"request exceeded the total timeout of {self.total_timeout_s:g} s"
        except aiohttp.ClientError as exc:
            res.kind, res.message = _client_error(exc, self.limits)
        except OSError as exc:
            res.kind, res.message = "connect", f"{exc.__class__.__name__}: {exc}"
        except Exception as exc:  # a bug or a case nobody foresaw: recorded on the record, never raised
            res.kind, res.message = "internal_error", f"{exc.__class__.__name__}: {exc}"
        finally:
            if watch is not None:
                watch.cancel()
        res.latency_s = time.perf_counter() - t0
        if acc is not None:
            res.n_chunks = acc.n_chunks
            if n_choices > 1:
                res.choices = acc.results()
                res.extracted = res.choices[0][1]
            if res.extracted is None:
                res.extracted = acc.result()  # partial text is kept on failures
            if not res.ok:
                for _, one in res.choices or [(0, res.extracted)]:
                    _bound_partial(one, self.limits.max_partial_chars)
        for _, ex in res.choices or [(0, res.extracted)]:
            if ex is not None and ex.token_ids is not None and self.think_ids is not None:
                split = reasoning_from_ids(ex.token_ids, self.think_ids[0], self.think_ids[1], ex.reasoning,
                                           ex.content)
                if split is not None:
                    ex.reasoning_ids = split
            if ex is not None:
                pack_logprobs(ex, self.limits.max_logprobs_bytes)  # each choice's logprobs -> its compact column (#38)
        if res.message:
            res.message = redact(res.message)
        return res

    async def _read_some(self, resp: aiohttp.ClientResponse, n: int) -> bytes:
        """Up to ``n`` bytes of the body (for messages): whatever arrives, without waiting for the rest."""
        pieces: list[bytes] = []
        got = 0
        try:
            while got < n:
                data = await resp.content.readany()
                if not data:
                    break
                pieces.append(data)
                got += len(data)
        except (aiohttp.ClientError, OSError):
            pass
        return b"".join(pieces)[:n]

    async def _not_ok(self, resp: aiohttp.ClientResponse, res: AttemptResult) -> None:
        status = resp.status
        if 300 <= status < 400:
            loc = resp.headers.get("Location")
            res.kind = "redirect"
            res.message = (f"HTTP {status} redirect to {_clip(loc.encode(), 500) if loc else '(no Location)'}"
                           " (not followed: set base_url to the final address)")
            return
        if status < 200:
            res.kind, res.message = "http_error", f"unexpected interim reply HTTP {status} {resp.reason or ''}".strip()
            return
        raw = await self._read_some(resp, _ERROR_BODY_READ)
        res.message = f"HTTP {status}: {_error_text(raw)}"
        if status in (429, 503):
            res.retry_after_s = retry_after(resp.headers.get("Retry-After"))
        if status == 429:
            res.kind = "http_429"
        elif status >= 500:
            res.kind = "http_5xx"
        elif status == 408:
            res.kind = "http_408"
        else:
            res.kind = f"http_{status}"

    async def _read_stream(self, resp: aiohttp.ClientResponse, acc: StreamAccumulator, res: AttemptResult,
                           t0: float, watch: _IdleWatch | None, live: Any = None) -> None:
        ctype = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in ctype:
            raw = await self._read_some(resp, _ERROR_BODY_READ)
            if "json" in ctype:
                # some servers answer a stream request with one JSON error object
                res.kind, res.message = "error_body", f"expected an event stream, got JSON: {_error_text(raw)}"
            else:
                res.kind = "bad_content_type"
                res.message = f"expected text/event-stream, got {ctype or 'no content type'}: {_error_text(raw)}"
            return
        parser = SSEParser()
        max_event = self.limits.max_event_bytes
        max_reply = self.limits.max_reply_bytes
        total = 0
        loads = orjson.loads
        feed = acc.feed
        parse = parser.feed
        readany = resp.content.readany
        clock = watch.loop.time if watch is not None else time.monotonic
        done = False
        first: float | None = None
        # read pacing (workers/read_pacing.py): after a small read of a stream older than the warm-up, its
        # transport waits for the pacer's next tick, so that the next read brings several events at once
        pacer = self._pacer
        conn = resp.connection
        transport = conn.transport if pacer is not None and conn is not None else None
        hold = pacer.hold if pacer is not None and transport is not None else None  # None: this stream is not paced
        small = pacer.small_read_bytes if pacer is not None else 0
        pace_from = clock() + pacer.warmup_s if pacer is not None else 0.0
        while not done:
            data = await readany()
            now = clock()
            if watch is not None:
                watch.last = now
            if not data:
                payloads = parser.flush()  # the end of the body: a held trailing \r ends a line
                if not payloads:
                    break
            else:
                total += len(data)  # decoded bytes: a compressed stream counts as what it inflates to
                if total > max_reply:
                    raise _Limit("reply_too_large", f"the streamed reply exceeded {max_reply:,} bytes"
                                 f" (limits.max_reply_bytes; decoded size) after {acc.n_chunks} chunks")
                payloads = parse(data)
                if parser.held > max_event:
                    raise _Limit("event_too_large", f"one stream event exceeded {max_event:,} bytes"
                                 f" (limits.max_event_bytes) after {acc.n_chunks} chunks: {_clip(parser.pending())}")
            for payload in payloads:
                if payload == b"[DONE]":
                    done = True
                    break  # anything after [DONE] is not part of the reply
                try:
                    chunk = loads(payload)
                except orjson.JSONDecodeError as exc:
                    res.kind = "malformed"
                    res.message = f"malformed stream chunk ({exc}): {_clip(payload)}"
                    return
                if type(chunk) is not dict:
                    res.kind, res.message = "malformed", f"stream chunk is not an object: {_clip(payload)}"
                    return
                # the length first, here: a call per event for the usual ~250-byte event was ~2 % of a record
                if len(payload) > DEEP_MIN_BYTES and may_be_deep(payload) and depth_over(chunk):
                    res.kind, res.message = "reply_too_deep", _too_deep(payload)
                    return
                if feed(chunk) and first is None:
                    first = time.perf_counter()
                if acc.error is not None:
                    res.kind, res.message = "error_body", f"error event in stream: {_error_text(orjson.dumps(acc.error))}"
                    return
            if live is not None:
                live.seen(acc)  # the stream's in-flight checks and live view (workers/inflight.py)
            if not data:
                break
            # never once the reply is complete: the connection then goes back to the pool (or is drained for
            # it), and a held one would make the next request on it wait for the tick
            if hold is not None and first is not None and len(data) < small and now >= pace_from and not done \
                    and not resp.content.is_eof():
                hold(transport)
            # Not kept while the next read waits: the last read and its events, held by these names across the
            # await, were ~1 MB per stream on a loaded host (1.9 GB at 2,048 streams, #39; docs/benchmarks.md).
            del data, payloads
        if done and not resp.content.is_eof():
            if watch is not None:
                watch.cancel()  # the reply is complete: only the short wait for the body's end is left
            await self._drain_after_done(resp)
        if first is not None:
            res.ttft_s = first - t0
        ex_ = acc.result()
        res.extracted = ex_
        if not done:
            if ex_.finish_reason is None or acc.finish_reason is None:  # n > 1: any choice unfinished
                res.kind = "dropped"
                res.message = f"stream ended without [DONE] or finish_reason after {acc.n_chunks} chunks"
                leftover = parser.pending()
                if leftover:
                    res.message += f"; unfinished event: {_clip(leftover)}"
                return
        if acc.n_chunks == 0:
            res.kind, res.message = "malformed", "stream held no chunks"
            return
        res.ok = True

    async def _drain_after_done(self, resp: aiohttp.ClientResponse) -> None:
        """The reply is complete at [DONE]; the body's end usually follows at once, and reading it keeps
        the connection for the next request. A server that keeps sending or stays silent loses it."""
        got = 0
        try:
            async with asyncio.timeout(_AFTER_DONE_S):
                while got <= _AFTER_DONE_BYTES:
                    data = await resp.content.readany()
                    if not data:
                        return
                    got += len(data)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        resp.close()  # the body did not end properly: the connection is not reused

    async def _read_whole(self, resp: aiohttp.ClientResponse, res: AttemptResult, n: int = 1) -> None:
        # the smaller of the two limits that apply to a reply that is not streamed, each its own error kind
        lim = self.limits
        kind, cap, name = ("body_too_large", lim.max_body_bytes, "max_body_bytes") \
            if lim.max_body_bytes <= lim.max_reply_bytes else ("reply_too_large", lim.max_reply_bytes, "max_reply_bytes")
        length = resp.content_length
        if length is not None and length > cap and not resp.headers.get("Content-Encoding"):
            raise _Limit(kind, f"reply body of {length:,} bytes (Content-Length) exceeds {cap:,} bytes (limits.{name})")
        # The body grows in one buffer, each piece released as it is added: a list of pieces joined at the end held
        # the body twice, and with the parsed text three times (#34). A reply in one piece is used as it came.
        raw: bytes | bytearray = b""
        buf: bytearray | None = None
        got = 0
        readany = resp.content.readany
        while data := await readany():
            got += len(data)
            if got > cap:
                raise _Limit(kind, f"reply body exceeded {cap:,} bytes (limits.{name}; decoded size)")
            if buf is not None:
                buf += data
            elif raw:
                buf = bytearray(raw)
                buf += data
                raw = b""
            else:
                raw = data
        if buf is not None:
            raw, buf = buf, None
        res.ttft_s = None
        ctype = resp.headers.get("Content-Type", "")
        if "json" not in ctype:
            res.kind = "bad_content_type"
            res.message = f"expected application/json, got {ctype or 'no content type'}: {_error_text(raw)}"
            return
        deep = may_be_deep(raw)
        # the error messages' start: loads_reply empties a large reply's buffer to let its bytes go while it parses
        head = bytes(raw[:4096]) if len(raw) >= LARGE_REPLY_BYTES else raw
        try:
            body = loads_reply(raw)
        except json.JSONDecodeError as exc:  # orjson's error is one too
            res.kind, res.message = "malformed", f"response is not valid JSON ({exc}): {_clip(head)}"
            return
        if not isinstance(body, dict):
            res.kind, res.message = "malformed", f"response is not a JSON object: {_clip(head)}"
            return
        if deep and depth_over(body):
            res.kind, res.message = "reply_too_deep", _too_deep(raw)
            return
        del raw  # the body is parsed: its bytes are not kept while the record is built
        try:
            if n > 1:  # each choice read on its own (capture/choices.py)
                res.choices = []
                split = split_response(body)
                for i, one in split:
                    ex = extract_response(one, self.mode, self.think_open, self.think_close, self.prefilled_open)
                    choice_usage(ex, None, body.get("usage"), n, i, len(split) == 1)
                    res.choices.append((i, ex))
                res.extracted = res.choices[0][1]
            else:
                res.extracted = extract_response(body, self.mode, self.think_open, self.think_close,
                                                 self.prefilled_open)
        except ResponseShapeError as exc:
            res.kind = "error_body" if "error" in body else "malformed"
            res.message = str(exc)
            return
        res.ok = True


def _client_error(exc: aiohttp.ClientError, limits: LimitsConfig) -> tuple[str, str]:
    """The recorded kind and message of an aiohttp failure."""
    text = f"{exc.__class__.__name__}: {exc}"
    cause: Any = exc.__cause__
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, TLS handshake, certificate
        return "connect", text
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "dropped", f"the server closed the connection before the reply ended ({text})"
    if isinstance(exc, aiohttp.ClientPayloadError):
        if "decode" in str(exc).lower() or "encoding" in str(exc).lower() and "transfer" not in str(exc).lower():
            return "bad_encoding", f"reply body could not be decoded ({text})"
        if isinstance(cause, http_exceptions.ContentLengthError) or "not completed" in str(exc) \
                or "Not enough data" in str(exc):
            return "dropped", f"the connection ended before the reply did ({text})"
        return "http_error", f"invalid reply body framing ({text})"
    if isinstance(exc, aiohttp.ClientResponseError):
        low = str(exc).lower()
        if isinstance(cause, http_exceptions.LineTooLong) or "too long" in low or "got more than" in low:
            return "header_too_large", (f"a reply header line exceeded {limits.max_header_bytes:,} bytes"
                                        f" (limits.max_header_bytes): {text}")
        if "too many headers" in low:
            return "header_too_large", f"the reply had more than {limits.max_headers} headers (limits.max_headers)"
        return "http_error", f"not a valid HTTP reply ({text})"
    if isinstance(exc, aiohttp.ClientOSError):
        return "dropped", f"the connection failed during the request ({text})"
    if isinstance(exc, aiohttp.InvalidURL):
        return "connect", text
    return "http_error", text


def _too_deep(raw: bytes | bytearray) -> str:
    return (f"reply nests JSON more than {MAX_JSON_DEPTH} levels deep (more than can be stored; see docs/limits.md):"
            f" {_clip(raw, 100)}")


def _bound_partial(ex: Extracted | None, n: int) -> None:
    """Cut the text kept from a failed attempt to ``n`` characters each (limits.max_partial_chars), noted."""
    if ex is None:
        return
    cut = False
    if len(ex.reasoning) > n:
        ex.reasoning, cut = ex.reasoning[:n], True
    if len(ex.content) > n:
        ex.content, cut = ex.content[:n], True
    if ex.raw_content is not None and len(ex.raw_content) > n:
        ex.raw_content, cut = ex.raw_content[:n], True
    for k, v in list(ex.unread_fields.items()):
        if len(v) > n:
            ex.unread_fields[k], cut = v[:n], True
    if cut:
        ex.problems.append(f"partial text of the failed attempt cut to {n:,} characters each (limits.max_partial_chars)")


def _clip(raw: bytes | bytearray, n: int = 300) -> str:
    # redacted before the cut (redact.clip): a key echoed across the cut would otherwise be kept minus its end
    return clip(raw.decode("utf-8", "replace"), n)


def _error_text(raw: bytes | bytearray) -> str:
    """The server's error message when the body is an OpenAI-style error, else the clipped body."""
    try:
        body = orjson.loads(raw)
        if isinstance(body, dict):
            err = body.get("error", body)
            if isinstance(err, dict):
                msg = err.get("message") or err.get("detail") or err
                return clip(str(msg), _MAX_ERROR_BODY, "")
            return clip(str(err), _MAX_ERROR_BODY, "")
    except orjson.JSONDecodeError:
        pass
    return _clip(raw, _MAX_ERROR_BODY) if raw else "(empty body)"


@register("worker", "the run's generation requests (workers/client.py Requester.attempt), streamed", 8.0)
def _drive_worker(base_url: str, key_env: str) -> str:
    """One streamed attempt against ``base_url`` (the outbound module's test drive): the recorded message."""
    from ..config import EndpointConfig, EndpointPoolConfig
    from .endpoints import EndpointPool

    async def go() -> str:
        ep = EndpointPool([EndpointConfig(base_url=base_url, api_key_env=key_env)], EndpointPoolConfig()).endpoints[0]
        async with Requester(connect_timeout_s=2.0, total_timeout_s=5.0, idle_timeout_s=2.0) as req:
            res = await req.attempt(ep, orjson.dumps({"model": "m", "stream": True, "messages": []}), True)
        return f"{res.kind}: {res.message}"

    return run_sync(go())
