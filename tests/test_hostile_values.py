"""#25's reproductions end to end: a real worker (or the real ``synthwatch run``) against tests/hostileserver.py.

- values a backend cannot hold (NUL in text, a count of 3,000,000,000 or 2^64 - 1) are stored the same way on
  SQLite and PostgreSQL, the good records of the run are written and the run completes;
- ``synthwatch run`` with a hostile endpoint among good replies finishes and exits 0;
- memory stays bounded with the default limits: 300 events of 1 MB on 2 streams, plain or gzipped.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from sqlalchemy import text

from synthwatch.store.db import open_engine
from tests.hostileserver import GOOD_EVENTS, USAGE, HostileServer, Reply, chunk, chunked, head, sse
from tests.test_hostile_servers import TIMEOUTS, MiB, PeakRSS, dataset, gzip_stream, send
from tests.workerkit import make_config, records, run_to_end

BAD_USAGE = {"prompt_tokens": 3_000_000_000, "completion_tokens": 2**64 - 1, "total_tokens": 2**64 - 1}


def _nul_reply(stream: bool) -> Reply:
    if stream:
        events = [sse(chunk({"role": "assistant", "reasoning": "r\u0000s"})), sse(chunk({"content": "a\u0000b"})),
                  sse(chunk({}, "stop")), sse({**USAGE, "usage": BAD_USAGE}), sse(b"[DONE]")]
        return send(head(), chunked(*events), keep=True)
    body = json.dumps({"id": "c\u0000", "object": "chat.completion", "created": 1, "model": "sim\u0000reasoner",
                       "choices": [{"index": 0, "finish_reason": "stop", "message": {
                           "role": "assistant", "reasoning": "r\u0000s", "content": "a\u0000b"}}],
                       "usage": BAD_USAGE}).encode()
    return send(head(ctype="application/json", length=len(body)) + body, keep=True)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not_streamed"])
def test_nul_and_impossible_counts_are_stored_alike_on_both_backends(any_engine: Any, tmp_path: Path,
                                                                     stream: bool) -> None:
    with HostileServer(_nul_reply(stream)) as srv:
        config = make_config(srv.url, dataset(tmp_path / "p.jsonl"), stream=stream, concurrency=4,
                             timeouts=TIMEOUTS, retries={"max_attempts": 1})
        run_id, final = run_to_end(any_engine, config, timeout_s=60)
    assert final == "completed"
    hostile, *good = records(any_engine, run_id)
    assert [r["status"] for r in good] == ["ok"] * 3
    assert hostile["status"] == "ok", (hostile["error_kind"], hostile["error"])
    assert (hostile["reasoning"], hostile["content"]) == ("r\u2400s", "a\u2400b")
    assert (hostile["prompt_tokens"], hostile["completion_tokens"]) == (None, None)
    extra = json.loads(hostile["extra_json"])
    exact = extra["nul_text"]
    assert (exact["reasoning"], exact["content"]) == ("r\u0000s", "a\u0000b")  # the reply's text, exactly
    if not stream:
        assert (exact["model"], exact["response_id"]) == ("sim\u0000reasoner", "c\u0000")
        assert hostile["model"] == "sim\u2400reasoner"
    problems = "\n".join(extra["problems"])
    assert "usage.prompt_tokens = 3000000000 is impossible" in problems
    assert f"usage.completion_tokens = {2**64 - 1} is impossible" in problems
    # the usage object is kept as sent (JSON text holds any of these numbers)
    assert json.loads(hostile["usage_json"])["completion_tokens"] == 2**64 - 1
    with any_engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND status IN ('pending',"
                                 " 'in_flight')"), {"r": run_id}).scalar() == 0


@pytest.mark.slow
def test_synthwatch_run_with_a_hostile_endpoint_finishes_and_exits_0(tmp_path: Path) -> None:
    """The issue's worst case: every record of one endpoint got a usage count of 2^64 - 1 (and the writer died,
    the process hung). Now they are ordinary records with a problem noted; the run completes, exit code 0."""
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{'HOSTILE' if i % 2 else 'ok'}"
                                                      f" {i}"}]}) + "\n" for i in range(40)))

    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(head() + chunked(*GOOD_EVENTS[:3], sse({**USAGE, "usage": {"prompt_tokens": 2**64 - 1}}),
                                 sse(b"[DONE]")))
        await w.drain()
        return True

    db = tmp_path / "run.db"
    with HostileServer(reply, good_delay_s=0.01) as srv:
        proc = run_cli("run", "--dataset", str(data), "--base-url", srv.url, "--model", "sim-reasoner",
                       "--db", str(db), "--name", "hostile", "--concurrency", "8", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    engine = open_engine(str(db))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT status, prompt_tokens, extra_json FROM record")).all()
    finally:
        engine.dispose()
    assert [r[0] for r in rows] == ["ok"] * 40
    assert sum(r[1] is None and "is impossible" in r[2] for r in rows) == 20


def _many_events(n: int, size: int) -> Reply:
    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(head())
        ev = chunked(sse(chunk({"content": "y" * size})), end=False)
        for _ in range(n):
            w.write(ev)
            await w.drain()
        w.write(chunked(*GOOD_EVENTS))
        await w.drain()
    return reply


@pytest.mark.slow
@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_memory_stays_bounded_with_300_events_of_1mb_on_2_streams(engine: Any, tmp_path: Path,
                                                                  gzipped: bool) -> None:
    """Before #25 two such streams took the worker to 1.5 GB (2 GB gzipped, from ~2 MB on the wire). With the
    default limits (max_reply_bytes 64 MiB, max_partial_chars 1 Mi) each stream stops at 64 MiB and the worker
    grows by less than two replies' worth each (measured here: ~210 MB plain, ~145 MB gzipped)."""
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"HOSTILE {i}"}]}) + "\n"
                            for i in range(2))
                    + "".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1?"}]}) + "\n"
                              for i in range(2)))
    reply = gzip_stream(300, 1_000_000) if gzipped else _many_events(300, 1_000_000)
    with HostileServer(reply) as srv:
        config = make_config(srv.url, data, concurrency=4, retries={"max_attempts": 1},
                             timeouts={"connect_s": 5, "total_s": 120, "idle_s": 30},
                             limits={"max_event_bytes": 2 * MiB})  # 1 MB events; max_reply_bytes stays the default
        with PeakRSS() as mem:
            run_id, final = run_to_end(engine, config, timeout_s=180)
    assert final == "completed"
    recs = records(engine, run_id)
    assert [(r["status"], r["error_kind"]) for r in recs[:2]] == [("error", "reply_too_large")] * 2
    assert all("limits.max_reply_bytes" in r["error"] for r in recs[:2])
    assert all(len(r["content"]) == 2**20 for r in recs[:2])  # the partial text kept: max_partial_chars
    assert [r["status"] for r in recs[2:]] == ["ok", "ok"]
    grew = (mem.peak - mem.base) / MiB
    assert grew < 2 * 2 * 64 + 40, f"resident memory grew by {grew:.0f} MB"
