"""Logprobs for distillation (#38 item 5): asked for as the OpenAI chat API and vLLM take them, served by the
simulator in vLLM's shape (streamed and not), captured into the packed ``logprobs_json`` column, and exported in
the tokens format aligned to the completion ids, one logprob (and top-k) per completion token."""

from __future__ import annotations

import math
from typing import Any

import httpx
import orjson
import pytest
from pydantic import ValidationError
from test_export import read_jsonl
from workerkit import make_config, records, run_to_end

from synthwatch.config import RunConfig
from synthwatch.export.plan import ExportOptions
from synthwatch.export.stream import export_run

MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]


def _post(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json={"model": "sim-reasoner", "messages": MESSAGES, **body},
                      timeout=30)


def _stream_chunks(url: str, **body: Any) -> list[dict[str, Any]]:
    r = _post(url, stream=True, **body)
    assert r.status_code == 200, r.text
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(orjson.loads(line[6:]))
    return out


def _check_entry(e: dict[str, Any], k: int) -> None:
    assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
    assert isinstance(e["token"], str) and -9999.0 <= e["logprob"] <= 0.0
    assert e["bytes"] == list(e["token"].encode("utf-8", errors="replace"))
    assert len(e["top_logprobs"]) <= k
    for t in e["top_logprobs"]:
        assert set(t) == {"token", "logprob", "bytes"} and t["bytes"] == list(t["token"].encode())
    if k:  # vLLM returns the sampled token first, then the most likely others
        assert e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == e["logprob"]
        lps = [t["logprob"] for t in e["top_logprobs"][1:]]
        assert lps == sorted(lps, reverse=True)


def test_the_simulator_sends_logprobs_as_vllm_does(sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=5, reasoning_field="reasoning", reasoning_tokens="20-30", content_tokens="5-10")
    body = {"logprobs": True, "top_logprobs": 3, "return_token_ids": True, "seed": 1}
    whole = _post(url, **body).json()
    choice = whole["choices"][0]
    content = choice["logprobs"]["content"]
    # one entry per generated token, the reasoning's included, in the completion ids' order
    assert len(content) == len(choice["token_ids"]) == whole["usage"]["completion_tokens"]
    assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 20
    for e in content:
        _check_entry(e, 3)
    assert "".join(e["token"] for e in content).startswith(choice["message"]["reasoning"][:20])
    # streamed: each chunk carries its own tokens' entries; together they are the whole reply's
    chunks = _stream_chunks(url, **body)
    streamed, ids = [], []
    for c in chunks:
        for ch in c["choices"]:
            assert len((ch["logprobs"] or {"content": []})["content"]) == len(ch.get("token_ids") or [])
            streamed += (ch["logprobs"] or {"content": []})["content"]
            ids += ch.get("token_ids") or []
    assert streamed == content and ids == choice["token_ids"]
    # token_id:N with return_tokens_as_token_ids, as vLLM names tokens then
    named = _post(url, **body, return_tokens_as_token_ids=True).json()["choices"][0]
    assert [e["token"] for e in named["logprobs"]["content"]] == [f"token_id:{i}" for i in named["token_ids"]]
    # without logprobs: null, as vLLM sends it
    assert _post(url, seed=1).json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(("body", "message"), [
    ({"top_logprobs": 2}, "`logprobs` must be set to true"),
    ({"logprobs": True, "top_logprobs": 21}, "greater than max allowed: 20"),
    ({"logprobs": True, "top_logprobs": -1}, "must be a positive value"),
])
def test_the_simulator_refuses_what_vllm_refuses(sim, body: dict[str, Any], message: str) -> None:  # type: ignore[no-untyped-def]
    r = _post(sim(seed=5), **body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_the_settings_make_the_request() -> None:
    def cfg(**sampling: Any) -> RunConfig:
        return RunConfig.model_validate({"dataset": {"path": "x.jsonl"}, "endpoints": [{"base_url": "http://h/v1"}],
                                         "model": "m", "sampling": sampling, "request_token_ids": True})

    body = cfg(logprobs=True, top_logprobs=5).request_body_base()
    assert body["logprobs"] is True and body["top_logprobs"] == 5 and body["return_tokens_as_token_ids"] is True
    assert "logprobs" not in cfg().request_body_base()
    with pytest.raises(ValidationError, match="top_logprobs needs logprobs"):
        cfg(top_logprobs=2)
    with pytest.raises(ValidationError):
        cfg(logprobs=True, top_logprobs=21)


def _direct(url: str, cfg: RunConfig, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The logprobs the server sends for the record's own request, not streamed."""
    body = {**cfg.request_body_base(), "messages": orjson.loads(rec["prompt_json"]), "stream": False}
    body.pop("stream_options", None)
    r = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
    return r.json()["choices"][0]["logprobs"]["content"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_logprobs_are_exported_aligned_to_the_completion_ids(engine, sim, prompts, tmp_path, stream: bool) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=7, reasoning_field="reasoning", reasoning_tokens="15-30", content_tokens="5-15")
    cfg = make_config(url, prompts(6), name=f"lp-{stream}", concurrency=3, stream=stream, request_token_ids=True,
                      sampling={"logprobs": True, "top_logprobs": 4})
    run_id, final = run_to_end(engine, cfg)
    assert final == "completed"
    recs = {r["source_id"]: r for r in records(engine, run_id)}
    out = tmp_path / "tokens.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    rows = read_jsonl(out)
    assert len(rows) == 6 and manifest["tokens"]["sources"] == {"server": 6}
    for row in rows:
        n = row["prompt_len"]
        completion = row["input_ids"][n:]
        lps, tops, top_lps = row["completion_logprobs"], row["completion_top_ids"], row["completion_top_logprobs"]
        # one logprob and one top-k list per completion token ...
        assert len(lps) == len(tops) == len(top_lps) == len(completion) > 20
        rec = recs[row["id"]]
        sent = _direct(url, cfg, rec)
        assert len(sent) == len(completion)
        for i, tid in enumerate(completion):
            # ... each on its own token: the sampled token heads its alternatives (vLLM's order)
            assert tops[i][0] == tid, (i, tops[i], tid)
            assert sent[i]["token"] == f"token_id:{tid}"
            # float16: three significant digits of what the server sent
            assert math.isclose(lps[i], sent[i]["logprob"], rel_tol=1e-3, abs_tol=1e-3)
            assert lps[i] == top_lps[i][0]
            assert tops[i] == [int(t["token"][9:]) for t in sent[i]["top_logprobs"]]
        # the reasoning's tokens have theirs too: the first completion token is reasoning
        assert lps[0] is not None and rec["reasoning"]
    # Parquet holds the same rows (float16 values are exact in float32)
    import pyarrow.parquet as pq

    pout = tmp_path / "tokens.parquet"
    export_run(engine, run_id, ExportOptions(format="tokens", out=pout))
    assert pq.read_table(pout).to_pylist() == rows


def test_text_tokens_are_mapped_with_the_runs_tokenizer(engine, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.capture.logprobs import unpack

    # a server that names tokens only by their text (no token ids asked for): the export maps them to ids with the
    # run's tokenizer and puts each logprob on its token; the </think> token, never streamed without ids, is null
    url = sim(seed=9, token_ids="deepseek", reasoning_field="reasoning", reasoning_tokens="10-20",
              content_tokens="5-10")
    cfg = make_config(url, prompts(3), name="lp-text", concurrency=3, sampling={"logprobs": True, "top_logprobs": 2},
                      tokenizer={"name_or_path": "deepseek-v4"})
    run_id, final = run_to_end(engine, cfg, timeout_s=120)
    assert final == "completed"
    for r in records(engine, run_id):
        packed = unpack(r["logprobs_json"])
        assert packed is not None and packed.text and all(t < 0 for t in packed.ids)
    out = tmp_path / "tokens.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    assert manifest["tokens"]["sources"] == {"retokenized": 3}
    for row in read_jsonl(out):
        completion = row["input_ids"][row["prompt_len"]:]
        lps, tops = row["completion_logprobs"], row["completion_top_ids"]
        assert len(lps) == len(completion)
        placed = [i for i, v in enumerate(lps) if v is not None]
        assert len(placed) >= 0.8 * len(completion)
        assert all(tops[i][0] == completion[i] for i in placed)


def test_pack_round_trip_and_bound() -> None:
    from synthwatch.capture.logprobs import NO_ID, pack, unpack

    content = [{"token": f"token_id:{100 + i}", "logprob": -0.5 * i, "bytes": [],
                "top_logprobs": [{"token": f"token_id:{100 + i}", "logprob": -0.5 * i},
                                 {"token": "x", "logprob": -9999.0}]} for i in range(50)]
    col, problems = pack({"content": content}, [100 + i for i in range(50)], 1 << 20)
    assert problems == [] and col is not None
    p = unpack(col)
    assert p is not None and p.ids == [100 + i for i in range(50)] and p.k == 2
    assert p.lp[3] == -1.5 and p.top_ids[0][1] < 0 and p.token_text(p.top_ids[0][1]) == "x"
    assert p.top_lp[0][1] == -10000.0  # vLLM's floor, -9999, is float16's -10000 (its nearest)
    small, problems = pack({"content": content}, None, 600)
    assert small is not None and len(small) <= 600 and "exceed limits.max_logprobs_bytes" in problems[0]
    kept = unpack(small)
    assert kept is not None and kept.dropped == 50 - len(kept.ids) > 0
    # mismatched lengths: flagged, kept by text
    col, problems = pack({"content": content[:10]}, [1, 2, 3], 1 << 20)
    assert col is not None and any("not aligned" in p for p in problems)
    # NaN and wrong types: no logprob there, flagged
    col, problems = pack({"content": [{"token": "a", "logprob": float("nan")}, {"token": 5, "logprob": "x"}, 7]},
                         None, 1 << 20)
    p = unpack(col)
    assert p is not None and math.isnan(p.lp[0]) and p.ids[1] == NO_ID and p.ids[2] == NO_ID and len(problems) >= 3


def test_stored_on_both_backends_and_kept_in_history_by_a_rerun(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    # the column on SQLite and PostgreSQL; a re-run empties it with the rest of the output, and the record's history
    # keeps the replaced output's logprobs whole (no destroyed data)
    from workerkit import Background

    from synthwatch.capture.logprobs import unpack
    from synthwatch.repair import actions as repair
    from synthwatch.repair import history as repair_history
    from synthwatch.store import versions

    url = sim(seed=13, reasoning_field="reasoning", reasoning_tokens="10-20", content_tokens="5-10")
    cfg = make_config(url, prompts(3), name="lp-backends", concurrency=3, request_token_ids=True,
                      sampling={"logprobs": True, "top_logprobs": 2})
    run_id, final = run_to_end(any_engine, cfg)
    assert final == "completed"
    before = {r["id"]: r for r in records(any_engine, run_id)}
    for r in before.values():
        packed = unpack(r["logprobs_json"])
        assert packed is not None and packed.ids == orjson.loads(r["token_ids_json"])["completion"]
    rid = min(before)
    versions.change_settings(any_engine, run_id, {"sampling.top_logprobs": 5}, actor="tester")
    with any_engine.connect() as conn:
        sel = repair.select(conn, run_id, ids=[rid])
    assert repair.rerun_records(any_engine, run_id, sel, actor="tester")["queued"] == 1
    assert Background(any_engine, cfg.model_copy(update={"sampling": cfg.sampling.model_copy(
        update={"top_logprobs": 5})}), run_id).start().join(60) == "completed"
    again = {r["id"]: r for r in records(any_engine, run_id)}[rid]
    new = unpack(again["logprobs_json"])
    assert new is not None and new.k == 5
    with any_engine.connect() as conn:
        [h] = repair_history.history(conn, rid)
    assert h["logprobs_json"] == before[rid]["logprobs_json"] and unpack(h["logprobs_json"]).k == 2  # type: ignore[union-attr]


def test_every_turn_of_a_conversation_keeps_its_own_logprobs(engine, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # turns = all: each turn's reply is stored with its logprobs, and --turns all exports each turn's row aligned
    from test_turns import write_conversations

    url = sim(seed=7, reasoning_tokens="8-16", content_tokens="4-8")
    data = write_conversations(tmp_path / "conv.jsonl", 4)
    cfg = make_config(url, data, name="lp-turns", turns="all", request_token_ids=True,
                      sampling={"logprobs": True, "top_logprobs": 2})
    run_id, final = run_to_end(engine, cfg)
    assert final == "completed"
    out = tmp_path / "turns.jsonl"
    export_run(engine, run_id, ExportOptions(format="tokens", out=out, turns="all"))
    rows = read_jsonl(out)
    assert len(rows) > 4  # several turns per conversation
    for row in rows:
        completion = row["input_ids"][row["prompt_len"]:]
        assert len(row["completion_logprobs"]) == len(completion) > 0
        assert [t[0] for t in row["completion_top_ids"]] == completion
