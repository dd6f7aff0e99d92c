"""The worker against the simulator over real HTTP, writing a real SQLite file."""

from __future__ import annotations

import json
import time

import orjson
import pytest
from sqlalchemy import text
from workerkit import Background, answer_ok, counts, make_config, records, run_row, run_to_end, wait_for

from synthwatch.store import queue as store

MODES = [
    # (simulator reasoning_field, expected source)
    ("reasoning", "reasoning"),
    ("reasoning_content", "reasoning_content"),
    ("both", "reasoning"),
    ("inline", "inline"),
    ("inline-no-open", "inline-no-open"),
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(("field", "source"), MODES)
def test_reasoning_captured_in_every_field_mode(engine, sim, prompts, field, source, stream) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field=field, seed=7)
    config = make_config(url, prompts(12), stream=stream)
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    rows = records(engine, run_id)
    assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert r["reasoning"].strip(), r
        assert r["reasoning_source"] == source
        assert "<think>" not in r["content"] and "</think>" not in r["content"]
        assert "<think>" not in r["reasoning"] and "</think>" not in r["reasoning"]
        assert answer_ok(r), r["content"]
        # no doubled text: the reasoning is not its own half repeated twice
        half = len(r["reasoning"]) // 2
        assert r["reasoning"][:half] != r["reasoning"][half:2 * half] or half == 0
        assert r["finish_reason"] == "stop"
        assert r["completion_tokens"] and r["prompt_tokens"]
        assert r["system_fingerprint"] == "vllm-0.32.0-sim" and r["model"] == "sim-reasoner"
        assert r["latency_s"] > 0 and r["attempts"] == 1
        if stream:
            assert r["ttft_s"] is not None and r["ttft_s"] <= r["latency_s"]
            assert r["n_chunks"] > 2
    if field == "both":
        extra = json.loads(rows[0]["extra_json"])
        assert extra["duplicate_fields"] == ["reasoning_content"]
    run = run_row(engine, run_id)
    assert (run["n_ok"], run["n_pending"], run["n_in_flight"], run["status"]) == (12, 0, 0, "completed")


def test_unknown_fields_and_token_ids_are_kept(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=1)
    config = make_config(url, prompts(3), request_token_ids=True)
    run_id, _ = run_to_end(any_engine, config)
    r = records(any_engine, run_id)[0]
    extra = json.loads(r["extra_json"])
    # vLLM's own keys that the OpenAI schema does not have are stored verbatim
    assert "prompt_text" in extra.get("top", {}) or "stop_reason" in extra.get("choice", {}), extra
    ids = json.loads(r["token_ids_json"])
    assert ids["prompt"] and ids["completion"]
    assert len(ids["completion"]) == r["completion_tokens"]


@pytest.mark.slow
def test_fault_mix_every_record_has_an_ending(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=3, rate_429=0.1, rate_500=0.1, rate_drop=0.08, rate_malformed=0.08, rate_truncated_json=0.0,
              rate_wrong_content_type=0.05, rate_error_body=0.05, rate_stall=0.05, stall_s=3.0)
    config = make_config(url, prompts(120), concurrency=16,
                         timeouts={"connect_s": 5, "total_s": 30, "idle_s": 1.0},
                         retries={"max_attempts": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05})
    t0 = time.monotonic()
    run_id, final = run_to_end(any_engine, config, timeout_s=90)
    assert final == "completed"
    rows = records(any_engine, run_id)
    assert len(rows) == 120
    statuses = {r["status"] for r in rows}
    assert statuses <= {"ok", "error", "timeout"}
    kinds = set()
    for r in rows:
        attempts = json.loads(r["attempts_json"])
        assert attempts and len(attempts) == r["attempts"]
        for a in attempts:
            if not a["ok"]:
                assert a["kind"] and a["error"], a
                kinds.add(a["kind"])
        if r["status"] == "ok":
            assert r["reasoning"] and answer_ok(r)
        else:
            assert r["error_kind"] and r["error"], r
    # each injected fault was seen and named; the stall was caught by the idle timeout, not the total
    assert {"http_429", "http_5xx", "dropped", "malformed", "bad_content_type", "error_body", "idle_timeout"} <= kinds, kinds
    assert time.monotonic() - t0 < 60
    with any_engine.connect() as conn:
        n_events = conn.execute(text("SELECT COUNT(*) FROM error_event WHERE run_id = :r"), {"r": run_id}).scalar()
        series = conn.execute(text("SELECT SUM(attempts_failed), SUM(retries), SUM(ok) FROM series WHERE run_id = :r"),
                              {"r": run_id}).one()
    assert n_events == series[0] > 0
    assert series[2] == counts(any_engine, run_id).get("ok", 0)


def test_idle_timeout_catches_a_stall_quickly(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1, rate_stall=1.0, stall_s=20.0)
    config = make_config(url, prompts(2), timeouts={"connect_s": 5, "total_s": 60, "idle_s": 0.5},
                         retries={"max_attempts": 1})
    t0 = time.monotonic()
    run_id, _ = run_to_end(any_engine, config)
    assert time.monotonic() - t0 < 10
    for r in records(any_engine, run_id):
        assert r["status"] == "timeout" and r["error_kind"] == "idle_timeout"
        assert r["reasoning"] or r["content"] is not None  # partial text kept


def test_long_healthy_stream_is_not_killed_by_idle_timeout(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1, tokens_per_s=40, reasoning_tokens="60", content_tokens="20")
    config = make_config(url, prompts(2), timeouts={"connect_s": 5, "total_s": 60, "idle_s": 0.5})
    run_id, _ = run_to_end(any_engine, config)
    rows = records(any_engine, run_id)
    assert all(r["status"] == "ok" for r in rows)
    assert min(r["latency_s"] for r in rows) > 1.5  # longer than the idle timeout, still fine


def test_slow_non_streamed_reply_is_not_an_idle_timeout(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    # a server answering without streaming sends nothing until the whole reply is generated: silence longer
    # than the idle timeout is normal there, and only the total timeout applies
    url = sim(seed=1, tokens_per_s=40, reasoning_tokens="60", content_tokens="20")
    config = make_config(url, prompts(2), stream=False, timeouts={"connect_s": 5, "total_s": 60, "idle_s": 0.5},
                         retries={"max_attempts": 1})
    run_id, _ = run_to_end(any_engine, config)
    rows = records(any_engine, run_id)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    assert min(r["latency_s"] for r in rows) > 1.5


def test_cap_lowered_while_running(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=2, tokens_per_s=200, reasoning_tokens="20", content_tokens="10")
    config = make_config(url, prompts(200), concurrency=4, cap=150)
    bg = Background(any_engine, config).start()
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_ok"] >= 5, what="first records")
    store.apply_control(any_engine, bg.run_id, "cap", 20)
    assert bg.join() == "completed"
    assert counts(any_engine, bg.run_id)["ok"] == 20
    assert run_row(any_engine, bg.run_id)["n_ok"] == 20


@pytest.mark.slow
def test_pause_stops_new_requests_and_resume_continues(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=2, tokens_per_s=100, reasoning_tokens="20", content_tokens="10")
    config = make_config(url, prompts(60), concurrency=4)
    bg = Background(any_engine, config).start()
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_ok"] >= 4, what="first records")
    store.apply_control(any_engine, bg.run_id, "pause")
    t0 = time.monotonic()
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_in_flight"] == 0, what="in-flight to drain")
    assert run_row(any_engine, bg.run_id)["status"] == "paused"
    assert time.monotonic() - t0 < 3
    done = run_row(any_engine, bg.run_id)["n_ok"]
    time.sleep(1.0)
    assert run_row(any_engine, bg.run_id)["n_ok"] == done  # nothing new while paused
    store.apply_control(any_engine, bg.run_id, "resume")
    assert bg.join() == "completed"
    assert counts(any_engine, bg.run_id) == {"ok": 60}


def test_immediate_stop_returns_in_flight_to_pending(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=2, tokens_per_s=20, reasoning_tokens="60", content_tokens="20")
    config = make_config(url, prompts(40), concurrency=6)
    bg = Background(any_engine, config).start()
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_in_flight"] == 6, what="requests in flight")
    t0 = time.monotonic()
    store.apply_control(any_engine, bg.run_id, "stop_now")
    assert bg.join(10) == "stopped"
    assert time.monotonic() - t0 < 2.5
    run = run_row(any_engine, bg.run_id)
    assert run["n_in_flight"] == 0 and run["status"] == "stopped"
    back = records(any_engine, bg.run_id, "attempts > 0 AND status = 'pending'")
    assert len(back) == 6
    for r in back:
        assert json.loads(r["attempts_json"])[-1]["kind"] == "interrupted"
    assert counts(any_engine, bg.run_id) == {"pending": 40}


def test_graceful_stop_lets_in_flight_finish(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=2, tokens_per_s=100, reasoning_tokens="30", content_tokens="10")
    config = make_config(url, prompts(40), concurrency=5)
    bg = Background(any_engine, config).start()
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_in_flight"] == 5, what="requests in flight")
    store.apply_control(any_engine, bg.run_id, "stop")
    assert bg.join(10) == "stopped"
    c = counts(any_engine, bg.run_id)
    assert c.get("in_flight", 0) == 0 and c["ok"] >= 5 and c["ok"] + c["pending"] == 40


def test_concurrency_changes_live(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=2, tokens_per_s=50, reasoning_tokens="20", content_tokens="10")
    config = make_config(url, prompts(200), concurrency=2)
    bg = Background(any_engine, config).start()
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_in_flight"] == 2, what="2 in flight")
    store.apply_control(any_engine, bg.run_id, "concurrency", 12)
    wait_for(lambda: run_row(any_engine, bg.run_id)["n_in_flight"] == 12, timeout_s=2.5, what="12 in flight")
    store.apply_control(any_engine, bg.run_id, "stop_now")
    bg.join(10)


def test_two_endpoints_one_failing(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    good = sim(seed=1)
    bad = sim(seed=1, rate_500=1.0)
    config = make_config([bad, good], prompts(80), concurrency=4,
                         pool={"eject_after_failures": 3, "eject_s": 30})
    run_id, final = run_to_end(any_engine, config)
    assert final == "completed"
    rows = records(any_engine, run_id)
    assert all(r["status"] == "ok" for r in rows)
    good_label = good.split("//")[1].split("/")[0]
    assert {r["endpoint"] for r in rows} == {good_label}
    with any_engine.connect() as conn:
        per_ep = dict(conn.execute(text(
            "SELECT endpoint, SUM(attempts_failed) FROM series WHERE run_id = :r AND endpoint != '' GROUP BY endpoint"),
            {"r": run_id}).all())
    bad_label = bad.split("//")[1].split("/")[0]
    # the failing endpoint was ejected after a few failures instead of taking half the traffic
    assert 3 <= per_ep[bad_label] <= 8


def test_series_feeds_charts_without_scanning_records(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=4, rate_empty_reasoning=0.5)
    config = make_config(url, prompts(50))
    run_id, _ = run_to_end(any_engine, config)
    with any_engine.connect() as conn:
        s = conn.execute(text(
            "SELECT SUM(ok), SUM(reasoning_tokens), SUM(content_tokens), SUM(empty_reasoning), SUM(prompt_tokens)"
            " FROM series WHERE run_id = :r"), {"r": run_id}).one()
        empty = conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND reasoning = ''"),
                             {"r": run_id}).scalar()
    assert s[0] == 50 and s[1] > 0 and s[2] > 0 and s[4] > 0
    assert s[3] == empty and 10 < empty < 40


def test_resume_does_not_redo_ok_records(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=5)
    config = make_config(url, prompts(30), cap=10)
    run_id, final = run_to_end(any_engine, config)
    assert final == "completed" and counts(any_engine, run_id) == {"ok": 10, "pending": 20}
    first = {r["id"]: r["response_id"] for r in records(any_engine, run_id, "status = 'ok'")}
    config2 = make_config(url, prompts(30, "other.jsonl"), cap=25)
    assert run_to_end(any_engine, config2, run_id=run_id)[1] == "completed"
    after = {r["id"]: r["response_id"] for r in records(any_engine, run_id, "status = 'ok'")}
    assert len(after) == 25
    assert all(after[i] == rid for i, rid in first.items())
    # the cap is a control (the run row), not a setting: the stored config version is untouched
    assert run_row(any_engine, run_id)["cap"] == 25
    assert orjson.loads(run_row(any_engine, run_id)["config_json"])["cap"] == 10


@pytest.mark.parametrize("control", ["pause", "stop", "cap"])
def test_reserve_claimed_ahead_goes_back_on_controls(any_engine, sim, prompts, monkeypatch, control) -> None:  # type: ignore[no-untyped-def]
    # At high completion rates the worker claims records ahead of its free slots. A pause, a stop or a new
    # cap must hand those back untouched (pending, no attempt), and nothing may run twice or get lost.
    from synthwatch.workers import engine as engine_mod

    monkeypatch.setattr(engine_mod, "RESERVE_MIN", 4)  # a reserve at the rates a test machine reaches
    url = sim(seed=3, tokens_per_s=0, ttft_ms=0, reasoning_tokens="8", content_tokens="4")
    n = 3000
    config = make_config(url, prompts(n), concurrency=4)
    bg = Background(any_engine, config).start()
    peak = wait_for(lambda: (lambda r: r["n_in_flight"] if r["n_in_flight"] > 4 else 0)(run_row(any_engine, bg.run_id)),
                    what="claims ahead of the 4 slots")
    assert peak > 4
    if control == "cap":
        cap = run_row(any_engine, bg.run_id)["n_ok"] + 10
        store.apply_control(any_engine, bg.run_id, "cap", cap)
        after = run_row(any_engine, bg.run_id)
        claimed = after["n_ok"] + after["n_in_flight"]  # done or held when the cap changed; later claims obey it
        assert bg.join(20) == "completed"
        # requests already running finish; the reserve goes back, and the run ends exactly at the cap when it
        # can, never beyond what was already claimed when the cap came down
        assert cap <= counts(any_engine, bg.run_id)["ok"] <= max(cap, claimed)
    else:
        store.apply_control(any_engine, bg.run_id, control)
        wait_for(lambda: run_row(any_engine, bg.run_id)["n_in_flight"] == 0, timeout_s=3, what="claims returned")
        if control == "stop":
            assert bg.join(10) == "stopped"
        else:
            done = run_row(any_engine, bg.run_id)["n_ok"]
            time.sleep(0.5)
            assert run_row(any_engine, bg.run_id)["n_ok"] == done  # nothing runs while paused
    c = counts(any_engine, bg.run_id)
    assert c.get("in_flight", 0) == 0 and c.get("ok", 0) + c.get("pending", 0) == n
    # returned claims were never requested: no attempt recorded, nothing cancelled
    assert not records(any_engine, bg.run_id, "status = 'pending' AND (attempts > 0 OR claimed_at IS NOT NULL)")
    row = run_row(any_engine, bg.run_id)
    assert (row["n_ok"], row["n_pending"], row["n_in_flight"]) == (c.get("ok", 0), c.get("pending", 0), 0)
    if control == "pause":
        store.apply_control(any_engine, bg.run_id, "resume")
        assert bg.join(60) == "completed"
        assert counts(any_engine, bg.run_id) == {"ok": n}
        assert {r["attempts"] for r in records(any_engine, bg.run_id)} == {1}


def test_reserve_never_claims_past_the_cap(any_engine, sim, prompts, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.workers import engine as engine_mod

    monkeypatch.setattr(engine_mod, "RESERVE_MIN", 4)
    url = sim(seed=4, tokens_per_s=0, ttft_ms=0, reasoning_tokens="8", content_tokens="4")
    config = make_config(url, prompts(2000), concurrency=4, cap=700)
    run_id, final = run_to_end(any_engine, config)
    assert final == "completed"
    assert counts(any_engine, run_id) == {"ok": 700, "pending": 1300}
    assert not records(any_engine, run_id, "status = 'pending' AND (attempts > 0 OR claimed_at IS NOT NULL)")
