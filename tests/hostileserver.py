"""A raw socket server that answers one marked prompt with a scripted misbehaviour.

Requests whose body holds ``HOSTILE`` get the case's reply (any bytes, any timing); every other
request gets a valid reply, streamed slowly enough that it is in flight while the hostile one
runs: a case that blocked the worker's event loop would leave those unfinished.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

# writes the reply; returns True when the connection may carry another request (the reply was complete)
Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool | None]]


def sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, index: int = 0, **top: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "sim-reasoner",
                            "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}]}
    body.update(top)
    return body


USAGE = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "sim-reasoner", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}
GOOD_EVENTS = [sse(chunk({"role": "assistant", "reasoning": "Adding the numbers."})),
               sse(chunk({"content": "The answer is in the prompt."})), sse(chunk({}, "stop")), sse(USAGE),
               sse(b"[DONE]")]
GOOD_JSON = json.dumps({
    "id": "c1", "object": "chat.completion", "created": 1, "model": "sim-reasoner",
    "choices": [{"index": 0, "message": {"role": "assistant", "reasoning": "Adding.", "content": "The answer."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}).encode()


def head(status: str = "200 OK", ctype: str = "text/event-stream", *extra: str, chunked: bool = True,
         length: int | None = None, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{version} {status}", f"Content-Type: {ctype}", *extra]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    elif chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(*parts: bytes, end: bool = True) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + (b"0\r\n\r\n" if end else b"")


def stop_thread_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, server: asyncio.Server) -> None:
    """Close a server running on ``loop`` in ``thread``, cancel and await its tasks, then stop the loop."""
    async def stop() -> None:
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


class HostileServer:
    """Runs in a thread of its own (own event loop); ``url`` is an OpenAI-style base URL."""

    def __init__(self, reply: Reply, *, good_delay_s: float = 0.1, models: tuple[str, ...] = ("sim-reasoner",)) -> None:
        self.reply = reply
        self.models = models  # GET /v1/models lists them (`synthwatch run` checks its model there first)
        self.good_delay_s = good_delay_s
        self.hostile_seen = threading.Event()
        self.requests = 0
        self.heads: list[bytes] = []  # every request's head, as received
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> HostileServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: Any) -> None:
        for w in list(self._writers):
            self._loop.call_soon_threadsafe(w.transport.abort)
        stop_thread_loop(self._loop, self._thread, self.server)
        if not self._thread.is_alive():
            self._loop.close()  # else the garbage collector closes it later, from any thread, with a warning

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0, limit=1 << 20)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self._writers.add(w)
        try:
            while True:
                head_ = await r.readuntil(b"\r\n\r\n")
                n = next((int(line.split(b":")[1]) for line in head_.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")), 0)
                body = await r.readexactly(n)
                if head_.startswith(b"GET ") and b"/models " in head_.split(b"\r\n", 1)[0]:
                    listing = json.dumps({"object": "list", "data": [{"id": m, "object": "model"}
                                                                     for m in self.models]}).encode()
                    w.write(head(ctype="application/json", length=len(listing)) + listing)
                    await w.drain()
                    continue
                self.requests += 1
                self.heads.append(head_)
                if b"HOSTILE" in body:
                    self.hostile_seen.set()
                    if not await self.reply(r, w):
                        return  # whatever the case did, this connection is done
                    continue
                await self._good(w, b'"stream":true' in body)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(w)
            w.close()

    async def _good(self, w: asyncio.StreamWriter, stream: bool) -> None:
        if not stream:
            await asyncio.sleep(self.good_delay_s * 3)
            w.write(head(ctype="application/json", length=len(GOOD_JSON)) + GOOD_JSON)
            await w.drain()
            return
        w.write(head())
        for ev in GOOD_EVENTS:
            await asyncio.sleep(self.good_delay_s)
            w.write(chunked(ev, end=False))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
