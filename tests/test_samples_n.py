"""k samples in one request (#38 item 4): ``samples_in_one_request`` asks for a prompt's samples with n = k.

Real simulator (its n mirrors vLLM's: choices interleaved by index, usage summed, one prefill), a real SQLite file,
the real worker. An n = k run's records are compared with a run of k single-sample requests over the same
prompts: choice i of the simulator is what seed + i gets, so every field of every record must agree."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S, write_prompts
from sqlalchemy import text
from test_samples_select import judge_all
from workerkit import make_config, records, run_row, run_to_end

from synthwatch.quality import passk

FIELDS = ("prompt_idx", "sample_index", "idx", "status", "finish_reason", "reasoning", "content", "token_ids_json",
          "completion_tokens", "prompt_tokens", "reasoning_len", "content_len")


def sim_stats(url: str) -> dict[str, Any]:
    return httpx.get(url.removesuffix("/v1") + "/sim/stats", timeout=HTTP_TIMEOUT_S).json()


def rows(engine: Any, run_id: int) -> list[tuple[Any, ...]]:
    return [tuple(r[f] for f in FIELDS) for r in records(engine, run_id)]


def pass_k(engine: Any, run_id: int, k: int) -> dict[str, Any]:
    recs = records(engine, run_id)
    judge_all(engine, run_id, recs, "verify:exact")
    with engine.connect() as conn:
        return passk.pass_at_k(conn, run_id, "verify:exact", k)


@pytest.mark.parametrize("stream", [True, False])
def test_an_n_equals_k_run_gives_the_records_of_k_single_sample_requests(engine, tmp_path, sim, stream) -> None:  # type: ignore[no-untyped-def]
    single = sim(seed=9, rate_wrong_answer=0.4, reasoning_tokens="6-30", content_tokens="4-12")
    multi = sim(seed=9, rate_wrong_answer=0.4, reasoning_tokens="6-30", content_tokens="4-12")
    data = write_prompts(tmp_path / "p.jsonl", 8)
    k = 3
    common = {"samples_per_prompt": k, "request_token_ids": True, "stream": stream, "sampling": {"seed": 50,
              "max_tokens": 24}}
    a_id, a_final = run_to_end(engine, make_config(single, data, name="singles", **common))
    b_id, b_final = run_to_end(engine, make_config(multi, data, name="in-one", samples_in_one_request=True,
                                                   **common))
    assert a_final == b_final == "completed"
    a, b = rows(engine, a_id), rows(engine, b_id)
    assert len(a) == len(b) == 8 * k
    assert b == a  # every field of every record, sample by sample
    assert all(r[3] == "ok" and r[7] is not None for r in b)  # token ids on every choice's record
    assert {r[4] for r in b} >= {"length"} and {r[4] for r in b} >= {"stop"}  # finish reasons per choice
    assert run_row(engine, b_id)["n_ok"] == 8 * k
    # one request per prompt, n = k, one prefill each; the single run made k of each
    sa, sb = sim_stats(single), sim_stats(multi)
    assert sb["n_asked"] == {str(k): 8} and sb["prefills"] == 8 and sb["chat_requests"] == 8
    assert sa["n_asked"] == {"1": 8 * k} and sa["prefills"] == 8 * k
    assert sb["prefill_tokens"] * k == sa["prefill_tokens"]
    # the request's usage (summed over the choices, the prompt once) is kept on each record
    for r in records(engine, b_id)[:k]:
        top = orjson.loads(r["extra_json"])["top"]
        assert top["n"] == k and top["choice_index"] == r["sample_index"]
    pa, pb = pass_k(engine, a_id, k), pass_k(engine, b_id, k)
    assert pb == pa and 0 < pb["pass_at_1"] < 1


def test_resume_mid_prompt_asks_only_for_the_missing_samples(any_engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    engine = any_engine  # SQLite and PostgreSQL: the claim of a prompt's remaining samples
    ref_url = sim(seed=3, reasoning_tokens="5-20", content_tokens="3-8")
    url = sim(seed=3, reasoning_tokens="5-20", content_tokens="3-8")
    data = write_prompts(tmp_path / "p.jsonl", 5)
    common = {"samples_per_prompt": 4, "request_token_ids": True, "sampling": {"seed": 7}}
    ref_id, _ = run_to_end(engine, make_config(ref_url, data, name="ref", **common))
    # first: a cap of 2 with a concurrency of 1 ends with two of prompt 0's four samples done (the cap holds)
    cfg = make_config(url, data, name="resumed", samples_in_one_request=True, concurrency=1, cap=2, **common)
    run_id, final = run_to_end(engine, cfg)
    assert final == "completed"
    done = records(engine, run_id, "status = 'ok'")
    assert [(r["prompt_idx"], r["sample_index"]) for r in done] == [(0, 0), (0, 1)]
    assert sim_stats(url)["n_asked"] == {"2": 1}
    # resumed without the cap: prompt 0 asks for its 2 missing samples, the others for 4
    cfg2 = make_config(url, data, name="resumed", samples_in_one_request=True, **common)
    _, final = run_to_end(engine, cfg2, run_id=run_id)
    assert final == "completed"
    assert sim_stats(url)["n_asked"] == {"2": 2, "4": 4}
    assert rows(engine, run_id) == rows(engine, ref_id)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND status = 'ok'"),
                            {"r": run_id}).scalar() == 20


@pytest.mark.parametrize("stream", [True, False])
def test_a_server_that_ignores_n_loses_no_sample(engine, tmp_path, sim, caplog, stream) -> None:  # type: ignore[no-untyped-def]
    ref_url = sim(seed=5, reasoning_tokens="5-20", content_tokens="3-8")
    url = sim(seed=5, reasoning_tokens="5-20", content_tokens="3-8", ignore_n=True)
    data = write_prompts(tmp_path / "p.jsonl", 4)
    common = {"samples_per_prompt": 3, "request_token_ids": True, "stream": stream}
    ref_id, _ = run_to_end(engine, make_config(ref_url, data, name="ref", **common))
    with caplog.at_level(logging.WARNING, logger="synthwatch.worker"):
        run_id, final = run_to_end(engine, make_config(url, data, name="ignored", samples_in_one_request=True,
                                                       **common))
    assert final == "completed"
    assert rows(engine, run_id) == rows(engine, ref_id)
    st = sim_stats(url)
    assert st["n_asked"] == {"3": 4, "1": 8}  # one n = 3 request per prompt answered once, two single requests
    lines = [r.getMessage() for r in caplog.records if "does not support n" in r.getMessage()]
    assert len(lines) == 4 and "answered 1 of the 3 choices" in lines[0]


def test_a_failed_request_is_an_error_on_each_of_its_records(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=1, rate_500=1.0)
    data = write_prompts(tmp_path / "p.jsonl", 3)
    cfg = make_config(url, data, samples_per_prompt=4, samples_in_one_request=True,
                      retries={"max_attempts": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.02})
    run_id, final = run_to_end(engine, cfg)
    recs = records(engine, run_id)
    assert len(recs) == 12 and {r["status"] for r in recs} == {"error"}
    for r in recs:
        assert r["error_kind"] == "http_5xx"
        assert [a["kind"] for a in orjson.loads(r["attempts_json"])] == ["http_5xx", "http_5xx"]
    assert sim_stats(url)["n_asked"] == {"4": 6}  # 3 prompts, 2 attempts each: no record was asked alone


def test_kill_9_during_n_requests_then_resume_exact_records(tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    """`synthwatch run --samples-per-prompt 4 --samples-in-one-request` SIGKILLed again and again, then run to the
    end: every (prompt, sample) is one ok record, none twice, none lost, each what a single request would give."""
    import os

    from conftest import cli_env, kill_9_repeatedly, popen_cli

    from synthwatch.store.db import open_engine

    ref_url = sim(seed=9, reasoning_tokens="10-30", content_tokens="5-10")
    url = sim(seed=9, tokens_per_s=80, reasoning_tokens="10-30", content_tokens="5-10")
    n_prompts, k = 30, 4
    data = write_prompts(tmp_path / "p.jsonl", n_prompts)
    db = str(tmp_path / "kill.db")
    args = ["run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", db,
            "--name", "n-crashy", "--samples-per-prompt", str(k), "--samples-in-one-request", "--concurrency", "4",
            "--request-token-ids", "--quiet"]
    engine = open_engine(db)
    seen = [0]

    def started() -> bool:
        return int(sim_stats(url)["chat_requests"]) > seen[0]

    def after_kill() -> None:
        seen[0] = int(sim_stats(url)["chat_requests"])

    kills = kill_9_repeatedly(args, rounds=4, wait_s=(0.3, 1.0), seed=int(os.environ.get("SW_KILL_SEED", "38")),
                              env=cli_env(), started=started, after_kill=after_kill)
    final = popen_cli(*args, env=cli_env())
    _out, err = final.communicate(timeout=180)
    assert final.returncode == 0, err
    assert kills >= 2
    run = run_row(engine, "n-crashy")
    assert run["total"] == run["n_ok"] == n_prompts * k
    assert run["n_pending"] == run["n_in_flight"] == run["n_error"] == 0
    ref_id, _ = run_to_end(engine, make_config(ref_url, data, name="ref", samples_per_prompt=k,
                                               request_token_ids=True))
    assert rows(engine, run["id"]) == rows(engine, ref_id)
    assert set(sim_stats(url)["n_asked"]) <= {str(j) for j in range(1, k + 1)} and str(k) in sim_stats(url)["n_asked"]


def test_a_claim_takes_the_rest_of_its_last_prompt_never_past_the_cap(any_engine) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import dataclass

    from synthwatch.config import RunConfig
    from synthwatch.store import queue as store

    @dataclass
    class P:
        index: int
        line: int
        source_id: str
        messages: list[dict[str, str]]

    cfg = RunConfig.model_validate({"dataset": {"path": "x"}, "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
                                    "model": "m", "samples_per_prompt": 4, "samples_in_one_request": True})
    with any_engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "claims", cfg)
        store.insert_prompts(conn, rid, (P(i, i + 1, f"p{i}", [{"role": "user", "content": "q"}]) for i in range(5)),
                             samples=4)
        conn.execute(text("UPDATE run SET desired = 'run' WHERE id = :r"), {"r": rid})
        wid = store.register_worker(conn, rid)

    def claim(n: int, cap: int | None = None, whole: bool = True) -> list[tuple[int, int]]:
        with any_engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("UPDATE run SET cap = :c WHERE id = :r"), {"c": cap, "r": rid})
            got, _why = store.claim(conn, rid, wid, n, 30.0, whole_prompts=whole)
        return [(c.prompt_idx, c.sample_index) for c in got]

    assert claim(3) == [(0, 0), (0, 1), (0, 2), (0, 3)]  # the rest of prompt 0 came with it
    assert claim(1) == [(1, s) for s in range(4)]
    assert claim(1, whole=False) == [(2, 0)]  # without the setting: what was asked
    assert claim(1) == [(2, 1), (2, 2), (2, 3)]  # a prompt split earlier: its remaining samples
    assert claim(1, cap=14) == [(3, 0), (3, 1)]  # 12 in flight, a cap of 14: never past it
    with any_engine.connect() as conn:
        assert store.run_row(conn, rid)["n_in_flight"] == 14


@pytest.mark.parametrize("stream", [True, False])
def test_each_choice_keeps_its_own_logprobs(engine, tmp_path, sim, stream) -> None:  # type: ignore[no-untyped-def]
    """n = k with logprobs (#38 items 4 and 5 together): each choice's record packs its own choice's logprobs, equal
    to what the same sample got alone, never choice 0's copied to all (nor none)."""
    single = sim(seed=5, reasoning_tokens="6-20", content_tokens="4-10")
    multi = sim(seed=5, reasoning_tokens="6-20", content_tokens="4-10")
    data = write_prompts(tmp_path / "p.jsonl", 4)
    common = {"samples_per_prompt": 3, "request_token_ids": True, "stream": stream,
              "sampling": {"seed": 11, "max_tokens": 20, "logprobs": True, "top_logprobs": 2}}
    a_id, _ = run_to_end(engine, make_config(single, data, name="lp-singles", **common))
    b_id, _ = run_to_end(engine, make_config(multi, data, name="lp-in-one", samples_in_one_request=True, **common))
    key = ("prompt_idx", "sample_index", "logprobs_json")
    a = [tuple(r[f] for f in key) for r in records(engine, a_id)]
    b = [tuple(r[f] for f in key) for r in records(engine, b_id)]
    assert len(b) == 12 and all(r[2] for r in b), b[:3]
    assert b == a
    assert len({r[2] for r in b if r[0] == 0}) == 3  # the three samples of a prompt differ
