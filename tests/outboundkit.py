"""A raw socket server that answers EVERY request (any method, any path) with one scripted reply, for the callers of
the outbound client (synthwatch/outbound.py): a probe's GET /models, a webhook's POST, a scrape's GET /metrics.

``reply`` is a :data:`tests.hostileserver.Reply` (a fuzzkit wire, a trickle, a gzip bomb) or a function of the
request's API key returning one (a server that echoes the key back). ``open_connections`` counts the connections
still open: a client that was cancelled closes its own.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import threading
import zlib
from collections.abc import Callable
from typing import Any

from tests.hostileserver import Reply, head, stop_thread_loop
from tests.keyecho import echo


class AnyServer:
    def __init__(self, reply: Reply | Callable[[str], Reply]) -> None:
        self.reply = reply
        self.requests = 0
        self.open_connections = 0
        self.url = ""  # an OpenAI-style base URL (.../v1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> AnyServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: Any) -> None:
        for w in list(self._writers):
            self._loop.call_soon_threadsafe(w.transport.abort)
        stop_thread_loop(self._loop, self._thread, self.server)
        if not self._thread.is_alive():
            self._loop.close()

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0, limit=1 << 20)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self._writers.add(w)
        self.open_connections += 1
        try:
            while True:
                head_ = await r.readuntil(b"\r\n\r\n")
                lines = head_.split(b"\r\n")
                n = next((int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:")),
                         0)
                await r.readexactly(n)
                key = next((line.split(b":", 1)[1].strip() for line in lines
                            if line.lower().startswith(b"authorization:")), b"").decode("utf-8", "replace")
                self.requests += 1
                reply = self.reply
                if getattr(reply, "per_key", False):
                    reply = reply(key.removeprefix("Bearer "))  # type: ignore[call-arg]
                if not await reply(r, w):  # type: ignore[call-arg,arg-type,misc]
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # cancelled: the server is stopping
        finally:
            self.open_connections -= 1
            self._writers.discard(w)
            w.close()


def trickle(interval_s: float = 0.5, ctype: str = "application/json") -> Reply:
    """A 200 whose chunked body never ends: one byte every ``interval_s`` (a slowloris reply)."""
    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(head(ctype=ctype))
        await w.drain()
        while True:
            w.write(b"1\r\n \r\n")
            await w.drain()
            await asyncio.sleep(interval_s)
    return reply


@functools.lru_cache(maxsize=2)
def gzip_bomb(inflated: int = 1 << 30) -> bytes:
    """``inflated`` bytes of a JSON-looking text (spaces), gzipped: 1 GiB is about 1 MB on the wire."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    piece = b" " * (1 << 20)
    out = [c.compress(b"{\"data\": [")]
    for _ in range(inflated // len(piece)):
        out.append(c.compress(piece))
    out.append(c.compress(b"]}") + c.flush())
    return b"".join(out)


def bomb(inflated: int = 1 << 30) -> Reply:
    """A 200 JSON reply of ``inflated`` bytes, gzipped, with honest headers."""
    body = gzip_bomb(inflated)

    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(head("200 OK", "application/json", "Content-Encoding: gzip", length=len(body)) + body)
        await w.drain()
        return True
    return reply


def key_echo(mode: str, status: int = 401) -> Callable[[str], Reply]:
    """A server that answers with the request's key echoed in ``mode`` (tests/keyecho.py's forms, or ``every_field``:
    a 200 chat completion, model list, version and metrics whose every string is the key)."""
    def for_key(key: str) -> Reply:
        if mode == "every_field":
            body = json.dumps({"object": "list", "data": [{"id": key}], "version": key, "id": key, "model": key,
                               "system_fingerprint": key, "choices": [{"index": 0, "finish_reason": "stop",
                                                                        "message": {"role": "assistant",
                                                                                    "content": key,
                                                                                    "reasoning": key}}]}).encode()
            code = 200
        else:
            body = json.dumps({"error": {"message": echo(key, mode), "type": "invalid_request_error"}}).encode()
            code = status

        async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
            w.write(head(f"{code} X", "application/json", length=len(body)) + body)
            await w.drain()
            return True
        return reply

    for_key.per_key = True  # type: ignore[attr-defined]
    return for_key


def gzip_json(doc: Any) -> bytes:
    return gzip.compress(json.dumps(doc).encode(), mtime=0)
