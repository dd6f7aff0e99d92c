"""A stream's retained bytes are bounded whatever the pace of its reads (#39, docs/limits.md "Memory").

The simulator runs in a process of its own and sends a 5 MB stream as fast as it can; the worker's reader stalls
(its event loop free, the reply not read). What the worker's process then holds for the stream is measured with
tracemalloc (every byte aiohttp received into it, in this process only): it stays under
``outbound.REPLY_HELD_MAX_BYTES`` while the rest of the reply waits in the kernel's and the server's buffers, and
reading on afterwards gets the whole reply. Before #39 the same stall held 605 KiB (three socket reads of ~200 KiB
each, the kernel's receive buffer having grown to fit them), about 1 MB per stream with the per-event overhead of a
paced stream: 1.9 GB at 2,048 streams on a loaded host. Untimed: what is held, not how fast."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from conftest import run_async, sim_process

from synthwatch import outbound
from synthwatch.config import EndpointConfig, EndpointPoolConfig
from synthwatch.workers.client import Requester
from synthwatch.workers.endpoints import EndpointPool

REASONING_TOKENS = 20_000  # ~5 MB of events: thirty times the bound
SETTLE_S = 1.0  # held bytes not grown this long: the socket is not being read any more (a bound, never a wait)
GIVE_UP_S = 60.0


@pytest.fixture
def fast_sim() -> Iterator[str]:
    """A simulator process sending every stream at once, as one write (base URL)."""
    with sim_process("--reasoning-tokens", str(REASONING_TOKENS),
                     "--content-tokens", "10", "--token-ids", "words") as url:
        yield url


def _body() -> bytes:
    return orjson.dumps({"model": "sim-reasoner", "stream": True, "stream_options": {"include_usage": True},
                         "messages": [{"role": "user", "content": "2 + 2?"}]})


async def _held_while_stalled(base_url: str) -> tuple[int, int]:
    """(bytes held by this process while the reader stalls, bytes of the reply read after the stall)."""
    async with outbound.worker_session("worker", connect_timeout_s=30, max_header_bytes=8190, max_headers=128) as s, \
            s.post(base_url + "/chat/completions", data=_body(),
                   headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        assert await resp.content.readany()  # the stream has started
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            held, since, t0 = 0, time.monotonic(), time.monotonic()
            while time.monotonic() - since < SETTLE_S and time.monotonic() - t0 < GIVE_UP_S:
                await asyncio.sleep(0.1)
                now = tracemalloc.get_traced_memory()[0] - base
                if now > held + 1024:  # a socket read (the loop's own few hundred bytes come and go)
                    since = time.monotonic()
                held = max(held, now)
        finally:
            tracemalloc.stop()
        rest = 0
        while data := await resp.content.readany():
            rest += len(data)
    return held, rest


def test_a_stalled_stream_holds_at_most_the_documented_bound(fast_sim: str) -> None:
    held, rest = run_async(_held_while_stalled(fast_sim))
    bound = outbound.REPLY_HELD_MAX_BYTES
    assert rest > 20 * bound, f"the reply ({rest:,} bytes after the stall) is too short to show a bound"
    assert 0 < held <= bound, f"a stalled stream held {held:,} bytes (bound {bound:,}: docs/limits.md)"


class _StoppedProcess:
    """The stream's live hook (workers/inflight.LiveStream's place): after its first reads the whole event loop
    stops for a while, as a worker held by SIGSTOP or starved by a loaded host is, and the server keeps sending."""

    def __init__(self) -> None:
        self.calls = 0

    def seen(self, acc: Any) -> None:
        self.calls += 1
        if self.calls in (2, 3, 4):
            time.sleep(0.3)


def test_a_stopped_worker_reads_the_whole_stream_after_backpressure(fast_sim: str) -> None:
    """The bounded buffers lose nothing: the stream held back in the kernel while the worker was stopped is read
    whole afterwards, every token of it."""
    async def go() -> Any:
        ep = EndpointPool([EndpointConfig(base_url=fast_sim)], EndpointPoolConfig()).endpoints[0]
        async with Requester(connect_timeout_s=30, total_timeout_s=300, idle_timeout_s=120) as req:
            return await req.attempt(ep, _body(), True, live=_StoppedProcess())

    res = run_async(go())
    assert res.ok, (res.kind, res.message)
    assert res.extracted is not None
    assert res.n_chunks >= REASONING_TOKENS
    assert res.extracted.finish_reason == "stop"
    assert res.extracted.usage["completion_tokens"] >= REASONING_TOKENS + 10
