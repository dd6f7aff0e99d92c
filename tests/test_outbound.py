"""One door out (#34): every outbound request goes through synthwatch/outbound.py, with a total deadline, a decoded
size cap and redacted errors. The attacks of issue 34 against the dashboard's probe button, replayed against a real
`synthwatch serve` (a trickling server, 42 of them at once, a gzip bomb, a client that goes away), and the webhook
and the server-metrics scraper against slow and huge servers."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S, popen_cli, run_async, wait_http_ready

from synthwatch.app import probe_button
from synthwatch.outbound import OutboundError, fetch, run_sync, session
from synthwatch.quality.notify import Notifier
from synthwatch.workers.server_metrics import Scraper
from tests.outboundkit import AnyServer, bomb, trickle

MiB = 2**20
FORM = {"endpoints": "", "model": "HOSTILE", "dataset": "", "api_key_env": "", "concurrency": "4", "max_tokens": "64"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str], int]]:
    """A real `synthwatch serve` on a database holding one run; (its URL, the process, the run's id)."""
    from synthwatch.store import queue as store
    from synthwatch.store.db import open_engine

    db = tmp_path / "d.db"
    engine = open_engine(str(db))
    with engine.connect() as conn, store.write_begin(conn):
        run_id = store.create_run(conn, "busy", None)
    engine.dispose()
    port = _free_port()
    proc = popen_cli("serve", "--db", str(db), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(url, proc)
        yield url, proc, run_id
    finally:
        proc.kill()
        proc.communicate()


def _probe(url: str, base_url: str, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = httpx.post(url + "/runs/new/probe", data={**FORM, "endpoints": base_url}, timeout=timeout_s)
    return r.status_code, r.text, time.monotonic() - t0


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_probe_button_against_a_trickling_server_answers_within_its_deadline(dashboard) -> None:  # type: ignore[no-untyped-def]
    """Issue 34: a server that trickles its reply got no answer from the probe button in 200 s (httpx's per-read
    timeout never fired). Now the probe ends within its 30 s deadline with a line that says why."""
    url, _, _ = dashboard
    with AnyServer(trickle(0.5)) as server:
        status, text, took = _probe(url, server.url)
    assert took < probe_button.DEADLINE_S + 10, took
    assert status == 400 and "probe:" in text, text[:500]
    assert "deadline" in text or "no complete reply within" in text, text[:2000]


@pytest.mark.slow
def test_many_trickling_probes_leave_pages_and_pause_answering(dashboard) -> None:  # type: ignore[no-untyped-def]
    """Issue 34: 42 probes of a trickling server held every request thread, and every page and API (pause and stop
    included) hung for as long as the server trickled. Now they run on the loop, at most MAX_RUNNING at once (the
    rest answered 429 at once), and a page and a pause answer promptly meanwhile."""
    url, _, run_id = dashboard
    results: list[tuple[int, str, float]] = []
    with AnyServer(trickle(0.5)) as server:
        threads = [threading.Thread(target=lambda: results.append(_probe(url, server.url))) for _ in range(42)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while server.requests < probe_button.MAX_RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)  # the probes are running (the server has their requests)
        assert server.requests >= 1
        t0 = time.monotonic()
        page = httpx.get(url + "/runs", timeout=HTTP_TIMEOUT_S)
        pause = httpx.post(url + f"/api/runs/{run_id}/control", json={"action": "pause"}, timeout=HTTP_TIMEOUT_S)
        api = httpx.get(url + "/api/runs", timeout=HTTP_TIMEOUT_S)
        took = time.monotonic() - t0
        for t in threads:
            t.join(probe_button.DEADLINE_S + 30)
    assert page.status_code == 200 and pause.status_code == 200 and api.status_code == 200, (pause.text, api.text)
    assert took < 10, f"a page, a pause and the API took {took:.1f} s while 42 probes trickled"
    assert len(results) == 42
    statuses = sorted(s for s, _, _ in results)
    assert set(statuses) <= {400, 429}, statuses
    assert statuses.count(429) >= 42 - probe_button.MAX_RUNNING - 2, statuses  # a few may start as others end
    busy = next(t for s, t, _ in results if s == 429)
    assert "probes are running already" in busy
    assert max(took for _, _, took in results) < probe_button.DEADLINE_S + 15


@pytest.mark.slow
def test_a_gzip_bomb_to_the_probe_button_keeps_the_dashboard_small(dashboard) -> None:  # type: ignore[no-untyped-def]
    """Issue 34: a 1 MB gzip reply took the dashboard from 109 MB to 1.23 GB. The outbound client inflates a reply
    only up to its cap (8 MiB for the probe) with a bounded decompressor: the peak RSS of the real `synthwatch
    serve` process grows by far less than the bomb's 1 GiB."""
    url, proc, _ = dashboard
    httpx.get(url + "/runs/new", timeout=HTTP_TIMEOUT_S)
    before = _peak_rss_mb(proc.pid)
    with AnyServer(bomb(1 << 30)) as server:
        status, text, took = _probe(url, server.url)
        assert server.requests >= 1
    grown = _peak_rss_mb(proc.pid) - before
    assert status == 400 and "probe:" in text, text[:500]
    assert "exceeded" in text or "too large" in text or "bytes" in text, text[:2000]
    assert grown < 150, f"the dashboard's peak RSS grew by {grown:.0f} MB for a 1 MB gzip bomb"
    assert took < probe_button.DEADLINE_S + 10


@pytest.mark.slow
def test_a_probe_is_cancelled_when_its_client_goes_away(dashboard) -> None:  # type: ignore[no-untyped-def]
    """The browser leaves (its request times out): the probe's own requests to the server are cancelled at once,
    not left trickling until the deadline."""
    url, _, _ = dashboard
    with AnyServer(trickle(0.2)) as server:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/runs/new/probe", data={**FORM, "endpoints": server.url}, timeout=3.0)
        left = time.monotonic()
        while server.open_connections and time.monotonic() < left + 10:
            time.sleep(0.05)
        gone_after = time.monotonic() - left
        assert server.open_connections == 0, "the probe still holds its connection after its client went away"
    assert gone_after < 5, gone_after


def test_a_webhook_to_a_trickling_receiver_ends_within_its_timeout() -> None:
    """A receiver that trickles its reply held the webhook thread forever (urllib's timeout is per read): the
    next alarms queued behind it. Now each post ends within timeout_s, counted as failed."""
    with AnyServer(trickle(0.2)) as server:
        n = Notifier(server.url + "/hook", timeout_s=1.0)
        t0 = time.monotonic()
        n.send({"event": "alarm", "alarm": {"rule": "r", "title": "t"}, "run": {"name": "x"}})
        while n.failed == 0 and time.monotonic() < t0 + 15:
            time.sleep(0.05)
        took = time.monotonic() - t0
        n.close()
    assert n.failed == 1 and n.sent == 0, (n.failed, n.sent)
    assert took < 5, took


def test_a_webhook_receivers_gzip_bomb_is_not_inflated() -> None:
    with AnyServer(bomb(256 * MiB)) as server:
        tracemalloc.start()
        try:
            n = Notifier(server.url + "/hook", timeout_s=5.0)
            n.send({"event": "alarm", "alarm": {"rule": "r"}, "run": {}})
            t0 = time.monotonic()
            while n.failed + n.sent == 0 and time.monotonic() < t0 + 20:
                time.sleep(0.05)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        n.close()
    assert n.failed + n.sent == 1, (n.failed, n.sent)
    assert peak < 32 * MiB, f"{peak / MiB:.0f} MiB"


class _Ep:
    def __init__(self, url: str) -> None:
        self.label, self.base_url, self.headers = "e", url, {}
        self.ssl, self.proxy, self.proxy_headers = True, None, None


@pytest.mark.parametrize("kind", ["trickle", "bomb"])
def test_the_scraper_against_a_slow_or_huge_server_ends_within_its_deadline(kind: str) -> None:
    """Each scrape request ends within the scraper's timeout_s in all, and a huge (or gzip-bombed) /metrics page
    is not read past 4 MiB decoded: the row says why, and memory stays small."""
    reply = trickle(0.2, "text/plain") if kind == "trickle" else bomb(256 * MiB)
    with AnyServer(reply) as server:
        rows: list[Any] = []
        scraper = Scraper([_Ep(server.url)], interval_s=60, timeout_s=1.0, write=lambda r: rows.extend(r))

        async def once() -> list[Any]:
            async with session("server_metrics") as sess:
                return await scraper.scrape(sess)

        tracemalloc.start()
        t0 = time.monotonic()
        try:
            out = run_sync(once())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        took = time.monotonic() - t0
    assert took < 3 * 1.0 + 3, took  # /version, /get_server_info, /metrics: each within 1 s
    (row,) = out
    assert row is not None and row["error"].startswith("no metrics:"), row
    assert ("deadline" in row["error"]) if kind == "trickle" else ("exceeded" in row["error"]), row["error"]
    assert peak < 48 * MiB, f"{peak / MiB:.0f} MiB"


def test_fetch_caps_the_decoded_size_and_the_time_and_redacts() -> None:
    """The module itself: a gzip bomb stops at the cap (decoded), a trickle at the deadline; both OutboundError."""
    async def get(url: str, cap: int, deadline_s: float) -> Any:
        async with session("probe") as sess:
            return await fetch(sess, "GET", url, cap=cap, deadline_s=deadline_s)

    with AnyServer(bomb(64 * MiB)) as server:
        with pytest.raises(OutboundError) as err:
            run_sync(get(server.url + "/x", MiB, 10))
        assert err.value.kind == "too_large" and "1,048,576" in err.value.message
    with AnyServer(trickle(0.1)) as server:
        t0 = time.monotonic()
        with pytest.raises(OutboundError) as err:
            run_sync(get(server.url + "/x", MiB, 1.0))
        assert err.value.kind == "timeout" and time.monotonic() - t0 < 3


def test_an_unregistered_caller_gets_no_session() -> None:
    with pytest.raises(RuntimeError, match="not registered"):
        session("nobody-registered-this")


def test_the_probe_button_refuses_past_its_limit_and_cancels_on_disconnect() -> None:
    """run_probe on a loop: a full set of slots is refused at once; a client that leaves cancels the probe."""
    async def main() -> None:
        slots = probe_button.ProbeSlots(limit=1)
        with AnyServer(trickle(0.2)) as server:
            opts = probe_button.options_for(server.url, "m", None)
            gone = asyncio.Event()

            async def disconnected() -> None:
                await gone.wait()

            first = asyncio.create_task(probe_button.run_probe(slots, opts, disconnected))
            await asyncio.sleep(0.5)
            with pytest.raises(probe_button.Busy):
                await probe_button.run_probe(slots, opts, disconnected)
            gone.set()
            t0 = time.monotonic()
            with pytest.raises(probe_button.Gone):
                await first
            assert time.monotonic() - t0 < 2
            assert slots.running == 0

    run_async(main())  # a thread of its own: this one may hold a running loop (Playwright) in the full suite


def test_a_huge_reply_is_quoted_from_its_start_only() -> None:
    """Found by the outbound property test: the preflight quoted a /models reply of 8 MB by decoding, splitting
    (into millions of words) and redacting all of it: 158 MB of memory for one error line. An error line quotes a
    bounded prefix now."""
    from synthwatch.workers.preflight import MAX_MODELS_BYTES, PreflightError, check_endpoint
    from tests.fuzzchecks import PeakRSS
    from tests.hostileserver import head

    body = (b"ab " * (MAX_MODELS_BYTES // 3))[:MAX_MODELS_BYTES]  # 2.8 million words

    async def reply(r: Any, w: Any) -> bool:
        w.write(head("200 OK", "application/json", length=len(body)) + body)
        await w.drain()
        return True

    with AnyServer(reply) as server, PeakRSS() as mem:
        with pytest.raises(PreflightError) as err:
            check_endpoint(server.url, "m", timeout_s=30)
    assert "not the OpenAI list of models" in str(err.value) and len(str(err.value)) < 600
    assert mem.grew_mb < 60, f"{mem.grew_mb:.0f} MB"
