"""Long texts go into the store in pieces (#39, workers/long_texts.py), and a large body that is not streamed is parsed
after its bytes are let go (capture/safety.py loads_reply). Both only change what the worker holds in memory (the
60 MB reply's cost is tests/test_reply_memory.py): what is stored, and how a reply is read, must be exactly what the
plain paths give.

The writer tests run the real writer thread on a real SQLite file and a real PostgreSQL database; the
spool threshold is lowered on the writer so that short texts take the long path.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from workerkit import create, make_config, records, run_to_end, wait_for

from synthwatch.capture.reasoning import extract_response
from synthwatch.capture.safety import LARGE_REPLY_BYTES, loads_reply
from synthwatch.quality.checks import BIT
from synthwatch.quality.live import writer_hooks
from synthwatch.settings import get_settings
from synthwatch.store import queue as store
from synthwatch.store.db import open_engine
from synthwatch.workers import long_texts
from synthwatch.workers.refusals import STORE_REFUSED
from synthwatch.workers.results import Outcome
from synthwatch.workers.series import record_columns
from synthwatch.workers.writer import Writer
from tests.hostileserver import HostileServer, head
from tests.test_hostile_servers import dataset, send

# ASCII, 2-, 3- and 4-byte UTF-8 characters and line ends: a piece boundary falls inside a character's bytes
MIXED = "Step 1: é = 2·π, 中文, 😀 and a line end\n"
SPOOL_OVER = 1000
_RUNS = itertools.count()


def _text(n: int, seed: str) -> str:
    return (seed + MIXED * (n // len(MIXED) + 1))[:n]


def _reply(i: int, reasoning: str, content: str) -> dict[str, Any]:
    return {"id": f"r{i}", "object": "chat.completion", "created": 1, "model": "sim-reasoner",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "reasoning": reasoning, "content": content}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}


def _ok(c: store.Claimed, ex: Any, **kw: Any) -> Outcome:
    return Outcome(c.id, c.idx, "ok", c.messages, extracted=ex, endpoint="e", latency_s=0.1, finished_at=time.time(),
                   **kw)


def _writer(engine: Any, prompts: Any, n: int, spool_over: int,
            checks: bool = False) -> tuple[int, Writer, list[store.Claimed]]:
    # a run of its own each time (the same name would resume the last one, its records done)
    config = make_config("http://127.0.0.1:9/v1", prompts(n), name=f"long-{next(_RUNS)}")
    run_id = create(engine, config)
    with engine.connect() as conn, store.write_begin(conn):
        worker_id = store.register_worker(conn, run_id)
    # checks: the hooks a worker gives its writer (the per-record checks read the texts before they are spooled)
    writer = Writer(engine, run_id, worker_id, flush_interval_s=0.3,
                    hooks=writer_hooks(engine, run_id, config) if checks else None)
    writer.spool_over_chars = spool_over
    writer.start()
    claimed, why = writer.claim(n).result(30)
    assert len(claimed) == n and why == ""
    return run_id, writer, sorted(claimed, key=lambda c: c.idx)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spool and fill in pieces of a few characters and bytes: piece boundaries fall inside multi-byte characters
    (each backend's fill must join them back), as they do in a real 60 MB text's 1 MiB pieces."""
    monkeypatch.setattr(long_texts, "PIECE_CHARS", 5)
    monkeypatch.setattr(long_texts, "PIECE_BYTES", 7)


def _deleted_files_in(folder: Path) -> int:
    """Open files of this process that live in ``folder`` and have no name any more (the spools)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(str(folder)) and target.endswith("(deleted)")
    return n


def _wait_written(writer: Writer, n: int) -> None:
    wait_for(lambda: writer.written >= n or not writer.alive, timeout_s=60, what=f"{n} records written")
    assert writer.alive, "the writer thread died"


def test_long_texts_are_stored_exactly_and_a_refused_record_stays_its_own(any_engine: Any, prompts: Any,
                                                                            tmp_path: Path, small_pieces: None) -> None:
    """Spooled texts (multi-byte, NUL) stored as a plain write stores them, in one batch with a record the store
    refuses (the batch is then written record by record, each spooled text inside its own savepoint)."""
    run_id, writer, claimed = _writer(any_engine, prompts, 4, SPOOL_OVER)
    reasoning0, content0 = _text(5000, "R0 "), _text(20_000, "C0 ")
    nul_content = _text(3000, "C2 ") + "\x00" + _text(3000, "tail ")
    before = _deleted_files_in(tmp_path)
    try:
        writer.submit(_ok(claimed[0], extract_response(_reply(0, reasoning0, content0), "auto")))
        # the store refuses this one (an integer no column holds): its batch goes record by record
        writer.submit(_ok(claimed[1], extract_response(_reply(1, "r", _text(4000, "C1 ")), "auto"), n_chunks=2**70))
        writer.submit(_ok(claimed[2], extract_response(_reply(2, "short", nul_content), "auto")))
        writer.submit(_ok(claimed[3], extract_response(_reply(3, "short", "answer 3"), "auto")))
        _wait_written(writer, 4)
    finally:
        writer.stop()
    assert writer.error is None and writer._crashed is None
    recs = {r["idx"]: r for r in records(any_engine, run_id)}
    assert [recs[i]["status"] for i in range(4)] == ["ok", "error", "ok", "ok"]
    assert recs[0]["reasoning"] == reasoning0 and recs[0]["content"] == content0
    assert (recs[0]["reasoning_len"], recs[0]["content_len"]) == (5000, 20_000)
    assert recs[1]["error_kind"] == STORE_REFUSED and recs[1]["content"] is None
    # NUL: the stand-in in the column, the exact text in extra_json, as on the plain path
    assert recs[2]["content"] == nul_content.replace("\x00", "\u2400")
    assert orjson.loads(recs[2]["extra_json"])["nul_text"] == {"content": nul_content}
    assert recs[3]["content"] == "answer 3"
    if any_engine.dialect.name == "sqlite":
        with any_engine.connect() as conn:
            # stored as text (not a blob): SQLite's text functions count characters and find them
            row = conn.execute(text("SELECT typeof(content), length(content), instr(content, '😀'), typeof(reasoning)"
                                    " FROM record WHERE run_id = :r AND idx = 0"), {"r": run_id}).one()
        assert row == ("text", 20_000, content0.index("😀") + 1, "text")
        assert _deleted_files_in(tmp_path) == before, "a spool file was left open"


def test_a_spooled_text_survives_a_flush_that_is_retried(tmp_path: Path, prompts: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The database is locked when the flush comes (a transient error): the batch is kept, retried, and the text
    written from its spool once the lock goes. The worker's checks are on: on the retry they answer from what they
    found the first time, never from the spooled outcome (whose parsed reply is gone)."""
    monkeypatch.setenv("SYNTHWATCH_BUSY_TIMEOUT_MS", "100")
    get_settings.cache_clear()
    db = tmp_path / "retry.db"
    engine = open_engine(str(db))
    try:
        run_id, writer, claimed = _writer(engine, prompts, 1, SPOOL_OVER, checks=True)
        content = _text(50_000, "retry ")
        locker = sqlite3.connect(db, isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")
            writer.submit(_ok(claimed[0], extract_response(_reply(0, "r" * 2000, content), "auto")))
            wait_for(lambda: writer.error is not None, timeout_s=30, what="the flush to fail on the lock")
            locker.execute("ROLLBACK")
            _wait_written(writer, 1)
        finally:
            locker.close()
            writer.stop()
        assert writer.error is None
        (rec,) = records(engine, run_id)
        assert rec["status"] == "ok" and rec["content"] == content and rec["reasoning"] == "r" * 2000
        # checked once, from the text: nothing empty was found, and no check failed on the retry
        assert "check_error" not in (rec["check_json"] or "")
        assert rec["check_flags"] & (BIT["empty_reasoning"] | BIT["empty_content"]) == 0, rec["check_flags"]
    finally:
        engine.dispose()
        get_settings.cache_clear()


def test_a_spool_that_cannot_be_written_keeps_the_text_in_memory(engine: Any, prompts: Any, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """No room for the spool (here: its folder is gone): the text is written from memory, as before, and the log
    says so; nothing is lost."""
    run_id, writer, claimed = _writer(engine, prompts, 1, SPOOL_OVER)
    writer.spool_dir = str(tmp_path / "gone")
    content = _text(30_000, "fallback ")
    try:
        with caplog.at_level(logging.WARNING, "synthwatch.writer"):
            writer.submit(_ok(claimed[0], extract_response(_reply(0, "r", content), "auto")))
            _wait_written(writer, 1)
    finally:
        writer.stop()
    assert writer.error is None
    (rec,) = records(engine, run_id)
    assert rec["status"] == "ok" and rec["content"] == content
    assert f"record {claimed[0].id}: its long text could not be spooled (FileNotFoundError" in caplog.text


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(texts=st.lists(st.text(max_size=400), min_size=1, max_size=6))
def test_any_text_is_stored_as_the_plain_path_stores_it(any_engine: Any, prompts: Any, small_pieces: None,
                                                        texts: list[str]) -> None:
    """Any text (NUL, line ends, every plane) spooled from its second character: the columns are those the plain
    path builds (record_columns), character for character, on both backends."""
    engine = any_engine
    run_id, writer, claimed = _writer(engine, prompts, len(texts), 1)
    want = {}
    try:
        for c, t in zip(claimed, texts, strict=True):
            ex = extract_response(_reply(c.idx, t[::-1], t), "auto")
            cols = record_columns(ex)
            want[c.idx] = (cols["reasoning"], cols["content"], cols["content_len"])
            writer.submit(_ok(c, ex))
        _wait_written(writer, len(texts))
    finally:
        writer.stop()
    assert writer.error is None
    got = {r["idx"]: (r["reasoning"], r["content"], r["content_len"]) for r in records(engine, run_id)}
    assert got == want


# ---------------------------------------------------------------- end to end: a real worker, a real server

BIG_CHARS = 9 * 2**20  # over LARGE_REPLY_BYTES (a body read by the large path) and long_text_spool_chars (spooled)


@pytest.mark.parametrize("valid", [True, False], ids=["valid", "nan_in_usage"])
def test_a_large_body_not_streamed_end_to_end(engine: Any, tmp_path: Path, valid: bool) -> None:
    """A 9 Mi-character answer not streamed: read by the large path and spooled into the store, stored exactly; the
    same body with a NaN (which orjson refuses) is the record's malformed error, naming the value and showing the
    body's start."""
    content = _text(BIG_CHARS, "BIG ")
    usage = b'{"prompt_tokens": 5, "completion_tokens": ' + (b"7" if valid else b"NaN") + b"}"
    body = (b'{"id": "big", "object": "chat.completion", "created": 1, "model": "sim-reasoner", "choices": [{"index": 0,'
            b' "finish_reason": "stop", "message": {"role": "assistant", "reasoning": "short", "content": '
            + json.dumps(content, ensure_ascii=False).encode() + b'}}], "usage": ' + usage + b"}")
    assert len(body) > LARGE_REPLY_BYTES
    with HostileServer(send(head(ctype="application/json", length=len(body)), body, keep=True)) as srv:
        config = make_config(srv.url, dataset(tmp_path / "p.jsonl"), stream=False, concurrency=2,
                             timeouts={"connect_s": 5, "total_s": 60, "idle_s": 30}, retries={"max_attempts": 1})
        run_id, final = run_to_end(engine, config, timeout_s=120)
    assert final == "completed"
    hostile, *good = records(engine, run_id)
    assert [r["status"] for r in good] == ["ok"] * 3
    if valid:
        assert hostile["status"] == "ok", (hostile["error_kind"], hostile["error"])
        assert hostile["content"] == content and hostile["content_len"] == BIG_CHARS
    else:
        assert (hostile["status"], hostile["error_kind"]) == ("error", "malformed")
        assert "not a JSON value (orjson refuses it too): NaN" in hostile["error"], hostile["error"]
        assert '{"id": "big", "object": "chat.completion"' in hostile["error"]  # the body's start


# ---------------------------------------------------------------- a large body parsed as orjson parses it

_json_values = st.recursive(
    st.none() | st.booleans() | st.text() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# what a body may carry that a reader could take differently: constants, out-of-range numbers, escapes, bad bytes
_pieces = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1e-400", b"18446744073709551615",
                           b"18446744073709551616", b"-9223372036854775808", b"-9223372036854775809", b"1" * 30,
                           b'"\\ud800"', b'"\\ud83d\\ude00"', b'"\\udc00x"', b'"\xff"', b'"\xc3"', b'"\x01"',
                           b"\xef\xbb\xbf{}", b"[1,]", b"{}x", b"", b"-0", b"0.0e0", b'"\\u00e9"'])


def _same(a: bytes) -> None:
    try:
        want: Any = ("ok", orjson.loads(a))
    except json.JSONDecodeError:
        want = ("error",)
    try:
        got: Any = ("ok", loads_reply(bytearray(a), large_bytes=0))
    except json.JSONDecodeError:
        got = ("error",)
    assert got == want, a[:200]


@given(_json_values, st.booleans())
def test_a_large_body_is_read_as_orjson_reads_it(value: Any, ascii_only: bool) -> None:
    _same(json.dumps({"v": value}, ensure_ascii=ascii_only).encode())


@given(st.lists(_pieces, min_size=1, max_size=3), st.sampled_from([b"[%s]", b'{"a": %s}', b"%s"]))
def test_what_orjson_refuses_the_large_path_refuses(pieces: list[bytes], shape: bytes) -> None:
    _same(shape % b",".join(pieces))


def test_the_large_path_lets_the_body_go() -> None:
    doc = {"choices": [{"message": {"content": _text(10_000, "x")}}]}
    body = bytearray(json.dumps(doc, ensure_ascii=False).encode())
    assert loads_reply(body, large_bytes=1024) == doc
    assert len(body) == 0  # emptied: its memory is free while the record is built
    # a body that escapes a character beyond the BMP (a surrogate pair) stays on orjson, whole, read the same
    escaped = bytearray(json.dumps(doc).encode())
    assert b"\\ud83d" in escaped
    assert loads_reply(escaped, large_bytes=1024) == doc and len(escaped) > 10_000
    small = bytearray(b'{"a": 1}')
    assert loads_reply(small, large_bytes=1024) == {"a": 1} and small == b'{"a": 1}'  # a small body is left as is
