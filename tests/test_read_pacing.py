"""Read pacing of streams that trickle (#39 item 1, workers/read_pacing.py).

A simulator in a process of its own paces one stream at 40 tokens/s, one write per token. Read as it comes, the
worker reads each segment on its own on an idle machine (~120 reads); paced, after its first second the stream is
read at most once per tick, so the reads are bounded by the warm-up's tokens plus the stream's duration over the
interval, whatever the machine's load (a loaded host only merges more segments per read). The text is the same
either way, and the first token is never held. Untimed: the bound comes from the measured duration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from conftest import run_async, sim_process

from synthwatch.config import EndpointConfig, EndpointPoolConfig
from synthwatch.workers.client import Requester
from synthwatch.workers.endpoints import EndpointPool
from synthwatch.workers.read_pacing import ReadPacer

TOKENS_PER_S = 40
REASONING, CONTENT = 100, 20  # 3 s per stream
INTERVAL_MS = 250


@pytest.fixture(scope="module")
def paced_sim() -> Iterator[str]:
    with sim_process("--tokens-per-s", str(TOKENS_PER_S),
                     "--reasoning-tokens", str(REASONING), "--content-tokens", str(CONTENT)) as url:
        yield url


class _Reads:
    """The stream's live hook (LiveStream's place): counts the reads, one call after each."""

    def __init__(self) -> None:
        self.calls = 0

    def seen(self, acc: Any) -> None:
        self.calls += 1


def _attempt(base_url: str, batch_ms: int, idle_timeout_s: float = 120) -> tuple[Any, int]:
    body = orjson.dumps({"model": "sim-reasoner", "stream": True, "stream_options": {"include_usage": True},
                         "messages": [{"role": "user", "content": "Pace me."}]})

    async def go() -> tuple[Any, int]:
        ep = EndpointPool([EndpointConfig(base_url=base_url)], EndpointPoolConfig()).endpoints[0]
        reads = _Reads()
        async with Requester(connect_timeout_s=30, total_timeout_s=300, idle_timeout_s=idle_timeout_s,
                             read_batch_ms=batch_ms) as req:
            res = await req.attempt(ep, body, True, live=reads)
        return res, reads.calls

    return run_async(go())


def test_a_paced_stream_is_read_once_per_tick_after_its_warm_up(paced_sim: str) -> None:
    res, reads = _attempt(paced_sim, INTERVAL_MS)
    assert res.ok, (res.kind, res.message)
    assert res.n_chunks >= REASONING + CONTENT
    warm_up_reads = TOKENS_PER_S * 1.0 + 5  # the first second is read as it comes (ReadPacer.warmup_s)
    bound = warm_up_reads + res.latency_s / (INTERVAL_MS / 1000) + 3
    assert bound < REASONING + CONTENT, "the bound must be below one read per token, or this shows nothing"
    assert reads <= bound, f"{reads} reads of a {res.latency_s:.1f} s stream paced at {INTERVAL_MS} ms (bound {bound:.0f})"
    assert res.ttft_s is not None and res.ttft_s < 1.0  # the first token is never held


def test_pacing_changes_no_text(paced_sim: str) -> None:
    paced, _ = _attempt(paced_sim, INTERVAL_MS)
    unpaced, _ = _attempt(paced_sim, 0)
    assert paced.ok and unpaced.ok, (paced.message, unpaced.message)
    assert paced.extracted.reasoning == unpaced.extracted.reasoning
    assert paced.extracted.content == unpaced.extracted.content
    assert paced.n_chunks == unpaced.n_chunks
    assert paced.extracted.reasoning and paced.extracted.content


def test_pacing_stays_under_a_short_idle_timeout(paced_sim: str) -> None:
    """A held stream is silent to the idle timeout: the interval is at most a quarter of it, so a stream that keeps
    sending is never ended as idle (a token every 25 ms, idle timeout 2 s, pacing asked at 8 s)."""
    res, _ = _attempt(paced_sim, 8000, idle_timeout_s=2.0)
    assert res.ok, (res.kind, res.message)
    assert res.n_chunks >= REASONING + CONTENT


def test_the_pacer_resumes_what_it_held_and_ignores_a_closed_transport() -> None:
    """A held transport is resumed at the tick, and at close; one closed meanwhile is skipped without an error."""
    import asyncio
    import socket
    import time

    async def go() -> list[bool]:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        c, d = socket.socketpair()
        tr1, _ = await loop.create_connection(asyncio.Protocol, sock=a)
        tr2, _ = await loop.create_connection(asyncio.Protocol, sock=c)
        pacer = ReadPacer(loop, 0.05)
        pacer.hold(tr1)
        pacer.hold(tr2)
        states = [tr1.is_reading(), tr2.is_reading()]
        tr2.close()
        deadline = time.monotonic() + 60
        while pacer.held and time.monotonic() < deadline:  # the tick: readiness, not a fixed time
            await asyncio.sleep(0.01)
        states += [tr1.is_reading(), pacer.handle is None]
        pacer.hold(tr1)
        pacer.close()
        states.append(tr1.is_reading())
        tr1.close()
        b.close()
        d.close()
        return states

    assert run_async(go()) == [False, False, True, True, True]
