"""Tool calls end to end: dataset with tools -> simulator (vLLM's shape) -> worker -> viewer -> both presets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from test_export import read_jsonl
from test_export_trainers import pretokenized_row_error
from workerkit import make_config, records, run_to_end

from synthwatch.capture import tool_calls
from synthwatch.config import DatasetConfig
from synthwatch.export.plan import ExportOptions
from synthwatch.export.presets import specforge_reader_error, specforge_row_error
from synthwatch.export.stream import export_run
from synthwatch.sources.datasets import load_dataset

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}

ROWS: list[dict[str, Any]] = [
    # the model should call the tool
    {"id": "ask", "messages": [{"role": "user", "content": "What is the weather in Paris now?"}], "tools": [WEATHER]},
    # the dataset's own call and its result: the model answers the result
    {"id": "answer", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call-1", "name": "get_weather", "content": '{"temp_c": -3}'}]},
    # no tools at all
    {"id": "plain", "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
]
BAD_ROWS: list[tuple[dict[str, Any], str]] = [
    ({"id": "b1", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                                  "tool_calls": "call"}, {"role": "user", "content": "y"}]},
     "tool_calls must be a non-empty array"),
    ({"id": "b2", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools must be an array"),
    ({"id": "b3", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}]},
     "last turn is 'tool', not 'user'"),
]


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_datasets_accept_tools_tool_calls_and_tool_turns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path / "d.jsonl", ROWS + [r for r, _ in BAD_ROWS])
    result = load_dataset(DatasetConfig(path=str(path), on_bad_line="skip"))
    by_id = {p.source_id: p.messages for p in result.prompts}
    assert set(by_id) == {"ask", "answer", "plain"}
    assert by_id["ask"] == {"messages": ROWS[0]["messages"], "tools": [WEATHER]}
    answer = by_id["answer"]
    assert isinstance(answer, dict) and answer["tools"] == [WEATHER]
    assert answer["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert answer["messages"][2] == ROWS[1]["messages"][2]
    assert by_id["plain"] == ROWS[2]["messages"]
    reasons = [b.reason for b in result.bad_lines]
    for (_, why), reason in zip(BAD_ROWS, reasons, strict=True):
        assert why in reason, reason


@pytest.fixture(params=[True, False], ids=["streamed", "not-streamed"])
def tool_run(engine, sim, tmp_path, request) -> int:  # type: ignore[no-untyped-def]
    url = sim(token_ids="deepseek", reasoning_field="reasoning", seed=11)
    config = make_config(url, write(tmp_path / "tools.jsonl", ROWS), request_token_ids=True, stream=request.param,
                         tokenizer={"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"})
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    return run_id  # type: ignore[no-any-return]


def test_a_tool_calling_run_end_to_end(engine, tool_run, live_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    recs = {r["source_id"]: r for r in records(engine, tool_run)}
    assert {k: r["status"] for k, r in recs.items()} == {"ask": "ok", "answer": "ok", "plain": "ok"}
    # The worker sent the tools (the simulator called the first one) and merged the streamed deltas.
    ask = recs["ask"]
    assert ask["finish_reason"] == "tool_calls" and ask["content"] == "" and ask["reasoning"]
    (call,) = tool_calls.from_extra_json(ask["extra_json"])
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["id"].startswith("chatcmpl-tool-")
    assert recs["answer"]["finish_reason"] == "stop" and recs["answer"]["content"]
    assert not tool_calls.from_extra_json(recs["answer"]["extra_json"])

    # The viewer shows the tools, the dataset's call and the answer's call, arguments pretty-printed.
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        page = client.get(f"/runs/{tool_run}/records/{ask['id']}").text
        assert "data-tool-calls" in page and "&#34;city&#34;: &#34;Paris&#34;" in page
        assert "chatcmpl-tool-" in page and '<div class="role">tools</div>' in page
        page = client.get(f"/runs/{tool_run}/records/{recs['answer']['id']}").text
        assert "data-tool-calls" not in page and '<div class="role">tool calls</div>' in page
        assert '<div class="role">tool get_weather</div>' in page and "&#34;temp_c&#34;: -3" in page

    # SpecForge: the call on the answer, the tools as JSON text, the conversations as its reader takes them.
    out = tmp_path / "sf.jsonl"
    manifest = export_run(engine, tool_run, ExportOptions(format="specforge", out=out))
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert set(rows) == {"ask", "answer", "plain"} and manifest["counts"]["excluded"] == {}
    answer = rows["ask"]["conversations"][-1]
    assert answer["tool_calls"] == [call] and answer["content"] == "" and answer["reasoning_content"]
    assert orjson.loads(rows["ask"]["tools"]) == [WEATHER]
    assert [t["role"] for t in rows["answer"]["conversations"]] == ["user", "assistant", "tool", "assistant"]
    assert rows["answer"]["conversations"][1]["tool_calls"] == [CALL]
    assert rows["answer"]["conversations"][2]["tool_call_id"] == "call-1"
    for row in rows.values():
        assert specforge_reader_error(row["conversations"]) is None
    assert specforge_row_error(rows["plain"]) is None and "tools" not in rows["plain"]

    # speculators: the server's ids, the call among the trained tokens.
    out = tmp_path / "spec.jsonl"
    export_run(engine, tool_run, ExportOptions(format="speculators", out=out))
    rows = {r["primary_id"]: r for r in read_jsonl(out)}
    assert rows["ask"]["metadata"]["is_tool_call"] is True and rows["plain"]["metadata"]["is_tool_call"] is False
    assert rows["ask"]["metadata"]["finish_reason"] == "tool_calls"
    assert all(pretokenized_row_error(r) is None for r in rows.values())
    ids, mask = rows["ask"]["input_ids"], rows["ask"]["loss_mask"]
    n = mask.index(1)
    from synthwatch.simulator.token_plan import deepseek_tokenizer

    assert '{"city": "Paris"}' in deepseek_tokenizer().decode(ids[n:])

    # Re-tokenized, a tool-call answer cannot be rebuilt from its text: left out and counted.
    manifest = export_run(engine, tool_run, ExportOptions(format="tokens", out=tmp_path / "t.jsonl", retokenize=True))
    assert manifest["counts"]["excluded"] == {"tool_call_without_server_ids": 1}
    assert manifest["counts"]["exported"] == 2


def test_the_viewer_escapes_tool_call_arguments_and_names_bad_ones(engine, live_app) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text
    from test_export import make_run

    from synthwatch.store import queue as store

    run_id = make_run(engine, [{"prompt_json": {"messages": [{"role": "user", "content": "q"}], "tools": [WEATHER]}}, {}])
    hostile = {"message": {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "<img src=x onerror=alert(1)>",
                                                       "arguments": '{"q": "<script>alert(1)</script>"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}}
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE record SET extra_json = :x WHERE run_id = :r AND idx = 0"),
                     {"x": orjson.dumps(hostile).decode(), "r": run_id})
        rid = conn.execute(text("SELECT id FROM record WHERE run_id = :r AND idx = 0"), {"r": run_id}).scalar_one()
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        page = client.get(f"/runs/{run_id}/records/{rid}").text
    assert "<script>alert(1)</script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # parsed, indented, escaped
    assert "tool call 1 (get_weather): arguments are not valid JSON" in page
    assert "tool call 0 names an unknown tool &#39;&lt;img src=x onerror=alert(1)&gt;&#39;" in page
