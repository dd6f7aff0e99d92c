"""A server that misbehaves in every way we could think of cannot hang the worker, crash it or grow it.

Each case runs a real worker (real SQLite file) against :class:`HostileServer`: one record gets the
case's reply, three others get valid, slowly streamed replies at the same time. For every case the
hostile record ends ``ok`` (where the reply is still valid) or with the recorded error kind the case
names, within the configured timeouts (connect 2 s, idle 1 s, total 4 s); the other three records
end ``ok``; and the process's resident memory grows by less than the case's bound while it runs
(limits here: body and event 1 MiB, a whole reply 4 MiB, header line 8,190 bytes, 128 headers).

The nastiest cases also run the real ``synthwatch run`` process and interrupt it: SIGINT is handled
within 2 s (see ``test_sigint_is_handled_within_two_seconds``).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_env

from tests.hostileserver import (
    GOOD_EVENTS,
    GOOD_JSON,
    USAGE,
    HostileServer,
    Reply,
    chunk,
    chunked,
    head,
    sse,
)
from tests.workerkit import make_config, records, run_to_end

MiB = 2**20
TIMEOUTS = {"connect_s": 2, "total_s": 4, "idle_s": 1}
LIMITS = {"max_body_bytes": MiB, "max_event_bytes": MiB, "max_reply_bytes": 4 * MiB}


def send(*parts: bytes, hold_s: float = 0.0, keep: bool = False) -> Reply:
    """Write ``parts``, keep the connection open ``hold_s``, then close it (or, with ``keep``, serve the
    next request on it: the reply was complete)."""
    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        for p in parts:
            w.write(p)
            await w.drain()
        if hold_s:
            await asyncio.sleep(hold_s)
        return keep
    return reply


def stream_of(*events: bytes) -> Reply:
    return send(head(), chunked(*events), keep=True)


def forever(first: bytes, piece: bytes, every_s: float = 0.0, max_bytes: int = 100 * MiB) -> Reply:
    """Send ``first``, then ``piece`` again and again (until the client leaves or max_bytes)."""
    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(first)
        sent = 0
        while sent < max_bytes:
            w.write(piece)
            sent += len(piece)
            await w.drain()
            await asyncio.sleep(every_s)
    return reply


def reset_after(*parts: bytes) -> Reply:
    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for p in parts:
            w.write(p)
            await w.drain()
        await asyncio.sleep(0.2)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        w.transport.abort()
    return reply


def huge_event() -> Reply:
    """100 MB of one SSE event, no newline anywhere (stops when the client hangs up)."""
    return forever(head(ctype="text/event-stream", chunked=False, length=100 * MiB + 6) + b"data: ", b"x" * 65536)


def gzip_bomb() -> Reply:
    bomb = gzip.compress(b"\0" * (100 * MiB), compresslevel=9)  # ~100 KB on the wire
    return send(head("200 OK", "application/json", "Content-Encoding: gzip", length=len(bomb)) + bomb)


def gzip_stream(n: int, size: int) -> Reply:
    """A streamed reply, gzipped: ``n`` events of ``size`` characters each (~1,000 times smaller on the wire)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    ev = sse(chunk({"content": "y" * size}))
    body = b"".join(z.compress(ev) for _ in range(n)) + z.compress(b"".join(GOOD_EVENTS)) + z.flush()
    return send(head("200 OK", "text/event-stream", "Content-Encoding: gzip")
                + chunked(*(body[i:i + 65536] for i in range(0, len(body), 65536))), hold_s=1)


def deep_json(n: int) -> bytes:
    return b"[" * n + b"]" * n


def usage_of(**usage: Any) -> Reply:
    return stream_of(*GOOD_EVENTS[:3], sse({**USAGE, "usage": usage}), sse(b"[DONE]"))


GOOD = b"".join(GOOD_EVENTS)
JSON_HEAD = head(ctype="application/json", length=len(GOOD_JSON))


@dataclass(frozen=True)
class Case:
    name: str
    reply: Callable[[], Reply]
    expect: str  # "ok" or the recorded error kind
    stream: bool = True
    bound_mb: int = 40  # resident memory the worker may grow by during the case
    check: Callable[[dict[str, Any]], None] | None = None


def _no_injected(rec: dict[str, Any]) -> None:
    assert "INJECTED" not in (rec["content"] or "") and "WRONG" not in (rec["content"] or "")
    assert rec["content"] == "The answer is in the prompt."


def _status_and_location(rec: dict[str, Any]) -> None:
    assert "302" in rec["error"] and "http://elsewhere.invalid/next" in rec["error"]


def _finish_stop(rec: dict[str, Any]) -> None:
    assert rec["finish_reason"] == "stop"


def _count_not_stored(rec: dict[str, Any]) -> None:
    """An impossible usage count is a problem of the record, not a number in its column."""
    assert rec["prompt_tokens"] is None
    problems = json.loads(rec["extra_json"])["problems"]
    assert any("usage.prompt_tokens" in p and "is impossible" in p for p in problems), problems


def _nul_replaced_and_kept(rec: dict[str, Any]) -> None:
    assert rec["content"] == "a\u2400b"
    assert json.loads(rec["extra_json"])["nul_text"] == {"content": "a\u0000b"}


CASES = [
    # -- chunked framing
    Case("chunk_size_negative", lambda: send(head() + b"1\r\nA\r\n-6\r\nZZZZZZ\r\n0\r\n\r\n", hold_s=5), "http_error"),
    Case("chunk_size_plus_prefixed", lambda: send(head() + b"+5\r\nhello\r\n0\r\n\r\n", hold_s=5), "http_error"),
    Case("chunk_size_0x_prefixed", lambda: send(head() + b"0x5\r\nhello\r\n0\r\n\r\n", hold_s=5), "http_error"),
    Case("chunk_size_underscore", lambda: send(head() + b"1_0\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n", hold_s=5),
         "http_error"),
    Case("chunk_size_overlong", lambda: send(head() + b"f" * 40 + b"\r\nhello\r\n", hold_s=5), "http_error"),
    Case("chunk_size_not_hex", lambda: send(head() + b"zz\r\nhello\r\n0\r\n\r\n", hold_s=5), "http_error"),
    Case("chunk_line_without_crlf", lambda: send(head() + b"5hello0", hold_s=5), "http_error"),
    # -- headers
    Case("header_flood_over_64k", lambda: send(
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Junk-%05d: %s\r\n" % (i, b"a" * 40) for i in range(2000)) + b"\r\n",
        hold_s=5), "header_too_large"),
    Case("header_line_over_64k", lambda: send(
        b"HTTP/1.1 200 OK\r\nX-Junk: " + b"a" * 70_000 + b"\r\n\r\n", hold_s=5), "header_too_large"),
    Case("header_flood_endless", lambda: forever(b"HTTP/1.1 200 OK\r\n", b"X-Junk: aaaaaaaa\r\n" * 100),
         "header_too_large"),
    # -- body length
    Case("body_shorter_than_content_length", lambda: send(
        head(ctype="application/json", length=len(GOOD_JSON) + 100) + GOOD_JSON), "dropped", stream=False),
    # the extra bytes arrive with the reply and are parsed as the next reply on the connection: refused
    Case("body_longer_than_content_length", lambda: send(JSON_HEAD + GOOD_JSON + b"garbage" * 100, hold_s=1),
         "http_error", stream=False),
    Case("content_length_conflicting", lambda: send(
        head("200 OK", "application/json", f"Content-Length: {len(GOOD_JSON) + 5}", length=len(GOOD_JSON))
        + GOOD_JSON, hold_s=5), "http_error", stream=False),
    Case("content_length_and_chunked", lambda: send(
        head("200 OK", "application/json", "Content-Length: 5", chunked=True) + chunked(GOOD_JSON), hold_s=5),
        "http_error", stream=False),
    Case("body_over_limit", lambda: send(
        head(ctype="application/json", length=2 * MiB) + b" " * (2 * MiB), hold_s=5), "body_too_large",
        stream=False),
    Case("body_over_limit_close_delimited", lambda: forever(
        head(ctype="application/json", chunked=False), b" " * 65536), "body_too_large", stream=False),
    # -- content encoding
    Case("gzip_bomb", gzip_bomb, "body_too_large", stream=False, bound_mb=80),
    Case("gzip_invalid", lambda: send(head("200 OK", "application/json", "Content-Encoding: gzip", length=15)
                                      + b"not gzip at all", hold_s=5), "bad_encoding", stream=False),
    # -- status lines
    Case("interim_1xx_endless", lambda: forever(b"", b"HTTP/1.1 102 Processing\r\n\r\n", every_s=0.001),
         "idle_timeout"),
    Case("upgrade_101", lambda: send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                     b"Connection: Upgrade\r\n\r\n", hold_s=5), "http_error"),
    Case("redirect_302", lambda: send(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/next\r\n"
                                      b"Content-Length: 0\r\n\r\n", hold_s=5), "redirect", check=_status_and_location),
    Case("redirect_307_not_streamed", lambda: send(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v2\r\n"
                                                   b"Content-Length: 0\r\n\r\n"), "redirect", stream=False),
    Case("http10_close_delimited", lambda: send(head(version="HTTP/1.0", chunked=False) + GOOD), "ok",
         check=_no_injected),
    Case("garbage_status_line", lambda: send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", hold_s=5), "http_error"),
    Case("binary_garbage", lambda: send(bytes(range(256)) * 4, hold_s=5), "http_error"),
    Case("closed_without_reply", lambda: send(), "dropped"),
    Case("reset_mid_stream", lambda: reset_after(head() + chunked(*GOOD_EVENTS[:2], end=False)), "dropped"),
    Case("closed_mid_stream", lambda: send(head() + chunked(*GOOD_EVENTS[:2], end=False)), "dropped"),
    # -- timing
    Case("slowloris_1_byte_per_9s", lambda: forever(b"", b"H", every_s=9, max_bytes=10), "idle_timeout"),
    Case("slow_drip_within_idle_timeout", lambda: forever(head(chunked=False), b":", every_s=0.3), "timeout"),
    Case("silent_after_headers", lambda: send(head(), hold_s=10), "idle_timeout"),
    Case("silent_not_streamed", lambda: send(b"", hold_s=10), "timeout", stream=False),
    # -- SSE events
    Case("event_100mb_without_newline", huge_event, "event_too_large"),
    Case("data_not_json", lambda: stream_of(sse(b"this is not json"), sse(b"[DONE]")), "malformed"),
    Case("json_with_nan", lambda: stream_of(sse(b'{"choices": [{"index": 0, "delta": {"content": NaN}}]}')),
         "malformed"),
    Case("json_nested_100k_deep", lambda: stream_of(sse(b"[" * 100_000 + b"]" * 100_000)), "malformed"),
    Case("invalid_utf8", lambda: stream_of(sse(b'{"choices": [{"index": 0, "delta": {"content": "\xff\xfe"}}]}')),
         "malformed"),
    Case("bom_first", lambda: stream_of(b"\xef\xbb\xbf" + GOOD), "ok", check=_no_injected),
    Case("cr_only_line_endings", lambda: stream_of(GOOD.replace(b"\n", b"\r")), "ok", check=_no_injected),
    Case("no_done_with_finish_reason", lambda: stream_of(*GOOD_EVENTS[:-1]), "ok", check=_no_injected),
    Case("no_done_no_finish_reason", lambda: stream_of(*GOOD_EVENTS[:2]), "dropped"),
    Case("data_after_done", lambda: stream_of(
        *GOOD_EVENTS, sse(chunk({"content": "INJECTED"})), sse(b"[DONE]")), "ok", check=_no_injected),
    Case("done_then_body_never_ends", lambda: send(head() + chunked(*GOOD_EVENTS, end=False), hold_s=10), "ok",
         check=_no_injected),
    Case("choices_empty", lambda: stream_of(sse({**USAGE, "choices": []}), *GOOD_EVENTS), "ok",
         check=_no_injected),
    Case("choices_null", lambda: stream_of(sse({**USAGE, "choices": None}), *GOOD_EVENTS), "ok",
         check=_no_injected),
    Case("choices_unknown_index", lambda: stream_of(sse(chunk({"content": "WRONG"}, index=3)), *GOOD_EVENTS),
         "ok", check=_no_injected),
    Case("choices_not_objects", lambda: stream_of(sse({"choices": [1, "two", None]}), *GOOD_EVENTS), "ok",
         check=_no_injected),
    Case("usage_negative", lambda: stream_of(*GOOD_EVENTS[:3], sse({**USAGE, "usage": {
        "prompt_tokens": -5, "completion_tokens": -4, "total_tokens": -9}}), sse(b"[DONE]")), "ok"),
    Case("usage_not_numbers", lambda: stream_of(*GOOD_EVENTS[:3], sse({**USAGE, "usage": {
        "prompt_tokens": "five", "completion_tokens": [4], "total_tokens": None}}), sse(b"[DONE]")), "ok"),
    Case("two_finish_reasons", lambda: stream_of(sse(chunk({"content": "The answer is in the prompt."}, "length")),
                                                  sse(chunk({}, "stop")), sse(b"[DONE]")), "ok",
         check=_finish_stop),
    Case("error_event_in_stream", lambda: stream_of(
        sse({"error": {"message": "model overloaded", "code": 503}})), "error_body"),
    Case("html_instead_of_events", lambda: send(head(ctype="text/html", length=13) + b"<html></html>"),
         "bad_content_type"),
    # -- values the store could not hold (#25): made safe where they are read
    Case("usage_2_64_minus_1_streamed", lambda: usage_of(prompt_tokens=2**64 - 1, completion_tokens=4), "ok",
         check=_count_not_stored),
    Case("usage_3_billion_streamed", lambda: usage_of(prompt_tokens=3_000_000_000, completion_tokens=4), "ok",
         check=_count_not_stored),
    Case("content_with_nul", lambda: stream_of(sse(chunk({"content": "a\u0000b"})), sse(chunk({}, "stop")),
                                               sse(b"[DONE]")), "ok", check=_nul_replaced_and_kept),
    Case("field_nested_1000_deep", lambda: stream_of(
        sse(b'{"choices": [{"index": 0, "delta": {"content": "x"}}], "deep": ' + deep_json(1000) + b"}"),
        *GOOD_EVENTS), "reply_too_deep"),
    Case("field_nested_1000_deep_not_streamed", lambda: send(
        head(ctype="application/json", length=len(GOOD_JSON) + 10 + 2000)
        + GOOD_JSON[:-1] + b', "deep": ' + deep_json(1000) + b"}", keep=True), "reply_too_deep", stream=False),
    # -- the whole reply's size (limits.max_reply_bytes, decoded), each event under max_event_bytes
    Case("stream_over_reply_limit", lambda: forever(head(), chunked(sse(chunk({"content": "y" * 500_000})),
                                                                    end=False)), "reply_too_large"),
    Case("stream_gzip_bomb", lambda: gzip_stream(300, 1_000_000), "reply_too_large"),
    Case("status_429_bad_retry_after", lambda: send(head("429 Too Many Requests", "application/json",
                                                         "Retry-After: soon", length=2) + b"{}"), "http_429"),
]


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples this process's resident memory every 10 ms while a case runs."""

    def __init__(self) -> None:
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def dataset(path: Path, n_good: int = 3) -> Path:
    with path.open("w") as fh:
        fh.write(json.dumps({"id": "h", "messages": [{"role": "user", "content": "HOSTILE: what is 1 + 1?"}]}) + "\n")
        for i in range(n_good):
            fh.write(json.dumps({"id": f"g{i}", "messages": [{"role": "user", "content": f"What is {i} + 1?"}]})
                     + "\n")
    return path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_server(case: Case, tmp_path: Path, engine: Any) -> None:
    with HostileServer(case.reply()) as srv:
        config = make_config(srv.url, dataset(tmp_path / "p.jsonl"), stream=case.stream, concurrency=4,
                             timeouts=TIMEOUTS, retries={"max_attempts": 1}, limits=LIMITS)
        t0 = time.monotonic()
        with PeakRSS() as mem:
            run_id, final = run_to_end(engine, config, timeout_s=30)
        elapsed = time.monotonic() - t0
    recs = records(engine, run_id)
    hostile, good = recs[0], recs[1:]
    got = "ok" if hostile["status"] == "ok" else hostile["error_kind"]
    assert got == case.expect, (hostile["status"], hostile["error_kind"], hostile["error"])
    if case.expect != "ok":
        assert hostile["error"], "a failure is recorded with a message"
    if case.check:
        case.check(hostile)
    assert final == "completed"
    assert [r["status"] for r in good] == ["ok"] * len(good), [(r["error_kind"], r["error"]) for r in good]
    # every request ends within the total timeout; the run adds start-up and the last flush
    assert elapsed < TIMEOUTS["total_s"] + 3, elapsed
    grew = (mem.peak - mem.base) / MiB
    assert grew < case.bound_mb, f"resident memory grew by {grew:.0f} MB (bound {case.bound_mb} MB)"


def test_corpus_covers_at_least_thirty_distinct_misbehaviours() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 30


# ---------------------------------------------------------------- the real process, interrupted


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # whatever the test runner's own handling


@pytest.mark.parametrize("case", ["chunk_size_negative", "slowloris_1_byte_per_9s", "interim_1xx_endless",
                                  "event_100mb_without_newline", "header_flood_endless"])
def test_sigint_is_handled_within_two_seconds(case: str, tmp_path: Path) -> None:
    """``synthwatch run`` in a process of its own against a server that answers every request with the case
    (20,000 records, long timeouts: only the signals end the run): the first SIGINT starts a graceful stop, the
    second stops at once, and the process has exited within 2 s of the first, no record left in flight."""
    reply = next(c for c in CASES if c.name == case).reply
    db = tmp_path / "sig.db"
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"HOSTILE {i}"}]}) + "\n"
                            for i in range(20_000)))  # more than a fast-failing case ends before the signal
    with HostileServer(reply()) as srv:
        cfg = tmp_path / "run.toml"
        cfg.write_text(
            f'name = "sig"\nmodel = "sim-reasoner"\nconcurrency = 4\ndataset = {{ path = "{data}" }}\n'
            f'endpoints = [{{ base_url = "{srv.url}" }}]\n'
            f'timeouts = {{ connect_s = 5, total_s = 120, idle_s = 60 }}\nretries = {{ max_attempts = 1 }}\n'
            f'limits = {{ max_event_bytes = {MiB} }}\n'
            # every request fails here on purpose: the errors' auto-pause (#26) would end the run before the signals
            '[checks.rules.error]\npause_min_records = 100000\n')
        proc = subprocess.Popen([sys.executable, "-m", "synthwatch", "run", "--config", str(cfg), "--db", str(db),
                                 "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_env(), cwd=ROOT, preexec_fn=_default_sigint)
        second = False
        try:
            assert srv.hostile_seen.wait(30), "the worker never sent a request"
            time.sleep(1.0)  # the worker is now inside hostile replies
            assert proc.poll() is None, proc.communicate()
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(0.5)  # requests that fail fast let the graceful stop finish at once
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                second = True
            try:
                _, err = proc.communicate(timeout=max(0.1, 2.0 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(f"still running 2 s after SIGINT:\n{err[-3000:]}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "SIGINT: stopping gracefully" in err, err[-3000:]
    # the second SIGINT either stopped the run at once, or came after the graceful stop had finished (the process
    # was exiting; on a loaded machine that takes longer than the 0.5 s waited) and found nothing left to stop
    assert not second or "SIGINT: stopping now" in err or err.rstrip().endswith("— stopped"), err[-3000:]
    assert proc.returncode == 3, err[-3000:]  # stopped
    import sqlite3

    with sqlite3.connect(db) as conn:
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM record GROUP BY status").fetchall())
    assert "in_flight" not in statuses and statuses.get("pending", 0) > 0, statuses
