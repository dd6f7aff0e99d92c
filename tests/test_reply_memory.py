"""What a large reply costs in the worker's memory (#34, #39): the real `synthwatch run`, in a process of its own,
reads one 60 MB reply (streamed, and not streamed) from a raw socket server and writes it to a real SQLite file and
to a real PostgreSQL database. Its peak resident memory (the kernel's high-water mark, ``ru_maxrss`` of the process)
minus that of the same run given a tiny reply is the reply's cost. Not timed: memory only.

It was ~4x, then 3x: the text, SQLite's copy of the bound value and the row it builds from it. Now at most 2x (+8 MB
of buffers and pages): a long text is spooled once checked and written into its row in pieces
(workers/long_texts.py); a large body that is not streamed is parsed after its bytes are let go
(capture/safety.py loads_reply); the allocator hands such texts' memory back at once (workers/gc_tuning.py). 2x is
what reading the reply takes: its text and the bytes (or the pieces) it came from."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cli_env
from sqlalchemy import text

from synthwatch.store.db import open_engine
from tests.hostileserver import USAGE, HostileServer, Reply, chunk, chunked, head, sse

pytestmark = pytest.mark.slow

REPLY_BYTES = 60_000_000
SLACK_BYTES = 8_000_000  # SQLite's page cache (2 MB) and a few buffers
EVENT_CHARS = 16_000  # each event of the streamed reply (the usual ~250-byte event would make this test minutes long)
LINE = "Step 12: multiply both sides by 3.1415 and compare the two results again. " * 4 + "\n"

# Runs `synthwatch run ...` as its only child and prints the child's peak resident memory (KiB) as its last line.
_MEASURE = ("import resource, subprocess, sys\n"
            "rc = subprocess.call([sys.executable, '-m', 'synthwatch', *sys.argv[1:]])\n"
            "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(rc)\n")


def text_of(n: int) -> str:
    return (LINE * (n // len(LINE) + 1))[:n]


def whole_reply(content: str) -> tuple[Reply, int]:
    body = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "sim-reasoner",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}).encode()
    del content

    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(head(ctype="application/json", length=len(body)))
        for i in range(0, len(body), 1 << 20):
            w.write(body[i: i + (1 << 20)])
            await w.drain()
        return True
    return reply, len(body)


def streamed_reply(n_chars: int) -> tuple[Reply, int]:
    piece = text_of(EVENT_CHARS)
    event = chunked(sse(chunk({"content": piece})), end=False)
    n = n_chars // EVENT_CHARS
    tail = chunked(sse(chunk({}, "stop")), sse(USAGE), sse(b"[DONE]"))
    size = n * len(sse(chunk({"content": piece})))

    async def reply(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(head())
        for i in range(n):
            w.write(event)
            if i % 64 == 63:
                await w.drain()
        w.write(tail)
        await w.drain()
        return True
    return reply, size


def peak_rss_of_a_run(tmp_path: Path, reply: Reply, *, stream: bool, hostile: bool, name: str, db: str) -> int:
    """Bytes: the peak resident memory of `synthwatch run` over a one-record dataset into ``db`` (the record HOSTILE
    gets ``reply``; another gets the server's tiny valid reply)."""
    data = tmp_path / f"{name}.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "HOSTILE" if hostile else "What is 1 + 1?"}]})
                    + "\n")
    with HostileServer(reply) as srv:
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(
            f'name = "{name}"\nmodel = "sim-reasoner"\nconcurrency = 1\nstream = {str(stream).lower()}\n'
            f'dataset = {{ path = "{data}" }}\nendpoints = [{{ base_url = "{srv.url}" }}]\n'
            'timeouts = { connect_s = 30, total_s = 600, idle_s = 120 }\nretries = { max_attempts = 1 }\n')
        proc = subprocess.run([sys.executable, "-c", _MEASURE, "run", "--config", str(cfg), "--db", db, "--quiet"],
                              capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    engine = open_engine(db)
    try:
        with engine.connect() as conn:
            status, length, error = conn.execute(text("SELECT status, length(content), error FROM record")).one()
    finally:
        engine.dispose()
    assert status == "ok", (status, error)
    if hostile:
        assert length >= REPLY_BYTES * 0.99, length  # the whole answer is stored
    return int(proc.stdout.split("maxrss_kib")[-1].split()[0]) * 1024


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_60_mb_reply_costs_at_most_twice_its_size(tmp_path: Path, stream: bool, backend: str,
                                                    request: pytest.FixtureRequest) -> None:
    def new_db(name: str) -> str:
        return str(tmp_path / f"{name}.db") if backend == "sqlite" else request.getfixturevalue("pg_server").new_database()

    reply, size = streamed_reply(REPLY_BYTES) if stream else whole_reply(text_of(REPLY_BYTES))
    base = peak_rss_of_a_run(tmp_path, reply, stream=stream, hostile=False, name="base", db=new_db("base"))
    peak = peak_rss_of_a_run(tmp_path, reply, stream=stream, hostile=True, name="big", db=new_db("big"))
    grew = peak - base
    print(f"{backend}, {'streamed' if stream else 'not streamed'} reply of {size / 1e6:.1f} MB: peak RSS"
          f" {peak / 1e6:.0f} MB, baseline {base / 1e6:.0f} MB, grew {grew / 1e6:.0f} MB = {grew / size:.2f}x its size")
    # 2x: the text and what it was read from (the body's bytes, the stream's pieces); SQLite's row is built after
    # the text is spooled and let go (the allocator's 2.2x for a stream, before gc_tuning, fails here)
    assert grew <= 2 * size + SLACK_BYTES, f"grew {grew / 1e6:.0f} MB = {grew / size:.2f}x a {size / 1e6:.0f} MB reply"
