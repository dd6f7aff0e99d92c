"""The vLLM-shaped simulator, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from conftest import run_async

from synthwatch.simulator.answers import solve_arithmetic
from synthwatch.simulator.config import REASONING_FIELDS, SimConfig
from synthwatch.simulator.launch import add_arguments, config_from_args, running_in_thread

BASE: dict[str, Any] = {
    "reasoning_field": "reasoning",
    "reasoning_tokens": "24",
    "content_tokens": "16",
    "tokens_per_s": 0.0,
    "ttft_ms": 0.0,
    "stall_s": 5.0,
    "seed": 0,
    "token_ids": "words",
    **{name: 0.0 for name in SimConfig.fault_rates()},
}
QUESTION = "A farmer plants 12 rows of 7 trees. How many trees are there?"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with running_in_thread(SimConfig(**BASE)) as url:
        yield url


@pytest.fixture(scope="module")
def shared_client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        yield c


@pytest.fixture()
def client(shared_client: httpx.Client) -> httpx.Client:
    """The module's client, with the simulator reset to the base config."""
    configure(shared_client)
    return shared_client


def root(c: httpx.Client) -> str:
    return str(c.base_url).rstrip("/").removesuffix("/v1")


def configure(c: httpx.Client, **changes: Any) -> dict[str, Any]:
    r = c.patch(root(c) + "/sim/config", json={**BASE, **changes})
    assert r.status_code == 200, r.text
    return r.json()


def body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-reasoner", "messages": [{"role": "user", "content": content}], **extra}


def complete(c: httpx.Client, content: str = QUESTION, **extra: Any) -> dict[str, Any]:
    r = c.post("/chat/completions", json=body(content, **extra))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.json()


def stream_events(c: httpx.Client, content: str = QUESTION, **extra: Any) -> list[str]:
    """The data payloads of a stream, as text, in order (including ``[DONE]``)."""
    with c.stream("POST", "/chat/completions", json=body(content, stream=True, **extra)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def stream_chunks(c: httpx.Client, content: str = QUESTION, **extra: Any) -> list[dict[str, Any]]:
    events = stream_events(c, content, **extra)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def joined(chunks: list[dict[str, Any]], key: str) -> str:
    return "".join(ch["choices"][0]["delta"].get(key) or "" for ch in chunks if ch["choices"])


# ---------------------------------------------------------------------------- endpoints


def test_models_and_health(client: httpx.Client) -> None:
    data = client.get("/models").json()
    assert data["object"] == "list"
    card = data["data"][0]
    assert card["id"] == "sim-reasoner" and card["object"] == "model" and card["owned_by"] == "synthwatch-sim"
    assert isinstance(card["max_model_len"], int) and isinstance(card["created"], int)
    assert client.get(root(client) + "/health").status_code == 200


def test_unknown_model_bad_json_and_bad_fields(client: httpx.Client) -> None:
    r = client.post("/chat/completions", json={**body("hi"), "model": "gpt-nope"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model `gpt-nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    r = client.post(
        "/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    assert client.post("/chat/completions", json={"model": "sim-reasoner"}).status_code == 400
    assert client.post("/chat/completions", json=body("hi", max_tokens=0)).status_code == 400
    assert client.get("/chat/completions").status_code == 405
    assert client.get("/nope").status_code == 404


def test_keep_alive_pipelining_and_body_cap(base_url: str) -> None:
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    payload = json.dumps(body("What is 1 + 1?")).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request * 3)  # three pipelined requests on one connection
        data = b""
        while data.count(b"HTTP/1.1 200 OK") < 3 or not data.endswith(b"}"):
            data += sock.recv(65536)
        assert data.count(b"**2**") == 3
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 17000000\r\n\r\n")
        reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 413 ")


def test_http10_stream_ends_at_close(base_url: str) -> None:
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    payload = json.dumps(body("What is 1 + 1?", stream=True)).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, stream = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
    assert stream.startswith(b"data: {") and stream.endswith(b"data: [DONE]\n\n")


def test_stop_with_streams_in_flight() -> None:
    with running_in_thread(SimConfig(tokens_per_s=5)) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        payload = json.dumps(body("hi", stream=True)).encode()
        request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (
            len(payload),
            payload,
        )
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        for sock in socks:
            sock.sendall(request)
        for sock in socks:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
    for sock in socks:  # the server closed them on stop
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        sock.close()


# ---------------------------------------------------------------------------- reasoning fields


@pytest.mark.parametrize("mode", REASONING_FIELDS)
def test_non_streamed_shape_per_mode(client: httpx.Client, mode: str) -> None:
    configure(client)
    plain = complete(client)["choices"][0]["message"]
    configure(client, reasoning_field=mode)
    data = complete(client)
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    assert data["system_fingerprint"] == "vllm-0.32.0-sim"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    message = choice["message"]
    assert message["role"] == "assistant" and message["tool_calls"] == []
    r_text, c_text = plain["reasoning"], plain["content"]
    assert r_text and c_text and "**84**" in c_text
    keys = {k for k in ("reasoning", "reasoning_content") if k in message}
    usage = data["usage"]
    if mode == "reasoning":
        assert keys == {"reasoning"} and message["reasoning"] == r_text
    elif mode == "reasoning_content":
        assert keys == {"reasoning_content"} and message["reasoning_content"] == r_text
    elif mode == "both":
        assert keys == {"reasoning", "reasoning_content"}
        assert message["reasoning"] == message["reasoning_content"] == r_text
    else:
        assert keys == {"reasoning"} and message["reasoning"] is None
    if mode in ("reasoning", "reasoning_content", "both"):
        assert message["content"] == c_text
        assert usage["completion_tokens_details"] == {"reasoning_tokens": 24}
        assert usage["completion_tokens"] == 24 + 1 + 16  # the </think> token counts too
    elif mode == "inline":
        assert message["content"] == f"<think>{r_text}</think>{c_text}"
    elif mode == "inline-no-open":
        assert message["content"] == f"{r_text}</think>{c_text}"
    else:
        assert message["content"] == c_text and "think" not in message["content"]
        assert usage["completion_tokens"] == 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("mode", REASONING_FIELDS)
def test_streamed_shape_per_mode(client: httpx.Client, mode: str) -> None:
    configure(client, reasoning_field=mode)
    message = complete(client)["choices"][0]["message"]
    chunks = stream_chunks(client, stream_options={"include_usage": True})
    first, usage_chunk, last = chunks[0], chunks[-1], chunks[-2]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["prompt_token_ids"] is None and first["prompt_text"] is None
    for ch in chunks:
        assert (
            ch["object"] == "chat.completion.chunk"
            and ch["id"] == first["id"]
            and ch["model"] == "sim-reasoner"
        )
    for ch in chunks[1:-2]:
        choice = ch["choices"][0]
        assert list(choice) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert choice["finish_reason"] is None and choice["token_ids"] is None
        assert "system_fingerprint" not in ch
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["stop_reason"] is None
    assert usage_chunk["choices"] == [] and usage_chunk["system_fingerprint"] == "vllm-0.32.0-sim"
    assert usage_chunk["usage"]["completion_tokens"] > 0
    delta_keys = {k for ch in chunks[1:-1] for k in ch["choices"][0]["delta"]}
    expected = {
        "reasoning": {"reasoning", "content"},
        "reasoning_content": {"reasoning_content", "content"},
        "both": {"reasoning", "reasoning_content", "content"},
    }.get(mode, {"content"})
    assert delta_keys == expected
    if mode == "both":
        for ch in chunks[1:-2]:
            delta = ch["choices"][0]["delta"]
            assert delta.get("reasoning") == delta.get("reasoning_content")
    if mode in ("reasoning", "both"):
        assert joined(chunks, "reasoning") == message["reasoning"]
    if mode == "reasoning_content":
        assert joined(chunks, "reasoning_content") == message["reasoning_content"]
    assert joined(chunks, "content") == message["content"]
    if mode in ("reasoning", "reasoning_content", "both"):
        assert "completion_tokens_details" in usage_chunk["usage"]
    else:
        assert "completion_tokens_details" not in usage_chunk["usage"]


def test_stream_without_usage_puts_fingerprint_on_finish_chunk(client: httpx.Client) -> None:
    chunks = stream_chunks(client)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["system_fingerprint"] == "vllm-0.32.0-sim"
    assert all(ch["choices"] for ch in chunks)


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(client: httpx.Client) -> None:
    """vLLM's stream_options.continuous_usage_stats (#36: a cancelled stream's cost is known): each token chunk
    carries the usage so far, growing by one token; the final usage chunk stays."""
    chunks = stream_chunks(client, stream_options={"include_usage": True, "continuous_usage_stats": True})
    final = chunks[-1]["usage"]
    running = [ch["usage"] for ch in chunks[1:-1] if ch["choices"]]
    assert running and [u["completion_tokens"] for u in running] == list(range(1, len(running) + 1))
    assert all(u["prompt_tokens"] == final["prompt_tokens"] for u in running)
    assert running[-1]["completion_tokens"] <= final["completion_tokens"]
    plain = stream_chunks(client, stream_options={"include_usage": True})
    assert not any("usage" in ch for ch in plain[:-1])


def test_inline_tags_are_sometimes_split_across_chunks(client: httpx.Client) -> None:
    configure(client, reasoning_field="inline")
    split = 0
    for i in range(12):
        chunks = stream_chunks(client, f"Question {i}: how many legs do {i + 2} spiders have?")
        pieces = [ch["choices"][0]["delta"].get("content", "") for ch in chunks[1:]]
        text = "".join(pieces)
        assert text.startswith("<think>") and text.count("</think>") == 1
        if "<think>" not in pieces or "</think>" not in pieces:
            split += 1
    assert 0 < split < 12


# ---------------------------------------------------------------------------- lengths


def test_max_tokens_truncates_inside_reasoning(client: httpx.Client) -> None:
    data = complete(client, max_tokens=5)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert data["usage"]["completion_tokens"] == 5
    chunks = stream_chunks(client, max_tokens=5)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert joined(chunks, "content") == "" and joined(chunks, "reasoning") == choice["message"]["reasoning"]
    configure(client, reasoning_field="inline")
    content = complete(client, max_completion_tokens=10)["choices"][0]["message"]["content"]
    assert content.startswith("<think>") and "</think>" not in content


def test_length_distributions(client: httpx.Client) -> None:
    configure(client, reasoning_tokens="10-20", content_tokens="lognormal:3.0:0.2")
    for i in range(5):
        usage = complete(client, f"Tell me about topic {i}.")["usage"]
        assert 10 <= usage["completion_tokens_details"]["reasoning_tokens"] <= 20
    with pytest.raises(ValueError):
        SimConfig(reasoning_tokens="lots")


# ---------------------------------------------------------------------------- faults


def test_fault_429_and_500(client: httpx.Client) -> None:
    configure(client, rate_429=1.0)
    r = client.post("/chat/completions", json=body("hi"))
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == 429
    configure(client, rate_500=1.0)
    r = client.post("/chat/completions", json=body("hi", stream=True))
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"


def test_fault_wrong_content_type_and_error_body(client: httpx.Client) -> None:
    configure(client, rate_wrong_content_type=1.0)
    r = client.post("/chat/completions", json=body("hi"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text == "<html>Bad gateway</html>"
    configure(client, rate_error_body=1.0)
    r = client.post("/chat/completions", json=body("hi"))
    assert r.status_code == 200 and r.json()["error"]["type"] == "InternalServerError"
    events = stream_events(client)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 500


def test_fault_truncated_json_and_malformed_chunk(client: httpx.Client) -> None:
    configure(client, rate_truncated_json=1.0)
    r = client.post("/chat/completions", json=body("hi"))
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.content)
    configure(client, rate_malformed=1.0)
    events = stream_events(client)
    assert events[-1] == "[DONE]"
    bad = 0
    for event in events[:-1]:
        try:
            json.loads(event)
        except json.JSONDecodeError:
            bad += 1
    assert bad == 1


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 1000])
def test_stream_faults_on_short_streams(client: httpx.Client, max_tokens: int) -> None:
    extra = {"max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    configure(client, rate_error_body=1.0)
    events = stream_events(client, **extra)
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
    assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]"
    configure(client, rate_malformed=1.0)
    events = stream_events(client, **extra)
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant" and events[-1] == "[DONE]"
    assert "usage" in json.loads(events[-2])
    assert sum(1 for e in events[1:-1] if e.startswith('{"id":"chatcmpl-') and e.endswith('"choices":[')) == 1
    configure(client, rate_drop=1.0)
    seen = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", "/chat/completions", json=body(QUESTION, stream=True, **extra)) as r:
            for part in r.iter_bytes():
                seen += part
    assert seen.startswith(b'data: {"id"') and b"[DONE]" not in seen


def test_fault_drop(client: httpx.Client) -> None:
    configure(client, rate_drop=1.0)
    seen = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", "/chat/completions", json=body(QUESTION, stream=True)) as r:
            for part in r.iter_bytes():
                seen += part
    assert seen.startswith(b"data: ") and b"[DONE]" not in seen


def test_fault_stall_trips_idle_timeout_then_recovers(client: httpx.Client) -> None:
    configure(client, rate_stall=1.0, stall_s=0.6)
    with pytest.raises(httpx.ReadTimeout):
        with client.stream("POST", "/chat/completions", json=body(QUESTION, stream=True), timeout=0.3) as r:
            for _ in r.iter_bytes():
                pass
    started = time.monotonic()
    events = stream_events(client)
    assert time.monotonic() - started >= 0.55 and events[-1] == "[DONE]"


def test_fault_empty_reasoning(client: httpx.Client) -> None:
    configure(client, rate_empty_reasoning=1.0)
    data = complete(client)
    assert data["choices"][0]["message"]["reasoning"] == ""
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 24
    chunks = stream_chunks(client)
    reasoning_deltas = [
        ch["choices"][0]["delta"] for ch in chunks if "reasoning" in ch["choices"][0]["delta"]
    ]
    assert len(reasoning_deltas) == 24 and all(d["reasoning"] == "" for d in reasoning_deltas)
    configure(client, rate_empty_reasoning=1.0, reasoning_field="inline")
    assert complete(client)["choices"][0]["message"]["content"].startswith("<think></think>")


def test_stats_count_faults_and_requests(client: httpx.Client) -> None:
    before = client.get(root(client) + "/sim/stats").json()
    configure(client, rate_429=1.0)
    client.post("/chat/completions", json=body("hi"))
    after = client.get(root(client) + "/sim/stats").json()
    assert after["errors_injected"]["429"] == before["errors_injected"]["429"] + 1
    assert after["chat_requests"] == before["chat_requests"] + 1
    assert after["in_flight"] == 0 and after["max_in_flight"] >= 1


# ---------------------------------------------------------------------------- config


def test_patch_config_takes_effect_mid_run(client: httpx.Client) -> None:
    assert "reasoning" in complete(client)["choices"][0]["message"]
    config = configure(client, reasoning_field="reasoning_content")
    assert config["reasoning_field"] == "reasoning_content"
    assert client.get(root(client) + "/sim/config").json()["reasoning_field"] == "reasoning_content"
    message = complete(client)["choices"][0]["message"]
    assert "reasoning" not in message and message["reasoning_content"]
    assert client.patch(root(client) + "/sim/config", json={"nope": 1}).status_code == 400
    assert client.patch(root(client) + "/sim/config", json={"reasoning_field": "x"}).status_code == 400
    assert client.patch(root(client) + "/sim/config", json={"rate_500": 2}).status_code == 400
    assert client.get(root(client) + "/sim/config").json()["reasoning_field"] == "reasoning_content"


def test_cli_flags_round_trip() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(["--reasoning-field", "inline", "--tokens-per-s", "30", "--rate-429", "0.1"])
    config = config_from_args(ns)
    assert config == SimConfig(reasoning_field="inline", tokens_per_s=30.0, rate_429=0.1)


# ---------------------------------------------------------------------------- text


HOSTILE = [
    "nul\x00byte",
    "</script><script>alert(1)</script>",
    "bidi \u202eevil\u202c done",
    "zero\u200bwidth",
    "emoji 👩‍👩‍👧 and 🏳️‍🌈 ok",
    "quotes \" ' \\ and \n newlines \r\n tabs \t",
    "".join(chr(c) for c in range(1, 0x3000, 7)) * 20 + "漢字" * 30_000,  # ~100 KB of mixed text
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_echo_round_trips_exactly(client: httpx.Client, text: str) -> None:
    message = complete(client, "ECHO:" + text)["choices"][0]["message"]
    assert message["reasoning"] == text and message["content"] == text
    chunks = stream_chunks(client, "ECHO:" + text)
    assert joined(chunks, "reasoning") == text and joined(chunks, "content") == text
    if len(text) > 1000:
        assert len(chunks) > 20  # split into many chunks


def test_echo_inline(client: httpx.Client) -> None:
    configure(client, reasoning_field="inline")
    text = "a</think>b\x00"
    chunks = stream_chunks(client, "ECHO:" + text)
    assert joined(chunks, "content") == f"<think>{text}</think>{text}"


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("What is 17 + 25?", "42"),
        ("Compute 6 * 7", "42"),
        ("What is 100 - 58?", "42"),
        ("Calculate 84 / 2.", "42"),
        ("What is 2 + 3 * 4?", "14"),
        ("What is 7 times 8?", "56"),
        ("What is 1.5 + 2.25?", "3.75"),
        ("What is 6 × 7?", "42"),
        ("What is (3 + 4) * 5?", "35"),
    ],
)
def test_arithmetic_answers(client: httpx.Client, question: str, answer: str) -> None:
    configure(client, content_tokens="4", reasoning_tokens="80")
    data = complete(client, question)
    assert f"The answer is **{answer}**." in data["choices"][0]["message"]["content"]
    assert answer in data["choices"][0]["message"]["reasoning"]


def test_solve_arithmetic_ignores_non_questions() -> None:
    assert solve_arithmetic("Pages 10-20 are missing from my book.") is None
    assert solve_arithmetic("What is 1 / 0?") is None
    assert solve_arithmetic("17 + 25") is not None


def test_deterministic_per_seed() -> None:
    def texts(seed: int) -> list[str]:
        with running_in_thread(SimConfig(seed=seed)) as url, httpx.Client(base_url=url) as c:
            out = []
            for q in ("What is 3 + 4?", "Explain recursion briefly.", QUESTION):
                message = complete(c, q)["choices"][0]["message"]
                out.append(message["reasoning"] + "|" + message["content"])
            out.append(joined(stream_chunks(c, QUESTION), "reasoning"))
            return out

    first = texts(7)
    assert texts(7) == first
    assert texts(8) != first


# ---------------------------------------------------------------------------- token ids


def test_token_ids_words(client: httpx.Client) -> None:
    configure(client, reasoning_field="inline")
    data = complete(client, return_token_ids=True)
    ids = data["choices"][0]["token_ids"]
    assert ids[0] == 128821 and 128822 in ids
    assert all(100 <= i <= 120000 for i in ids if i not in (128821, 128822))
    assert len(data["prompt_token_ids"]) == data["usage"]["prompt_tokens"]
    assert len(ids) == data["usage"]["completion_tokens"]


def test_token_ids_deepseek_inline(client: httpx.Client) -> None:
    from synthwatch.simulator.token_plan import deepseek_tokenizer

    configure(client, reasoning_field="inline", token_ids="deepseek")
    data = complete(client, return_token_ids=True)
    ids = data["choices"][0]["token_ids"]
    content = data["choices"][0]["message"]["content"]
    close = ids.index(128822)
    assert ids[0] == 128821 and 128821 not in ids[1:] and ids.count(128822) == 1
    tok = deepseek_tokenizer()
    reasoning = content[len("<think>") : content.index("</think>")]
    assert tok.decode(ids[1:close]) == reasoning
    assert ids[-1] == 1 and tok.decode(ids[:-1]) == content  # ends with EOS: the reply stopped by itself
    assert data["usage"]["completion_tokens"] == len(ids)
    assert data["prompt_token_ids"][-1] != 128821
    chunks = stream_chunks(client, return_token_ids=True)
    streamed = [i for ch in chunks[1:] for i in ch["choices"][0]["token_ids"]]
    assert streamed == ids
    # With a reasoning parser, the </think> token still arrives as an empty delta with its id.
    configure(client, reasoning_field="reasoning", token_ids="deepseek")
    chunks = stream_chunks(client, return_token_ids=True)
    empty = [ch for ch in chunks[1:] if ch["choices"][0]["delta"] == {} and not ch["choices"][0]["finish_reason"]]
    assert len(empty) == 1 and empty[0]["choices"][0]["token_ids"] == [128822]
    assert chunks[0]["prompt_token_ids"]
    configure(client, reasoning_field="inline-no-open", token_ids="deepseek")
    data = complete(client, return_token_ids=True)
    assert data["prompt_token_ids"][-2] == 128821  # the template's prefilled "<think>\n"
    assert 128821 not in data["choices"][0]["token_ids"]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}


def test_tool_calls_in_vllms_shape(client: httpx.Client) -> None:
    """A request offering tools gets a call of the first one, as vLLM's tool parser returns it: content null,
    finish_reason "tool_calls", arguments as JSON text; streamed as a head delta (id, type, index, name) and
    argument pieces, which merge back into the same call."""
    from synthwatch.capture import tool_calls
    from synthwatch.capture.stream import StreamAccumulator

    configure(client, reasoning_field="reasoning")
    ask = [{"role": "user", "content": "What is the weather in Paris now?"}]
    data = complete(client, "unused", messages=ask, tools=[WEATHER])
    choice = data["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None and message["reasoning"]
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}
    assert tool_calls.problems(message["tool_calls"], [WEATHER]) == []
    chunks = stream_chunks(client, "unused", messages=ask, tools=[WEATHER])
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"]
              and "tool_calls" in c["choices"][0]["delta"]]
    assert deltas[0] == {"id": call["id"], "type": "function", "index": 0, "function": {"name": "get_weather"}}
    assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in deltas[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    acc = StreamAccumulator()
    for chunk in chunks:
        acc.feed(chunk)
    assert tool_calls.from_extracted(acc.result()) == [call]
    # After the tool's result, or with tool_choice "none", the model answers in text.
    answered = [*ask, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 21}'}]
    for extra in ({"messages": answered, "tools": [WEATHER]}, {"messages": ask, "tools": [WEATHER], "tool_choice": "none"}):
        choice = complete(client, "unused", **extra)["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"] and not choice["message"]["tool_calls"]
    assert tool_calls.problems([{"function": {"name": "nope", "arguments": "{oops"}}], [WEATHER]) == [
        "tool call 0 names an unknown tool 'nope'", "tool call 0 (nope): arguments are not valid JSON"]


def test_token_ids_deepseek_look_like_vllm_032(client: httpx.Client) -> None:
    """The facts of a real vLLM 0.32 run with return_token_ids (reference/training-formats.md): the prompt
    ids end with the assistant header, the prefilled <think> and a newline; the completion ends with EOS
    (id 1) only when finish_reason is "stop"."""
    from synthwatch.simulator.token_plan import deepseek_tokenizer

    tok = deepseek_tokenizer()
    configure(client, reasoning_field="reasoning", token_ids="deepseek")
    data = complete(client, return_token_ids=True)
    choice = data["choices"][0]
    prompt, completion = data["prompt_token_ids"], choice["token_ids"]
    assert prompt[-3:] == [128804, 128821, 201] and tok.decode(prompt[-3:]) == "<｜Assistant｜><think>\n"
    assert choice["finish_reason"] == "stop" and completion[-1] == 1 and completion.count(1) == 1
    close = completion.index(128822)
    assert tok.decode(completion[:close]) == choice["message"]["reasoning"]
    assert tok.decode(completion[close + 1 : -1]) == choice["message"]["content"]
    assert data["usage"]["completion_tokens"] == len(completion)
    assert data["usage"]["prompt_tokens"] == len(prompt)
    # Streamed: the same ids, the EOS in the finish chunk.
    chunks = stream_chunks(client, return_token_ids=True)
    assert chunks[0]["prompt_token_ids"] == prompt
    assert [i for ch in chunks[1:] for i in ch["choices"][0]["token_ids"]] == completion
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"][0]["token_ids"][-1] == 1
    # Cut by max_tokens: finish_reason "length" and no EOS.
    cut = complete(client, return_token_ids=True, max_tokens=5)["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 5 and 1 not in cut["token_ids"]
    # A request with thinking off gets no prefilled <think>.
    plain = complete(client, return_token_ids=True, chat_template_kwargs={"enable_thinking": False})
    assert plain["prompt_token_ids"][-1] == 128804


# ---------------------------------------------------------------------------- pacing


def test_paced_streams_and_disconnects(client: httpx.Client, base_url: str) -> None:
    configure(client, tokens_per_s=40, ttft_ms=50, reasoning_tokens="8", content_tokens="8")

    async def run() -> tuple[float, list[int]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(i: int) -> int:
                async with session.post(
                    base_url + "/chat/completions", json=body(f"Prompt {i}", stream=True)
                ) as r:
                    data = await r.read()
                return data.count(b"data: ")

            async def quitter() -> None:
                async with session.post(base_url + "/chat/completions", json=body("bye", stream=True)) as r:
                    await r.content.readany()  # read a little, then hang up

            started = time.monotonic()
            counts = await asyncio.gather(*(one(i) for i in range(300)), *(quitter() for _ in range(20)))
            return time.monotonic() - started, [c for c in counts if c is not None]

    elapsed, counts = run_async(run())
    # 1 role chunk + 8 reasoning + 8 content (+ [DONE]) at 40 tokens/s: ~0.45 s, all in parallel.
    assert all(c == 18 for c in counts) and len(counts) == 300, set(counts)
    assert 0.4 < elapsed < 30  # one after another would take minutes
    deadline = time.monotonic() + 5
    while True:
        stats = client.get(root(client) + "/sim/stats").json()
        if stats["in_flight"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stats["in_flight"] == 0 and stats["max_in_flight"] >= 300
    assert stats["client_disconnects"] >= 1
