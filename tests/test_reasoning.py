"""Reasoning capture: every server shape of docs reasoning-fields.md, inline tags, modes, extras."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from synthwatch.capture.reasoning import (
    MODES,
    REASONING_FIELDS,
    Extracted,
    ResponseShapeError,
    extract_response,
    split_inline,
)
from synthwatch.capture.stream import StreamAccumulator

# --------------------------------------------------------------------------------------------
# helpers: realistic chunk and body builders (round-tripped through orjson like the client does)


def _rt(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj))


def vllm_chunk(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    c.update(choice)
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion.chunk",
        "created": 1796017261,
        "model": "tiny",
        "choices": [c],
    }


def sglang_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    full = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
    full.update(delta)
    return {
        "id": "c8f1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen3",
        "choices": [
            {"index": 0, "delta": full, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        ],
        "usage": None,
    }


def usage_chunk(usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
            "choices": [], "usage": usage}  # fmt: skip


def run_stream(chunks: list[dict[str, Any]], mode: str = "auto", **kw: Any) -> Extracted:
    acc = StreamAccumulator(mode, **kw)
    for ch in chunks:
        acc.feed(_rt(ch))
    return acc.result()


def body(message: dict[str, Any], finish: str = "stop", **top: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "id": "chatcmpl-xyz",
        "object": "chat.completion",
        "created": 1,
        "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
    }
    b.update(top)
    return _rt(b)


def content_stream(pieces: list[str], finish: str = "stop") -> list[dict[str, Any]]:
    chunks = [vllm_chunk({"role": "assistant", "content": ""})]
    chunks += [vllm_chunk({"content": p}) for p in pieces[:-1]]
    chunks.append(vllm_chunk({"content": pieces[-1]} if pieces else {}, finish=finish))
    return chunks


# --------------------------------------------------------------------------------------------
# server table rows


def test_vllm_011_reasoning_content() -> None:
    chunks = [
        vllm_chunk({"role": "assistant", "content": ""}),
        vllm_chunk({"reasoning_content": "Let me"}),
        vllm_chunk({"reasoning_content": " think."}),
        vllm_chunk({"content": "\n\n42"}),
        vllm_chunk({"content": "."}, finish="stop", stop_reason=None),
    ]
    x = run_stream(chunks)
    assert (x.reasoning, x.content, x.reasoning_source) == ("Let me think.", "\n\n42.", "reasoning_content")
    assert x.finish_reason == "stop" and x.n_chunks == 5
    assert x.unread_fields == {} and x.duplicate_fields == [] and x.problems == []
    y = extract_response(body({"content": "\n\n42.", "reasoning_content": "Let me think."}))
    assert (y.reasoning, y.content, y.reasoning_source) == ("Let me think.", "\n\n42.", "reasoning_content")
    assert y.n_chunks == 0


def test_vllm_011_to_015_both_fields_same_text_not_doubled() -> None:
    chunks = [vllm_chunk({"role": "assistant", "content": ""})]
    chunks += [vllm_chunk({"reasoning": p, "reasoning_content": p}) for p in ["Hmm", ", so", " 2+2"]]
    chunks.append(vllm_chunk({"content": "4"}, finish="stop"))
    x = run_stream(chunks)
    assert x.reasoning == "Hmm, so 2+2"
    assert x.reasoning_source == "reasoning"
    assert x.duplicate_fields == ["reasoning_content"]
    assert x.unread_fields == {}
    assert x.content == "4"
    # explicit mode on the old name reads the same text, the other is the duplicate
    x = run_stream(chunks, mode="reasoning_content")
    assert (x.reasoning, x.reasoning_source, x.duplicate_fields) == (
        "Hmm, so 2+2",
        "reasoning_content",
        ["reasoning"],
    )
    y = extract_response(
        body({"content": "4", "reasoning": "Hmm, so 2+2", "reasoning_content": "Hmm, so 2+2"})
    )
    assert (y.reasoning, y.duplicate_fields, y.unread_fields) == ("Hmm, so 2+2", ["reasoning_content"], {})


VLLM_032_STREAM = [
    {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1796017261, "model": "tiny",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}], "prompt_token_ids": [1, 2, 3], "prompt_text": None},
    {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1796017261, "model": "tiny",
     "choices": [{"index": 0, "delta": {"reasoning": "skin"}, "logprobs": None, "finish_reason": None,
                  "token_ids": [11]}]},
    {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1796017261, "model": "tiny",
     "choices": [{"index": 0, "delta": {"content": " Further"}, "logprobs": None, "finish_reason": None,
                  "token_ids": [12, 13]}]},
    {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1796017261, "model": "tiny",
     "choices": [{"index": 0, "delta": {"content": "絮"}, "logprobs": None, "finish_reason": "length",
                  "stop_reason": None, "token_ids": [14]}], "system_fingerprint": "vllm-0.32.0-286300af"},
    {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1796017261, "model": "tiny",
     "choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4,
                              "completion_tokens_details": {"reasoning_tokens": 1}}},
]  # fmt: skip


def test_vllm_016_plus_reasoning_only_real_shape() -> None:
    acc = StreamAccumulator()
    carried = [acc.feed(_rt(ch)) for ch in VLLM_032_STREAM]
    assert carried == [False, True, True, True, False]  # role chunk and usage chunk carry no text
    assert acc.n_chunks == 5 and acc.error is None
    x = acc.result()
    assert (x.reasoning, x.content, x.reasoning_source) == ("skin", " Further絮", "reasoning")
    assert x.content_was_null is False
    assert x.finish_reason == "length"
    assert x.token_ids == [11, 12, 13, 14]
    assert x.prompt_token_ids == [1, 2, 3]
    assert x.usage is not None and x.usage["completion_tokens_details"]["reasoning_tokens"] == 1
    assert x.system_fingerprint == "vllm-0.32.0-286300af"
    assert x.model == "tiny" and x.response_id == "chatcmpl-9"
    # vLLM's own keys are kept verbatim, even when null (they tell which server this was)
    assert x.extra == {"top": {"prompt_text": None}, "choice": {"logprobs": None, "stop_reason": None}}
    assert x.problems == []


def test_vllm_016_non_streaming_with_token_ids_and_null_content() -> None:
    b = _rt({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None,
                                             "annotations": None, "audio": None, "function_call": None,
                                             "tool_calls": [], "reasoning": "all thinking"},
                     "logprobs": None, "finish_reason": "length", "stop_reason": None,
                     "token_ids": [5, 6, 7]}],
        "service_tier": None, "system_fingerprint": "vllm-0.32.0", "prompt_logprobs": None,
        "prompt_token_ids": [1, 2], "kv_transfer_params": None,
        "usage": {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3,
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    })  # fmt: skip
    x = extract_response(b)
    assert (x.reasoning, x.content, x.content_was_null) == ("all thinking", "", True)
    assert x.reasoning_source == "reasoning"
    assert x.token_ids == [5, 6, 7] and x.prompt_token_ids == [1, 2]
    assert x.system_fingerprint == "vllm-0.32.0"
    assert x.extra == {
        "top": {"service_tier": None, "prompt_logprobs": None, "kv_transfer_params": None},
        "choice": {"logprobs": None, "stop_reason": None},
        "message": {
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
        },
    }


def test_vllm_016_include_reasoning_false() -> None:
    x = extract_response(body({"content": "Answer.", "reasoning": None}))
    assert (x.reasoning, x.content, x.reasoning_source) == ("", "Answer.", "none")
    assert x.unread_fields == {}


def test_explicit_reasoning_content_mode_against_vllm_016_is_a_mismatch() -> None:
    x = run_stream(VLLM_032_STREAM, mode="reasoning_content")
    assert x.reasoning == "" and x.reasoning_source == "none"
    assert x.unread_fields == {"reasoning": "skin"}
    assert x.content == " Further絮"
    y = extract_response(body({"content": "A", "reasoning": "R"}), mode="reasoning_content")
    assert (y.reasoning, y.unread_fields) == ("", {"reasoning": "R"})


def test_sglang_stream_null_keys_and_matched_stop() -> None:
    chunks = [
        sglang_chunk({"role": "assistant", "content": ""}),
        sglang_chunk({"reasoning_content": "First"}),
        sglang_chunk({"reasoning_content": " idea"}),
        sglang_chunk({"content": "Done"}),
        sglang_chunk({}, finish="stop"),
    ]
    chunks[-1]["choices"][0]["matched_stop"] = 151645
    x = run_stream(chunks)
    assert (x.reasoning, x.content, x.reasoning_source) == ("First idea", "Done", "reasoning_content")
    assert x.finish_reason == "stop"
    assert x.extra == {"choice": {"logprobs": None, "matched_stop": 151645}, "delta": {"tool_calls": None}}
    assert x.problems == []
    x = run_stream(chunks, mode="reasoning")
    assert x.unread_fields == {"reasoning_content": "First idea"} and x.reasoning == ""


def test_sglang_content_null_in_every_chunk() -> None:
    chunks = [sglang_chunk({"reasoning_content": "only"}), sglang_chunk({}, finish="length")]
    x = run_stream(chunks)
    assert x.content_was_null is True and x.content == ""
    assert x.reasoning == "only"


def test_sglang_separate_reasoning_false_merges_into_content() -> None:
    chunks = [sglang_chunk({"content": p}) for p in ["<think>", "plan", "</think>", "\n\nanswer"]]
    x = run_stream(chunks)
    assert (x.reasoning, x.content, x.reasoning_source) == ("plan", "answer", "inline")


def test_sglang_stream_reasoning_false_burst() -> None:
    chunks = [sglang_chunk({"reasoning_content": "a long buffered chain of thought"}),
              sglang_chunk({"content": "ok"}, finish="stop")]  # fmt: skip
    assert run_stream(chunks).reasoning == "a long buffered chain of thought"


def test_llamacpp_reasoning_content_and_timings() -> None:
    chunks = [
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
         "created": 1, "id": "chatcmpl-L", "model": "gguf", "system_fingerprint": "b6000-abc",
         "object": "chat.completion.chunk"},
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"reasoning_content": "Think"}}],
         "created": 1, "id": "chatcmpl-L", "model": "gguf", "system_fingerprint": "b6000-abc",
         "object": "chat.completion.chunk"},
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": "Out"}}],
         "created": 1, "id": "chatcmpl-L", "model": "gguf", "system_fingerprint": "b6000-abc",
         "object": "chat.completion.chunk"},
        {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}], "created": 1, "id": "chatcmpl-L",
         "model": "gguf", "system_fingerprint": "b6000-abc", "object": "chat.completion.chunk",
         "usage": {"completion_tokens": 3, "prompt_tokens": 4, "total_tokens": 7},
         "timings": {"predicted_n": 3, "predicted_ms": 12.5}},
    ]  # fmt: skip
    x = run_stream(chunks)
    assert (x.reasoning, x.content, x.reasoning_source) == ("Think", "Out", "reasoning_content")
    assert x.system_fingerprint == "b6000-abc"
    assert x.extra == {"top": {"timings": {"predicted_n": 3, "predicted_ms": 12.5}}}
    assert x.usage == {"completion_tokens": 3, "prompt_tokens": 4, "total_tokens": 7}


def test_llamacpp_reasoning_format_none_inline() -> None:
    x = run_stream(content_stream(["<think>\n", "step 1", "\n</think>\n\n", "Result"]))
    assert (x.reasoning, x.content, x.reasoning_source) == ("\nstep 1\n", "Result", "inline")
    y = extract_response(body({"content": "<think>\nstep 1\n</think>\n\nResult"}))
    assert (y.reasoning, y.content, y.reasoning_source) == ("\nstep 1\n", "Result", "inline")


def test_llamacpp_deepseek_legacy_field_and_inline_same_text() -> None:
    msg = {"content": "<think>\nWhy not.\n</think>\n\nBecause.", "reasoning_content": "Why not."}
    x = extract_response(body(msg))
    assert (x.reasoning, x.reasoning_source) == ("Why not.", "reasoning_content")
    assert x.content == "Because."  # the inline copy is removed, not kept twice
    assert x.duplicate_fields == ["inline"] and x.unread_fields == {}
    chunks = [vllm_chunk({"reasoning_content": "Why not.", "content": "<think>\nWhy not.\n</think>\n\n"}),
              vllm_chunk({"content": "Because."}, finish="stop")]  # fmt: skip
    s = run_stream(chunks)
    assert (s.reasoning, s.content, s.duplicate_fields) == ("Why not.", "Because.", ["inline"])


def test_field_read_but_different_inline_text_left_in_content() -> None:
    x = extract_response(body({"content": "<think>other</think>answer", "reasoning_content": "field"}))
    assert x.reasoning == "field"
    assert x.content == "<think>other</think>answer"  # not touched: it is not the same reasoning
    assert x.unread_fields == {"inline": "other"}


def test_ollama_v1_reasoning() -> None:
    chunks = [
        {"id": "chatcmpl-311", "object": "chat.completion.chunk", "created": 1, "model": "qwen3:0.6b",
         "system_fingerprint": "fp_ollama",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "reasoning": "Okay"},
                      "finish_reason": None}]},
        {"id": "chatcmpl-311", "object": "chat.completion.chunk", "created": 1, "model": "qwen3:0.6b",
         "system_fingerprint": "fp_ollama",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]},
    ]  # fmt: skip
    x = run_stream(chunks)
    assert (x.reasoning, x.content, x.reasoning_source) == ("Okay", "Hi", "reasoning")


def test_ollama_native_thinking_field() -> None:
    # chat.completion-shaped bodies carrying Ollama's native field name (proxies pass it through)
    x = extract_response(body({"content": "Hi", "thinking": "Greeting."}))
    assert (x.reasoning, x.reasoning_source) == ("Greeting.", "thinking")
    x = extract_response(body({"content": "Hi", "thinking": {"text": "As object."}}))
    assert (x.reasoning, x.reasoning_source) == ("As object.", "thinking")
    x = extract_response(body({"content": "Hi", "thinking": {"thinking": "Other key."}}))
    assert x.reasoning == "Other key."
    s = run_stream([vllm_chunk({"thinking": "a"}), vllm_chunk({"thinking": {"text": "b"}}),
                    vllm_chunk({"content": "c"}, finish="stop")])  # fmt: skip
    assert (s.reasoning, s.content, s.reasoning_source) == ("ab", "c", "thinking")
    assert run_stream([vllm_chunk({"thinking": "t"})], mode="thinking").reasoning == "t"


def test_ollama_native_api_body_is_a_shape_error_with_hint() -> None:
    native = {"model": "qwen3", "created_at": "2025-01-01T00:00:00Z",
              "message": {"role": "assistant", "content": "Hi", "thinking": "hmm"},
              "done": True, "done_reason": "stop", "eval_count": 3}  # fmt: skip
    with pytest.raises(ResponseShapeError, match="Ollama native"):
        extract_response(native)


def test_deepseek_api_usage_passthrough() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30,
             "prompt_cache_hit_tokens": 0, "prompt_cache_miss_tokens": 10,
             "completion_tokens_details": {"reasoning_tokens": 15}}  # fmt: skip
    x = extract_response(body({"content": "A", "reasoning_content": "R"}, usage=usage))
    assert (x.reasoning, x.reasoning_source) == ("R", "reasoning_content")
    assert x.usage == usage


def test_openrouter_reasoning_and_details() -> None:
    details = [
        {"type": "reasoning.text", "text": "Step one.", "format": "unknown", "index": 0},
        {"type": "reasoning.encrypted", "data": "gAAAA...", "format": "openai-responses-v1", "index": 1},
    ]
    msg = {"content": "Answer", "reasoning": "Step one.", "reasoning_details": details}
    x = extract_response(body(msg, provider="Fireworks"))
    assert (x.reasoning, x.reasoning_source) == ("Step one.", "reasoning")
    assert x.duplicate_fields == ["reasoning_details"]
    assert x.extra["top"] == {"provider": "Fireworks"}
    # only reasoning_details (reasoning excluded elsewhere): the details are read
    x = extract_response(body({"content": "Answer", "reasoning_details": details}))
    assert (x.reasoning, x.reasoning_source) == ("Step one.", "reasoning_details")
    summary = [{"type": "reasoning.summary", "summary": "Short plan.", "format": "openai-responses-v1"}]
    x = extract_response(body({"content": "A", "reasoning": None, "reasoning_details": summary}))
    assert (x.reasoning, x.reasoning_source) == ("Short plan.", "reasoning_details")
    # encrypted only: nothing readable
    x = extract_response(body({"content": "A", "reasoning_details": details[1:]}))
    assert (x.reasoning, x.reasoning_source) == ("", "none")


def test_openrouter_stream() -> None:
    def orc(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "gen-1", "provider": "Together", "model": "deepseek/deepseek-r1",
                "object": "chat.completion.chunk", "created": 1,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                             "native_finish_reason": finish, "logprobs": None}]}  # fmt: skip

    chunks = [
        orc({"role": "assistant", "content": "", "reasoning": "Think",
             "reasoning_details": [{"type": "reasoning.text", "text": "Think", "index": 0}]}),
        orc({"role": "assistant", "content": "", "reasoning": "ing",
             "reasoning_details": [{"type": "reasoning.text", "text": "ing", "index": 0}]}),
        orc({"role": "assistant", "content": "Yes"}, finish="stop"),
    ]  # fmt: skip
    acc = StreamAccumulator()
    assert [acc.feed(_rt(c)) for c in chunks] == [True, True, True]
    x = acc.result()
    assert (x.reasoning, x.content, x.reasoning_source) == ("Thinking", "Yes", "reasoning")
    assert x.duplicate_fields == ["reasoning_details"]
    # last non-null value wins; a key only ever null is kept as None
    assert x.extra == {
        "top": {"provider": "Together"},
        "choice": {"native_finish_reason": "stop", "logprobs": None},
    }
    x = run_stream(chunks, mode="reasoning_details")
    assert (x.reasoning, x.reasoning_source, x.duplicate_fields) == (
        "Thinking",
        "reasoning_details",
        ["reasoning"],
    )


def test_tgi_no_parser_inline() -> None:
    x = run_stream(content_stream(["<think>", "Because", "</think>", "Fine."]))
    assert (x.reasoning, x.content, x.reasoning_source) == ("Because", "Fine.", "inline")


def test_openai_only_reasoning_tokens() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 300, "total_tokens": 309,
             "completion_tokens_details": {"reasoning_tokens": 256, "audio_tokens": 0}}  # fmt: skip
    x = extract_response(body({"content": "Paris.", "refusal": None, "annotations": []}, usage=usage,
                              service_tier="default", system_fingerprint=None))  # fmt: skip
    assert (x.reasoning, x.content, x.reasoning_source) == ("", "Paris.", "none")
    assert x.usage is not None and x.usage["completion_tokens_details"]["reasoning_tokens"] == 256
    assert x.unread_fields == {} and x.duplicate_fields == []
    assert x.extra == {"top": {"service_tier": "default"}, "message": {"refusal": None, "annotations": []}}


# --------------------------------------------------------------------------------------------
# inline tags

TEXT = "<think>abc</think>def"


@pytest.mark.parametrize("cut", range(len(TEXT) + 1))
def test_tags_split_across_two_chunks_at_every_position(cut: int) -> None:
    x = run_stream(content_stream([TEXT[:cut], TEXT[cut:]]))
    assert (x.reasoning, x.content, x.reasoning_source) == ("abc", "def", "inline")


def test_tags_split_across_three_chunks_everywhere() -> None:
    for i in range(len(TEXT) + 1):
        for j in range(i, len(TEXT) + 1):
            x = run_stream(content_stream([TEXT[:i], TEXT[i:j], TEXT[j:]]))
            assert (x.reasoning, x.content, x.reasoning_source) == ("abc", "def", "inline"), (i, j)


def test_one_character_per_chunk() -> None:
    x = run_stream(content_stream(list("  <think>r1\nr2</think>\n\nans")))
    assert (x.reasoning, x.content, x.reasoning_source) == ("r1\nr2", "ans", "inline")


def test_inline_no_open_tag() -> None:
    x = run_stream(content_stream(["Plan it", "</thi", "nk>\n\nDone"]))
    assert (x.reasoning, x.content, x.reasoning_source) == ("Plan it", "Done", "inline-no-open")
    assert split_inline("r</think>c") == ("r", "c", "inline-no-open")


def test_truncated_before_close_with_open_tag() -> None:
    x = run_stream(content_stream(["<think>still", " going"], finish="length"))
    assert (x.reasoning, x.content, x.reasoning_source) == ("still going", "", "inline")
    assert x.finish_reason == "length"


def test_truncated_no_tags_prefilled_open() -> None:
    chunks = content_stream(["all of it", " is thought"], finish="length")
    x = run_stream(chunks, prefilled_open=True)
    assert (x.reasoning, x.content, x.reasoning_source) == ("all of it is thought", "", "inline-no-open")
    # without prefilled_open the text is an answer
    x = run_stream(chunks)
    assert (x.reasoning, x.content, x.reasoning_source) == ("", "all of it is thought", "none")
    # prefilled but finished normally without </think>: an answer, not reasoning
    x = run_stream(content_stream(["short answer"], finish="stop"), prefilled_open=True)
    assert (x.reasoning, x.content, x.reasoning_source) == ("", "short answer", "none")
    y = extract_response(body({"content": "cut off"}, finish="length"), prefilled_open=True)
    assert (y.reasoning, y.content, y.reasoning_source) == ("cut off", "", "inline-no-open")


def test_literal_close_tag_in_prose_after_the_first() -> None:
    text = "<think>r</think>\n\nUse the </think> tag to end thinking."
    x = run_stream(content_stream([text]))
    assert x.reasoning == "r"
    assert x.content == "Use the </think> tag to end thinking."


def test_split_inline_rules() -> None:
    assert split_inline("  \n<think>r</think>c") == ("r", "c", "inline")
    assert split_inline("<think>r</think>\n\n\n  c") == ("r", "  c", "inline")  # only \n stripped
    assert split_inline("<think>r</think> c") == ("r", " c", "inline")
    assert split_inline("<think>r</think>") == ("r", "", "inline")
    assert split_inline("<think>r") == ("r", "", "inline")
    assert split_inline("<think>r", truncated=True) == ("r", "", "inline")
    assert split_inline("plain") == ("", "plain", "none")
    assert split_inline("") == ("", "", "none")
    assert split_inline("", prefilled_open=True, truncated=True) == ("", "", "none")
    assert split_inline("x", prefilled_open=True, truncated=True) == ("x", "", "inline-no-open")
    assert split_inline("a<think>b") == ("", "a<think>b", "none")  # opening tag must lead
    assert split_inline("<seed:think>r</seed:think>c", "<seed:think>", "</seed:think>") == (
        "r",
        "c",
        "inline",
    )


def test_custom_tags_streaming() -> None:
    x = run_stream(
        content_stream(["◁think▷", "idea◁/think▷", "out"]), think_open="◁think▷", think_close="◁/think▷"
    )
    assert (x.reasoning, x.content, x.reasoning_source) == ("idea", "out", "inline")


def test_auto_prefers_fields_over_inline() -> None:
    chunks = [vllm_chunk({"reasoning": "field"}), vllm_chunk({"content": "<think>x</think>y"})]
    x = run_stream(chunks)
    assert (x.reasoning, x.reasoning_source) == ("field", "reasoning")
    assert x.unread_fields == {"inline": "x"}


# --------------------------------------------------------------------------------------------
# explicit modes


def test_mode_validation() -> None:
    assert set(MODES) == {"auto", *REASONING_FIELDS, "inline", "none"}
    with pytest.raises(ValueError, match="unknown reasoning mode"):
        StreamAccumulator("reasoning_text")
    with pytest.raises(ValueError):
        extract_response(body({"content": "x"}), mode="bogus")


def test_auto_preference_and_different_texts_unread() -> None:
    msg = {"content": "c", "reasoning": "A", "reasoning_content": "B", "thinking": "A"}
    x = extract_response(body(msg))
    assert (x.reasoning, x.reasoning_source) == ("A", "reasoning")
    assert x.unread_fields == {"reasoning_content": "B"}
    assert x.duplicate_fields == ["thinking"]
    x = extract_response(body({"content": "c", "reasoning_content": "B", "thinking": "T"}))
    assert (x.reasoning, x.unread_fields) == ("B", {"thinking": "T"})


@pytest.mark.parametrize("mode", ["reasoning", "reasoning_content", "reasoning_details", "thinking"])
def test_explicit_field_modes_read_only_their_field(mode: str) -> None:
    texts = {
        "reasoning": "from reasoning",
        "reasoning_content": "from rc",
        "reasoning_details": "from details",
        "thinking": "from thinking",
    }
    msg: dict[str, Any] = {"content": "<think>inline</think>answer"}
    for name, t in texts.items():
        msg[name] = [{"type": "reasoning.text", "text": t}] if name == "reasoning_details" else t
    x = extract_response(body(msg), mode=mode)
    assert (x.reasoning, x.reasoning_source) == (texts[mode], mode)
    expected_unread = {k: v for k, v in texts.items() if k != mode}
    expected_unread["inline"] = "inline"
    assert x.unread_fields == expected_unread
    assert x.content == "<think>inline</think>answer"  # explicit field mode does not parse inline


def test_mode_inline_ignores_fields() -> None:
    x = extract_response(body({"content": "<think>i</think>a", "reasoning": "f"}), mode="inline")
    assert (x.reasoning, x.content, x.reasoning_source) == ("i", "a", "inline")
    assert x.unread_fields == {"reasoning": "f"}
    x = run_stream(VLLM_032_STREAM, mode="inline")
    assert (x.reasoning, x.reasoning_source, x.unread_fields) == ("", "none", {"reasoning": "skin"})


def test_mode_none_reads_nothing() -> None:
    x = extract_response(body({"content": "<think>i</think>a", "reasoning_content": "f"}), mode="none")
    assert (x.reasoning, x.content, x.reasoning_source) == ("", "<think>i</think>a", "none")
    assert x.unread_fields == {"reasoning_content": "f", "inline": "i"}
    x = extract_response(body({"content": "plain"}), mode="none")
    assert (x.reasoning, x.unread_fields) == ("", {})


def test_explicit_mode_empty_field_and_inline_present() -> None:
    x = run_stream(content_stream(["r</think>c"]), mode="reasoning")
    assert (x.reasoning, x.content) == ("", "r</think>c")
    assert x.unread_fields == {"inline": "r"}


# --------------------------------------------------------------------------------------------
# unknown fields


def test_unknown_fields_non_streaming_each_level() -> None:
    b = body({"content": "c", "refusal": "no", "tool_calls": [{"id": "t1", "type": "function"}],
              "custom_msg": {"a": 1}, "nullish": None}, stop_reason="</s>")  # fmt: skip
    b["choices"][0]["stop_reason"] = 7
    b["choices"][0]["logprobs"] = {"content": [{"token": "c", "logprob": -0.1}]}
    b["kv_transfer_params"] = None
    x = extract_response(b)
    assert x.extra == {
        "top": {"stop_reason": "</s>", "kv_transfer_params": None},
        "choice": {"stop_reason": 7, "logprobs": {"content": [{"token": "c", "logprob": -0.1}]}},
        "message": {
            "refusal": "no",
            "tool_calls": [{"id": "t1", "type": "function"}],
            "custom_msg": {"a": 1},
            "nullish": None,
        },
    }


def test_unknown_fields_streaming_each_level() -> None:
    c1 = vllm_chunk({"content": "a", "x_note": "he", "x_obj": {"v": 1}})
    c1["choices"][0]["logprobs"] = {"content": [{"token": "a", "logprob": -1.0}]}
    c1["service_tier"] = "flex"
    c1["x_top"] = None
    call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}
    c2 = vllm_chunk({"content": "b", "x_note": "llo", "x_obj": {"v": 2}, "tool_calls": [call]})
    c2["choices"][0]["logprobs"] = {"content": [{"token": "b", "logprob": -2.0}]}
    c2["service_tier"] = "default"
    c3 = vllm_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, finish="tool_calls",
                    stop_reason=None, custom_choice="z")  # fmt: skip
    acc = StreamAccumulator()
    assert [acc.feed(c) for c in (c1, c2, c3)] == [True, True, True]
    x = acc.result()
    assert x.content == "ab"
    assert x.extra["top"] == {"service_tier": "default", "x_top": None}
    assert x.extra["choice"] == {
        "logprobs": {"content": [{"token": "a", "logprob": -1.0}, {"token": "b", "logprob": -2.0}]},
        "custom_choice": "z",
        "stop_reason": None,
    }
    assert x.extra["delta"] == {
        "x_note": "hello",
        "x_obj": {"v": 2},
        "tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}},
            {"index": 0, "function": {"arguments": "{}"}},
        ],
    }
    assert x.finish_reason == "tool_calls"
    # result() is repeatable and does not share mutable state with the accumulator
    x.extra["delta"]["tool_calls"].clear()
    x.extra["choice"]["logprobs"]["content"].clear()
    again = acc.result()
    assert len(again.extra["delta"]["tool_calls"]) == 2
    assert len(again.extra["choice"]["logprobs"]["content"]) == 2
    # the caller's chunk objects are never modified
    assert c1["choices"][0]["logprobs"] == {"content": [{"token": "a", "logprob": -1.0}]}


# --------------------------------------------------------------------------------------------
# errors and malformed input


def test_error_chunk_sets_error() -> None:
    acc = StreamAccumulator()
    assert acc.feed(_rt(vllm_chunk({"reasoning": "a"}))) is True
    err = {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}
    assert acc.feed(_rt(err)) is False
    assert acc.error == err["error"]
    assert acc.n_chunks == 2
    x = acc.result()
    assert x.reasoning == "a" and x.n_chunks == 2
    assert x.extra == {"choice": {"logprobs": None}}  # nothing from the error object
    acc = StreamAccumulator()
    acc.feed({"error": "boom"})
    assert acc.error == {"message": "boom"}


def test_error_next_to_choices_openrouter_style() -> None:
    chunk = vllm_chunk({"content": ""}, finish="error")
    chunk["error"] = {"code": 502, "message": "Provider returned error"}
    acc = StreamAccumulator()
    acc.feed(_rt(chunk))
    assert acc.error == {"code": 502, "message": "Provider returned error"}
    assert acc.result().finish_reason == "error"


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"error": {"message": "model not found", "code": 404}}, "model not found"),
        ({"error": "overloaded"}, "overloaded"),
        ({"id": "x", "object": "chat.completion"}, "no 'choices'"),
        ({"choices": {"0": {}}}, "not a list"),
        ({"choices": []}, "empty"),
        ({"choices": ["text"]}, "not an object"),
        ({"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}, "text completion"),
        ({"choices": [{"index": 0, "delta": {"content": "hi"}}]}, "stream chunk"),
        ({"choices": [{"index": 0, "message": "hi"}]}, "message is str"),
        ([1, 2], "not a JSON object"),
        (None, "not a JSON object"),
    ],
)
def test_non_streaming_shape_errors(bad: Any, match: str) -> None:
    with pytest.raises(ResponseShapeError, match=match):
        extract_response(bad)
    assert issubclass(ResponseShapeError, ValueError)


def test_non_streaming_field_type_problems_do_not_raise() -> None:
    b = body({"content": 42, "reasoning": ["x"], "reasoning_content": "ok"})
    b["choices"][0]["finish_reason"] = 1
    b["choices"][0]["token_ids"] = "1,2"
    b["usage"] = [1]
    b["id"] = 7
    x = extract_response(b)
    assert x.reasoning == "ok" and x.content == ""
    assert x.finish_reason == "1" and x.response_id == "7"
    assert x.usage is None and x.token_ids is None
    joined = " | ".join(x.problems)
    for what in ("message.content is int", "message.reasoning is list", "finish_reason is int",
                 "token_ids is not a list", "usage is list", "id is int"):  # fmt: skip
        assert what in joined, what


MALFORMED: list[Any] = [
    None,
    "data",
    [1],
    {"choices": "nope"},
    {"choices": None},
    {"object": "chat.completion.chunk"},
    {"choices": [None]},
    {"choices": [{"index": 0, "delta": "text"}]},
    {"choices": [{"index": 0}]},
    {"choices": [{"index": 0, "message": {"content": "x"}}]},
    {"choices": [{"index": 0, "delta": {"content": 5}}]},
    {"choices": [{"index": 0, "delta": {"content": {"t": 1}}}]},
    {"choices": [{"index": 0, "delta": {"reasoning": 3.5}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": ["a"]}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_details": "x"}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_details": [1, {"type": "reasoning.text", "text": 2}]}}]},
    {"choices": [{"index": 0, "delta": {"thinking": 1}}]},
    {"choices": [{"index": 0, "delta": {"content": "ok"}, "token_ids": "12"}]},
    {"choices": [{"index": 0, "delta": {"content": "ok"}, "token_ids": ["a"]}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": 3}]},
    {"choices": [{"index": 0, "delta": {}, "logprobs": [1]}]},
    {"choices": [{"index": 0, "delta": {}}], "usage": "lots", "id": 5, "model": 6, "system_fingerprint": 7},
    {"choices": [{"index": 0, "delta": {}}], "prompt_token_ids": {"a": 1}},
    {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
    {"choices": [{"index": 1, "delta": {"content": "x"}}, {"index": 0, "delta": {"content": "y"}}]},
    {"choices": [1, 2]},
    {"error": None, "choices": []},
]


def test_malformed_chunks_never_raise() -> None:
    acc = StreamAccumulator()
    for m in MALFORMED:
        acc.feed(m)
    x = acc.result()
    assert acc.n_chunks == len(MALFORMED) == x.n_chunks
    assert x.content == "okoky"  # only well-typed index-0 content was kept
    assert x.usage is None and x.token_ids is None and x.prompt_token_ids is None
    assert x.response_id == "5" and x.model == "6" and x.system_fingerprint == "7"
    assert x.finish_reason == "3"
    joined = " | ".join(x.problems)
    for what in ("chunk is null", "chunk is str", "choices is str", "chunk without 'choices'",
                 "delta is str", "delta.content is int", "delta.reasoning is float",
                 "reasoning_details is str", "token_ids is str", "only index 0", "usage is str",
                 "'message' instead of 'delta'", "thinking is int"):  # fmt: skip
        assert what in joined, what
    # every result() is fresh; the accumulator keeps working afterwards
    acc.feed(_rt(vllm_chunk({"content": "!"})))
    assert acc.result().content == "okoky!"


def test_problems_are_deduplicated_and_capped() -> None:
    acc = StreamAccumulator()
    for _ in range(100):
        acc.feed({"choices": "nope"})
    assert acc.problems == ["choices is str, not a list"]
    for i in range(200):
        acc.feed({"choices": [{"index": i + 1, "delta": {}}]})
    probs = acc.problems
    assert len(probs) == 51 and probs[-1].startswith("... ")


def test_mistral_content_parts() -> None:
    msg = {"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "Hmm."}]},
                       {"type": "text", "text": "Answer."}]}  # fmt: skip
    x = extract_response(body(msg))
    assert (x.reasoning, x.content, x.reasoning_source) == ("Hmm.", "Answer.", "thinking")


def test_token_ids_concatenated_and_return_value_for_ttft() -> None:
    acc = StreamAccumulator()
    assert acc.feed(_rt(vllm_chunk({"role": "assistant", "content": ""}, token_ids=None))) is False
    assert acc.feed(_rt(vllm_chunk({"reasoning": ""}, token_ids=[1]))) is False  # empty text
    assert acc.feed(_rt(vllm_chunk({"reasoning": "r"}, token_ids=[2, 3]))) is True
    assert acc.feed(_rt(vllm_chunk({"content": "c"}, token_ids=[4]))) is True
    assert acc.feed(_rt(usage_chunk({"completion_tokens": 4}))) is False
    x = acc.result()
    assert x.token_ids == [1, 2, 3, 4]
    assert x.usage == {"completion_tokens": 4}


def test_empty_stream() -> None:
    x = StreamAccumulator().result()
    assert (x.reasoning, x.content, x.content_was_null, x.reasoning_source) == ("", "", True, "none")
    assert x.n_chunks == 0 and x.finish_reason is None and x.extra == {} and x.problems == []
