"""One request attempt against an OpenAI-compatible endpoint, over the worker's lean HTTP/1.1 client.

The streamed path parses SSE bytes as they arrive and feeds plain dicts (orjson) to the reasoning
accumulator: no model object per chunk (what makes the openai client ~10x slower per chunk) and no
task wake-up per read. Every failure comes back as an :class:`AttemptResult` with a kind and a
message; nothing raises except cancellation, which the caller records.
"""

from __future__ import annotations

import asyncio
import time

import orjson

from ..reasoning import ResponseShapeError, StreamAccumulator, extract_response
from .http1 import Exchange, HttpClient, HttpFailure
from .results import AttemptResult
from .sse import SSEParser

_MAX_ERROR_BODY = 2000
_ERROR_BODY_READ = 64 * 1024


class Requester:
    """Holds the HTTP connections and the per-run request settings."""

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
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.total_timeout_s = total_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.mode = reasoning_mode
        self.think_open = think_open
        self.think_close = think_close
        self.prefilled_open = prefilled_open
        self._http: HttpClient | None = None

    async def __aenter__(self) -> Requester:
        self._http = HttpClient(connect_timeout_s=self.connect_timeout_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def accumulator(self) -> StreamAccumulator:
        return StreamAccumulator(self.mode, self.think_open, self.think_close, self.prefilled_open)

    async def attempt(self, url: str, body: bytes, headers: dict[str, str], stream: bool,
                      endpoint: str) -> AttemptResult:
        assert self._http is not None, "use `async with Requester(...)`"
        t0 = time.perf_counter()
        acc = self.accumulator() if stream else None
        res = AttemptResult(ok=False, endpoint=endpoint)
        try:
            async with asyncio.timeout(self.total_timeout_s):
                # The idle timeout is the longest silence from sending until a stream ends. A reply that is
                # not streamed arrives only when it is fully generated: minutes of silence are normal there,
                # so only the connect and total timeouts apply to it.
                ex = await self._http.post(url, body, headers, idle_s=self.idle_timeout_s if stream else None)
                try:
                    res.status_code = ex.status
                    if ex.status >= 400:
                        await self._http_error(ex, res)
                    elif stream:
                        assert acc is not None
                        await self._read_stream(ex, acc, res, t0)
                    else:
                        await self._read_whole(ex, res)
                finally:
                    ex.release()
        except HttpFailure as exc:
            res.kind, res.message = exc.kind, exc.message
            if exc.kind == "idle_timeout":
                n = acc.n_chunks if acc is not None else 0
                res.message = (f"no data for {self.idle_timeout_s:g} s (after {time.perf_counter() - t0:.1f} s,"
                               f" {n} chunks received)")
        except TimeoutError:
            res.kind, res.message = "timeout", f"request exceeded the total timeout of {self.total_timeout_s:g} s"
        res.latency_s = time.perf_counter() - t0
        if acc is not None:
            res.n_chunks = acc.n_chunks
            if res.extracted is None:
                res.extracted = acc.result()  # partial text is kept on failures
        return res

    async def _http_error(self, ex: Exchange, res: AttemptResult) -> None:
        status = ex.status
        try:
            raw = await ex.read(_ERROR_BODY_READ)
        except HttpFailure:
            raw = b""
        res.message = f"HTTP {status}: {_error_text(raw)}"
        if status == 429:
            res.kind = "http_429"
            ra = ex.headers.get("retry-after")
            if ra:
                try:
                    res.retry_after_s = min(float(ra), 300.0)
                except ValueError:
                    pass
        elif status >= 500:
            res.kind = "http_5xx"
        elif status == 408:
            res.kind = "http_408"
        else:
            res.kind = f"http_{status}"

    async def _read_stream(self, ex: Exchange, acc: StreamAccumulator, res: AttemptResult, t0: float) -> None:
        ctype = ex.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            raw = await ex.read(_ERROR_BODY_READ)
            if "json" in ctype:
                # some servers answer a stream request with one JSON error object
                res.kind, res.message = "error_body", f"expected an event stream, got JSON: {_error_text(raw)}"
            else:
                res.kind = "bad_content_type"
                res.message = f"expected text/event-stream, got {ctype or 'no content type'}: {_error_text(raw)}"
            return
        parser = SSEParser()
        loads = orjson.loads
        feed = acc.feed
        done = False
        first: float | None = None

        def on_data(data: bytes) -> bool:
            """Runs as bytes arrive; False ends the reply (the connection is then closed)."""
            nonlocal done, first
            for payload in parser.feed(data):
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    chunk = loads(payload)
                except orjson.JSONDecodeError as exc:
                    res.kind = "malformed"
                    res.message = f"malformed stream chunk ({exc}): {_clip(payload)}"
                    return False
                if type(chunk) is not dict:
                    res.kind, res.message = "malformed", f"stream chunk is not an object: {_clip(payload)}"
                    return False
                if feed(chunk) and first is None:
                    first = time.perf_counter()
                if acc.error is not None:
                    res.kind, res.message = "error_body", f"error event in stream: {_error_text(orjson.dumps(acc.error))}"
                    return False
            return True

        await ex.stream(on_data)
        if res.kind:
            return
        if first is not None:
            res.ttft_s = first - t0
        ex_ = acc.result()
        res.extracted = ex_
        if not done:
            if ex_.finish_reason is None:
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

    async def _read_whole(self, ex: Exchange, res: AttemptResult) -> None:
        raw = await ex.read()
        res.ttft_s = None
        ctype = ex.headers.get("content-type", "")
        if "json" not in ctype:
            res.kind = "bad_content_type"
            res.message = f"expected application/json, got {ctype or 'no content type'}: {_error_text(raw)}"
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            res.kind, res.message = "malformed", f"response is not valid JSON ({exc}): {_clip(raw)}"
            return
        if not isinstance(body, dict):
            res.kind, res.message = "malformed", f"response is not a JSON object: {_clip(raw)}"
            return
        try:
            res.extracted = extract_response(body, self.mode, self.think_open, self.think_close, self.prefilled_open)
        except ResponseShapeError as exc:
            res.kind = "error_body" if "error" in body else "malformed"
            res.message = str(exc)
            return
        res.ok = True


def _clip(raw: bytes, n: int = 300) -> str:
    s = raw[:n].decode("utf-8", "replace")
    return s + ("…" if len(raw) > n else "")


def _error_text(raw: bytes) -> str:
    """The server's error message when the body is an OpenAI-style error, else the clipped body."""
    try:
        body = orjson.loads(raw)
        if isinstance(body, dict):
            err = body.get("error", body)
            if isinstance(err, dict):
                msg = err.get("message") or err.get("detail") or err
                return str(msg)[:_MAX_ERROR_BODY]
            return str(err)[:_MAX_ERROR_BODY]
    except orjson.JSONDecodeError:
        pass
    return _clip(raw, _MAX_ERROR_BODY) if raw else "(empty body)"
