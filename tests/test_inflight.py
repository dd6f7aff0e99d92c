"""Checks on streams in flight (#36): a run at the issue's shape (the simulator's pacing, 128 in flight) is paused
from its streams' first tokens, with the evidence naming a stream; a doomed run's requests are cancelled."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

from conftest import HTTP_TIMEOUT_S
from test_checks_kit import CheckedBackground, alarms, events
from workerkit import make_config, records, run_row, wait_for

from synthwatch.store import queue as store

# the shape: ~11 tokens/s per stream, first token after 0.8 s, ~800 reasoning tokens, 100-300 answer tokens
SHAPE = {"server_kind": "vllm", "tokens_per_s": 11, "ttft_ms": 800, "reasoning_tokens": "lognormal:6.68:0.6", "content_tokens": "100-300"}


def _running(url: str) -> float:
    root = url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/metrics", timeout=HTTP_TIMEOUT_S) as resp:
        body = resp.read().decode()
    m = re.search(r'^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$', body, re.M)
    assert m, body[:2000]
    return float(m.group(1))


def _paused_at(engine: Any, run_id: int) -> float | None:
    ev = [e for e in events(engine, run_id) if e["action"] == "pause" and e["actor"] == "alarm"]
    return ev[0]["t"] if ev else None


def _start(engine: Any, url: str, prompts: Any, **over: Any) -> tuple[Any, float]:
    config = make_config(url, prompts(512), concurrency=128,
                         timeouts={"connect_s": 10, "total_s": 600, "idle_s": 60}, **over)
    t0 = time.time()
    bg = CheckedBackground(engine, config).start()
    return bg, t0


def _evidence(alarm: dict[str, Any]) -> dict[str, Any]:
    ctx = json.loads(alarm["evidence_json"])["ctx"]
    assert ctx["in_flight"] and ctx["delta"] >= 1 and ctx["record_id"] == alarm["example_record_id"], ctx
    assert ctx["endpoint"], ctx
    # the run page's words name the stream that showed it
    assert f"Seen on a stream in flight on {ctx['endpoint']}: record {ctx['record_id']} at delta" in alarm["message"]
    return ctx


def test_mismatch_pauses_within_5s_and_its_streams_may_finish(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=3, **SHAPE)
    bg, t0 = _start(engine, url, prompts, reasoning={"mode": "reasoning_content"}, name="mm-inflight")
    try:
        wait_for(lambda: _paused_at(engine, bg.run_id) is not None, timeout_s=60, what="auto-pause")
        started = run_row(engine, bg.run_id)["started_at"] or t0
        paused = _paused_at(engine, bg.run_id)
        assert paused is not None and paused - started <= 5.0, (paused - started)
        print(f"\npaused {paused - started:.2f} s after the run's start")
        r = run_row(engine, bg.run_id)
        assert r["n_ok"] + r["n_error"] == 0  # no record had finished: the streams in flight said it
        [alarm] = alarms(engine, bg.run_id)
        assert alarm["rule"] == "field_mismatch" and alarm["auto_paused"]
        ctx = _evidence(alarm)
        assert ctx["fields"] == ["reasoning"] and ctx["excerpt"]
        # repairable: the streams in flight are let finish (the raw response keeps the unread field)
        time.sleep(1.0)
        assert _running(url) > 0
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(60)


def test_no_reasoning_pauses_within_5s_and_cancels_its_streams(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="none", seed=4, **SHAPE)
    bg, t0 = _start(engine, url, prompts, reasoning={"mode": "auto"}, name="none-inflight")
    try:
        wait_for(lambda: _paused_at(engine, bg.run_id) is not None, timeout_s=60, what="auto-pause")
        started = run_row(engine, bg.run_id)["started_at"] or t0
        paused = _paused_at(engine, bg.run_id)
        assert paused is not None and paused - started <= 5.0, (paused - started)
        print(f"\npaused {paused - started:.2f} s after the run's start")
        got = {a["rule"]: a for a in alarms(engine, bg.run_id)}
        alarm = got["empty_reasoning"]
        assert alarm["auto_paused"]
        _evidence(alarm)
        # doomed: the requests are cancelled (the server's running count falls to 0) within 10 s of the pause
        wait_for(lambda: _running(url) == 0, timeout_s=max(0.5, paused + 10 - time.time()),
                 what="vllm:num_requests_running == 0")
        wait_for(lambda: run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=10, what="claims returned")
        r = run_row(engine, bg.run_id)
        assert r["n_ok"] == 0 and r["status"] == "paused"  # never counted as generated
        recs = records(engine, bg.run_id)
        cancelled = [x for x in recs if x["attempts_json"] and "cancelled: the run paused on empty_reasoning"
                     in x["attempts_json"]]
        assert len(cancelled) >= 100 and all(x["status"] == "pending" for x in cancelled)
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(60)


def test_pause_offers_cancel_or_finish_for_the_requests_in_flight(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    """A person's pause says what happens to the requests in flight (the API's in_flight, the CLI's --in-flight, the
    run page's Pause / Pause now): finish (the default) leaves them running; cancel closes them, back to pending."""
    import httpx

    url = sim(reasoning_field="reasoning", seed=5, **SHAPE)
    bg, _t0 = _start(engine, url, prompts, reasoning={"mode": "reasoning"}, name="manual-pause")
    srv = live_app()
    try:
        wait_for(lambda: _running(url) >= 64, timeout_s=30, what="streams running")
        r = httpx.post(f"{srv.url}/api/runs/{bg.run_id}/control", json={"action": "pause", "in_flight": "finish"},
                       timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200, r.text
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused", timeout_s=10, what="paused")
        time.sleep(1.0)
        assert _running(url) >= 64  # let finish: still generating
        r = httpx.post(f"{srv.url}/api/runs/{bg.run_id}/control", json={"action": "stop", "in_flight": "cancel"},
                       timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 400  # a stop's choice is stop or stop_now
        # resume, then pause with the requests cancelled
        store.apply_control(engine, bg.run_id, "resume")
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "running", timeout_s=10, what="running")
        r = httpx.post(f"{srv.url}/api/runs/{bg.run_id}/control", json={"action": "pause", "in_flight": "cancel"},
                       timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200, r.text
        wait_for(lambda: _running(url) == 0, timeout_s=10, what="vllm:num_requests_running == 0")
        wait_for(lambda: run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=10, what="claims returned")
        # the message is written after the claims are returned (a fresh-clone CI run read it in between): waited for
        wait_for(lambda: "cancelled" in (run_row(engine, bg.run_id)["status_message"] or ""), timeout_s=10,
                 what="the run's message to say its requests were cancelled")
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(60)


def test_streams_api_across_two_workers_on_both_backends(any_db, any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """Each worker publishes its own streams; the API shows both workers' on SQLite and on PostgreSQL, bounded, and
    the model text as data (a JSON string), never markup."""
    import httpx
    from conftest import LiveServer
    from workerkit import Background

    from synthwatch.app.main import create_app
    from synthwatch.settings import Settings

    url = sim(reasoning_field="reasoning", seed=8, tokens_per_s=20, ttft_ms=100, reasoning_tokens="2000-2400",
              content_tokens="20-30")
    config = make_config(url, prompts(40), concurrency=3, reasoning={"mode": "reasoning"},
                         timeouts={"connect_s": 10, "total_s": 600, "idle_s": 60})
    a = CheckedBackground(any_engine, config).start()
    b = Background(any_engine, config, run_id=a.run_id).start()
    srv = LiveServer(create_app(any_db, Settings(db=any_db))).start()
    try:
        def six() -> dict[str, Any] | None:
            d = httpx.get(f"{srv.url}/api/runs/{a.run_id}/streams", timeout=HTTP_TIMEOUT_S).json()
            return d if len(d["streams"]) == 6 and all(s["reasoning"] for s in d["streams"]) else None

        d = wait_for(six, timeout_s=30, what="6 streams from 2 workers")
        assert d["workers"] == 2 and d["n_in_flight"] == 6 and len({s["worker_id"] for s in d["streams"]}) == 2
        assert all(len(s["reasoning"]) <= 300 and s["field"] == "reasoning" and s["tokens"] > 0 for s in d["streams"])
        one = d["streams"][0]["record_id"]
        only = httpx.get(f"{srv.url}/api/runs/{a.run_id}/streams", params={"record": one},
                         timeout=HTTP_TIMEOUT_S).json()
        assert [s["record_id"] for s in only["streams"]] == [one]
    finally:
        srv.stop()
        store.apply_control(any_engine, a.run_id, "stop_now")
        a.join(60)
        b.join(60)


def test_stream_text_is_escaped_and_bounded_in_the_panel(engine, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    """Model text in a worker's snapshot (and a snapshot that is not what a worker writes) reaches the page escaped,
    cut to live_stream_tail_chars, special tokens marked; a malformed row is skipped."""
    import httpx
    import orjson
    from sqlalchemy import text as sql
    from workerkit import create

    run_id = create(engine, make_config("http://127.0.0.1:9/v1", prompts(3)))
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>" + "y" * 500 + "<|im_end|></think>"
    with engine.begin() as conn:
        wid = store.register_worker(conn, run_id)
        snap = {"n": 2, "streams": [
            {"record_id": 1, "endpoint": "<b>ep</b>", "age_s": 3.0, "since_token_s": 9.0, "tokens": 40,
             "tokens_per_s": 13.3, "field": "content", "reasoning_field": "reasoning", "reasoning": evil,
             "content": evil},
            {"record_id": "2; DROP TABLE run", "content": "x"}, "not a stream"]}
        conn.execute(sql("UPDATE worker SET streams_json = :j, streams_at = :t WHERE id = :w"),
                     {"j": orjson.dumps(snap).decode(), "t": time.time(), "w": wid})
        conn.execute(sql("UPDATE run SET status = 'running' WHERE id = :r"), {"r": run_id})
    srv = live_app()
    d = httpx.get(f"{srv.url}/api/runs/{run_id}/streams", timeout=HTTP_TIMEOUT_S).json()
    [s] = d["streams"]
    assert len(s["reasoning"]) == 300 and s["reasoning"].endswith("<|im_end|></think>") and s["stalled"]
    for path in (f"/runs/{run_id}/streams", f"/runs/{run_id}/streams/1"):
        html = httpx.get(f"{srv.url}{path}", timeout=HTTP_TIMEOUT_S).text
        assert "<script>" not in html and "<img" not in html and "<b>ep</b>" not in html, path
        assert '<mark class="tk-special">&lt;|im_end|&gt;</mark><mark class="tk-special">&lt;/think&gt;</mark>' in html
    assert 'data-testid="stalled"' in httpx.get(f"{srv.url}/runs/{run_id}/streams", timeout=HTTP_TIMEOUT_S).text


def test_watch_streams_prints_the_live_tails(db_path, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """`synthwatch watch-streams RUN` (a real process) prints each stream with its text while none has finished,
    then ends by itself when the run stops."""
    from conftest import popen_cli, run_cli

    url = sim(reasoning_field="reasoning", seed=6, tokens_per_s=20, ttft_ms=100, reasoning_tokens="2000-2400",
              content_tokens="20-30")
    config = make_config(url, prompts(20), concurrency=2, reasoning={"mode": "reasoning"}, name="tails",
                         timeouts={"connect_s": 10, "total_s": 600, "idle_s": 60})
    bg = CheckedBackground(engine, config).start()
    follow = None
    try:
        wait_for(lambda: len(records(engine, bg.run_id, "status = 'in_flight'")) == 2, what="2 in flight")
        out = wait_for(lambda: (p := run_cli("watch-streams", "tails", "--db", str(db_path), "--once",
                                             check=True)).stdout.count("reasoning: ") == 2
                       and all(ln.strip() != "reasoning:" for ln in p.stdout.splitlines()) and p.stdout,
                       timeout_s=60, interval_s=0.5, what="two streams with their text")
        assert "tails: 2 streams in flight on 1 worker(s), 2 shown" in out, out
        assert run_row(engine, bg.run_id)["n_ok"] == 0
        follow = popen_cli("watch-streams", "tails", "--db", str(db_path), "--every-s", "0.5")
        assert follow.stdout is not None
        first = follow.stdout.readline()  # its first redraw is out (however long the process took to start)
        assert "tails: 2 streams in flight" in first, first
        store.apply_control(engine, bg.run_id, "stop_now")
        stdout = first + follow.stdout.read()  # to its end: the process ends by itself when the run stops
        assert follow.wait(timeout=60) == 0 and stdout.count("reasoning: ") >= 2, stdout
        assert "tails: not running, no stream in flight" in stdout.splitlines()[-1]
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()  # a process this test started, by its handle
            follow.wait(30)
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(60)


def test_cancelled_requests_count_as_billed_where_the_server_reported_usage(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    """A doomed run's requests cancelled by its pause: where the server sent its usage while streaming (vLLM's
    stream_options.continuous_usage_stats), their tokens are billed and discarded in the cost view; no record is
    generated."""
    import httpx

    url = sim(reasoning_field="none", seed=4, **SHAPE)
    bg, _t0 = _start(engine, url, prompts, reasoning={"mode": "reasoning"}, name="billed-discarded",
                     sampling={"extra_body": {"stream_options": {"include_usage": True,
                                                                 "continuous_usage_stats": True}}})
    srv = live_app()
    try:
        wait_for(lambda: _paused_at(engine, bg.run_id) is not None, timeout_s=60, what="auto-pause")
        wait_for(lambda: _running(url) == 0, timeout_s=10, what="vllm:num_requests_running == 0")
        wait_for(lambda: run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=10, what="claims returned")

        def billed() -> dict[str, Any] | None:
            t = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/tokens", timeout=HTTP_TIMEOUT_S).json()["total"]
            return t if t["billed_completion"] > 0 else None

        total = wait_for(billed, timeout_s=10, what="billed tokens of the cancelled requests")
        assert total["completion"] == 0 and total["billed_prompt"] > 0 and total["billed_estimated"] == 0, total
        assert run_row(engine, bg.run_id)["n_ok"] == 0
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(60)


def test_a_snapshot_of_a_stream_echoing_the_key_is_redacted() -> None:
    """A stream's tail goes into the store (worker.streams_json) and the dashboard: redacted and storable like every
    other row of server text (#34's one way in, for #36's snapshots). The real accumulator, fed the deltas."""
    from synthwatch.capture.stream import StreamAccumulator
    from synthwatch.redact import add_secret, forget_secret
    from synthwatch.workers.inflight import StreamBoard

    key = "sk-live-" + "Q7x" * 12
    add_secret(key)
    try:
        acc = StreamAccumulator()
        for piece in ("thinking about ", key, " and \x00 more"):
            acc.feed({"choices": [{"index": 0, "delta": {"reasoning": piece}}]})
        for piece in ("the answer echoes ", key):
            acc.feed({"choices": [{"index": 0, "delta": {"content": piece}}]})
        board = StreamBoard(None, lambda verdicts: None)
        board.open(7, "ep").seen(acc)
        [row] = board.snapshot(300, 64)
        assert row["reasoning_field"] == "reasoning"
        for text in (row["reasoning"], row["content"]):
            assert key not in text and key[:16] not in text and "\x00" not in text, text
        assert row["content"].startswith("the answer echoes ")
    finally:
        forget_secret(key)
