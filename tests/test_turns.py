"""Multi-turn regeneration (turns = "all"): every assistant turn written by the model, in order, each request
carrying the model's own earlier answers; each turn stored before the next is asked for, so a kill -9 resumes
at the next turn with nothing done twice. Real worker, real simulator, real databases."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S, cli_env, kill_9_repeatedly, popen_cli
from sqlalchemy import text
from test_checks_kit import run_checked
from workerkit import make_config, records, run_row, run_to_end, wait_for

from synthwatch.capture import turns as turns_mod
from synthwatch.check_catalog import BIT
from synthwatch.store.db import open_engine

DATASET_ANSWER = "DATASET-ANSWER"


def write_conversations(path: Path, n: int, *, with_tool_step: bool = False) -> Path:
    """n conversations of 1 to 3 user turns; the dataset's assistant answers are marked DATASET-ANSWER."""
    with path.open("w") as fh:
        for i in range(n):
            k = 1 + i % 3
            msgs: list[dict[str, Any]] = [{"role": "system", "content": "Answer briefly."}]
            for j in range(k):
                a, b = 3 + (i * 7 + j) % 97, 5 + (i * 11 + j * 3) % 89
                msgs.append({"role": "user", "content": f"[c{i} t{j}] What is {a} + {b}?"})
                msgs.append({"role": "assistant", "content": f"{DATASET_ANSWER} {i}.{j}"})
            row: dict[str, Any] = {"id": f"c{i}", "messages": msgs}
            if with_tool_step and i % 2 == 0:
                # a tool step the dataset made: its results answer the dataset's call, so it stays the dataset's
                call = {"id": "call_1", "type": "function",
                        "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}
                msgs[2:2] = [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
                row["tools"] = [{"type": "function", "function": {
                    "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
            fh.write(json.dumps(row) + "\n")
    return path


def _conv_key(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """(conversation, turn) of a request: its first user turn names the conversation, the turn is the number
    of user turns it carries minus one."""
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[0].split("]")[0] + "]", len(users) - 1


def _requests(url: str) -> list[list[dict[str, Any]]]:
    return list(httpx.get(url.removesuffix("/v1") + "/sim/requests", timeout=HTTP_TIMEOUT_S).json())


def _requests_seen(url: str) -> int:
    return int(httpx.get(url.removesuffix("/v1") + "/sim/stats", timeout=HTTP_TIMEOUT_S).json()["chat_requests"])


def _sent_assistants(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") == "assistant" and not m.get("tool_calls")]


@pytest.mark.parametrize("history_reasoning", ["strip", "keep"])
def test_all_turns_regenerated_in_order_with_the_models_own_history(
        any_engine, tmp_path, sim, history_reasoning) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=3, keep_requests=10_000, reasoning_tokens="8-20", content_tokens="4-10")
    data = write_conversations(tmp_path / "conv.jsonl", 12)
    cfg = make_config(url, data, turns="all", history_reasoning=history_reasoning)
    run_id, final = run_to_end(any_engine, cfg)
    assert final == "completed"
    run = run_row(any_engine, run_id)
    recs = records(any_engine, run_id)
    assert len(recs) == 12
    expected_turns = sum(1 + i % 3 for i in range(12))
    assert run["n_turns"] == run["n_turns_done"] == expected_turns
    sent = _requests(url)
    assert len(sent) == expected_turns  # every turn asked for once: no retries, nothing twice
    by_key = {_conv_key(m): m for m in sent}
    assert len(by_key) == expected_turns
    for r in recs:
        assert r["status"] == "ok"
        n = 1 + r["idx"] % 3
        assert r["n_turns"] == n and r["turns_done"] == n
        turns = turns_mod.all_turns(r)
        assert len(turns) == n
        for k, turn in enumerate(turns):
            assert turn["reasoning"] and turn["content"] and DATASET_ANSWER not in turn["content"]
            assert [a["ok"] for a in turn["attempts"]] == [True]
            # the request for turn k carried the model's turns 0..k-1, not the dataset's answers
            req = by_key[(f"[c{r['idx']} t0]", k)]
            history = _sent_assistants(req)
            assert [h["content"] for h in history] == [t["content"] for t in turns[:k]]
            for h, t in zip(history, turns[:k], strict=True):
                if history_reasoning == "keep":
                    assert h["reasoning_content"] == t["reasoning"]
                else:
                    assert "reasoning_content" not in h
            # the simulator answers the question of its last user turn: the turn answers its own question
            a, b = req[-1]["content"].split("What is ")[1].rstrip("?").split(" + ")
            assert str(int(a) + int(b)) in turn["content"]
        assert r["attempts"] == n
    assert orjson.loads(run["config_json"])["history_reasoning"] == history_reasoning
    # the throughput charts count every turn's tokens; their record counters count conversations
    with any_engine.connect() as conn:
        tokens, finished = conn.execute(text("SELECT SUM(completion_tokens), SUM(finished) FROM series"
                                             " WHERE run_id = :r"), {"r": run_id}).one()
    assert tokens == sum(t["completion_tokens"] for r in recs for t in turns_mod.all_turns(r))
    assert finished == 12


def test_turns_last_keeps_todays_behaviour(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=3, keep_requests=1000)
    data = write_conversations(tmp_path / "conv.jsonl", 6)
    run_id, final = run_to_end(engine, make_config(url, data))
    assert final == "completed"
    sent = _requests(url)
    assert len(sent) == 6
    for req in sent:  # the dataset's history, as before
        assert all(DATASET_ANSWER in h["content"] for h in _sent_assistants(req))
    for r in records(engine, run_id):
        assert r["n_turns"] == 1 and r["turns_done"] == 1 and r["turns_json"] is None
    assert run_row(engine, run_id)["n_turns"] == 6


def test_a_tool_step_of_the_dataset_stays_the_datasets(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=4, keep_requests=1000)
    data = write_conversations(tmp_path / "conv.jsonl", 6, with_tool_step=True)
    run_id, final = run_to_end(engine, make_config(url, data, turns="all"))
    assert final == "completed"
    for r in records(engine, run_id):
        assert r["status"] == "ok", r["error"]
        assert r["n_turns"] == 1 + r["idx"] % 3  # the tool step is not a turn the model writes
    for req in _requests(url):
        for m in req:
            if m.get("role") == "assistant" and m.get("tool_calls"):
                assert m["tool_calls"][0]["function"]["name"] == "lookup"  # the dataset's call, kept


def test_a_failing_earlier_turn_fails_the_record_and_is_named(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=5, rate_empty_reasoning=0.3)
    data = write_conversations(tmp_path / "conv.jsonl", 30)
    cfg = make_config(url, data, turns="all", checks={"rules": {"empty_reasoning": {"auto_pause": False}}})
    run_id, final = run_checked(engine, cfg)
    assert final == "completed"
    bit = BIT["empty_reasoning"]
    seen_earlier = 0
    for r in records(engine, run_id):
        turns = turns_mod.all_turns(r)
        empty = [k + 1 for k, t in enumerate(turns) if not (t["reasoning"] or "").strip()]
        assert bool(r["check_flags"] & bit) == bool(empty), (r["idx"], empty)
        det = orjson.loads(r["check_json"] or "{}")
        named = sorted(int(k) for k, d in (det.get("turns") or {}).items() if "empty_reasoning" in d)
        assert named == [k for k in empty if k < len(turns)]
        seen_earlier += bool(named)
    assert seen_earlier >= 2  # the case this test is about happened
    with engine.connect() as conn:
        n_fail, n_total = conn.execute(text("SELECT n_fail, n_total FROM check_stat WHERE run_id = :r"
                                            " AND check_name = :c"), {"r": run_id, "c": "empty_reasoning"}).one()
    # the run's rates count records: a record fails when any of its turns does
    assert n_fail == sum(bool(r["check_flags"] & bit) for r in records(engine, run_id))
    assert n_total == 30


def _persisted(engine: Any, run_id: int) -> dict[tuple[str, int], str]:
    """(conversation, turn) -> content of every turn stored so far."""
    out: dict[tuple[str, int], str] = {}
    for r in records(engine, run_id):
        turns = turns_mod.load(r["turns_json"])
        if r["status"] == "ok":
            turns = turns_mod.all_turns(r)
        for k, t in enumerate(turns):
            out[(f"[c{r['idx']} t0]", k)] = t["content"]
    return out


@pytest.mark.slow
def test_kill_9_mid_conversation_resumes_at_the_next_turn(any_db, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    """`synthwatch run --turns all` SIGKILLed again and again: every assistant turn is written by the model; a
    turn stored before a kill is never asked for again, and every stored turn's answer is unchanged after."""
    url = sim(seed=6, keep_requests=100_000, tokens_per_s=80, reasoning_tokens="10-30", content_tokens="5-10")
    n_conv = 60
    data = write_conversations(tmp_path / "conv.jsonl", n_conv)
    args = ["run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", any_db,
            "--name", "turns-crashy", "--turns", "all", "--concurrency", "6", "--quiet"]
    engine = open_engine(any_db)
    mid_conversation = 0
    stored_before: dict[tuple[str, int], str] = {}
    asked_when_stored: dict[tuple[str, int], int] = {}  # how often a turn had been asked for when first seen stored
    seen = [0]

    def started() -> bool:
        return _requests_seen(url) > seen[0]

    def after_kill() -> None:
        nonlocal stored_before, mid_conversation
        seen[0] = _requests_seen(url)
        run_id = run_row(engine, "turns-crashy")["id"]
        now = _persisted(engine, run_id)
        for key, content in stored_before.items():
            assert now[key] == content, key  # nothing stored is redone or lost
        stored_before = now
        asked_now = Counter(_conv_key(m) for m in _requests(url))
        for key in now:
            asked_when_stored.setdefault(key, asked_now[key])
        with engine.connect() as conn:
            mid_conversation += conn.execute(text(
                "SELECT COUNT(*) FROM record WHERE run_id = :r AND turns_done > 0 AND turns_done < n_turns"),
                {"r": run_id}).scalar_one()

    kills = kill_9_repeatedly(args, rounds=8, wait_s=(0.3, 1.5), seed=int(os.environ.get("SW_KILL_SEED", "18")),
                              env=cli_env(), started=started, after_kill=after_kill)
    final = popen_cli(*args, env=cli_env())
    _out, err = final.communicate(timeout=180)
    assert final.returncode == 0, err
    assert kills >= 3 and mid_conversation >= 1  # killed with conversations half done
    run = run_row(engine, "turns-crashy")
    recs = records(engine, run["id"])
    total = sum(1 + i % 3 for i in range(n_conv))
    assert [r["status"] for r in recs] == ["ok"] * n_conv
    assert run["n_turns"] == run["n_turns_done"] == total
    done = _persisted(engine, run["id"])
    assert len(done) == total
    for key, content in stored_before.items():
        assert done[key] == content, key
    asked = Counter(_conv_key(m) for m in _requests(url))
    assert set(asked) == set(done)
    # a turn stored before a kill is never asked for again
    assert asked_when_stored
    for key, n in asked_when_stored.items():
        assert asked[key] == n, key
    # what a kill loses is at most once per kill: the requests in flight, and last turns answered but not yet
    # written (the writer flushes finished records every flush_interval_ms)
    assert max(asked.values()) <= 1 + kills
    print(f"kills {kills}, conversations half done at a kill {mid_conversation}, turns {total}, requests"
          f" {sum(asked.values())}, turns stored before a kill and never asked again {len(asked_when_stored)}")
    for r in recs:
        for k, turn in enumerate(turns_mod.all_turns(r)):
            assert DATASET_ANSWER not in (turn["content"] or "")
            # stored once, from one successful attempt (a request cut by a kill left no attempt behind)
            assert [a["ok"] for a in turn["attempts"]] == [True], (r["idx"], k)


def test_run_page_counts_turns_and_the_viewer_shows_them(engine, tmp_path, sim, live_app) -> None:  # type: ignore[no-untyped-def]
    import html

    url = sim(seed=8, reasoning_tokens="8-12", content_tokens="4-6")
    data = write_conversations(tmp_path / "conv.jsonl", 6)
    run_id, final = run_to_end(engine, make_config(url, data, turns="all", history_reasoning="keep"))
    assert final == "completed"
    srv = live_app()
    with httpx.Client(base_url=srv.url) as c:
        page = c.get(f"/runs/{run_id}").text
        assert "turns 12 / 12 generated" in page  # 1 + 2 + 3 turns, twice
        assert "history_reasoning = keep" in page
        rec = next(r for r in records(engine, run_id) if r["n_turns"] == 3)
        text_ = html.unescape(c.get(f"/runs/{run_id}/records/{rec['id']}").text)
        assert text_.count('class="turn-item"') == 2  # the two turns before the last
        assert "3 of 3 written by the model" in text_
        for turn in turns_mod.load(rec["turns_json"]):
            assert turn["content"] in text_ and turn["reasoning"] in text_
        assert DATASET_ANSWER not in text_  # the prompt shown is the model's history, not the dataset's


def test_the_start_a_run_form_offers_turns(engine, tmp_path, sim, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=9, reasoning_tokens="8-12", content_tokens="4-6")
    data = write_conversations(tmp_path / "conv.jsonl", 4)
    srv = live_app(launch_dataset_dirs=str(tmp_path))
    form = {"name": "form-turns", "dataset": str(data), "endpoints": url, "model": "sim-reasoner",
            "concurrency": "2", "stream": "on", "reasoning_mode": "auto", "turns": "all", "history_reasoning": "keep"}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert 'name="turns"' in c.get("/runs/new").text
        bad = c.post("/runs/new", data={**form, "turns": "some"}, follow_redirects=False)
        assert bad.status_code == 400 and "turns: expected one of last, all" in bad.text
        r = c.post("/runs/new", data=form, follow_redirects=False)
        assert r.status_code == 303, r.text[-2000:]
        run_id = int(r.headers["location"].rsplit("/", 1)[1])
    wait_for(lambda: run_row(engine, run_id)["status"] == "completed", timeout_s=60, what="form-started run")
    run = run_row(engine, run_id)
    assert run["n_turns"] == run["n_turns_done"] == 1 + 2 + 3 + 1
    cfg = orjson.loads(run["config_json"])
    assert (cfg["turns"], cfg["history_reasoning"]) == ("all", "keep")
