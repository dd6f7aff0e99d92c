"""n choices in one reply (#38 item 4): each choice read exactly as a reply of its own would be.

Property: whatever the choices' texts and however a server interleaves their chunks, demultiplexing gives for each
choice what a stream of that choice alone gives (text, reasoning, finish reason, token ids), and its own usage."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.choices import ChoiceStreams, split_response
from synthwatch.capture.reasoning import extract_response
from synthwatch.capture.stream import StreamAccumulator

TOP = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

pieces = st.lists(st.tuples(st.sampled_from(["reasoning", "content"]), st.text(max_size=12),
                            st.lists(st.integers(0, 200_000), max_size=3)), max_size=12)
choice = st.tuples(pieces, st.sampled_from(["stop", "length", "tool_calls"]))


def chunks_of(i: int, ps: list[tuple[str, str, list[int]]], finish: str) -> list[dict[str, Any]]:
    out = [{**TOP, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]}]
    for key, text, ids in ps:
        out.append({**TOP, "choices": [{"index": i, "delta": {key: text}, "logprobs": None, "finish_reason": None,
                                        "token_ids": ids}]})
    out.append({**TOP, "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish,
                                    "token_ids": []}]})
    return out


def alone(chunks: list[dict[str, Any]]) -> Any:
    acc = StreamAccumulator()
    for c in chunks:
        acc.feed({**c, "choices": [{**c["choices"][0], "index": 0}]})
    return acc.result()


@given(st.lists(choice, min_size=2, max_size=5), st.randoms(use_true_random=False), st.booleans())
def test_interleaved_choices_come_apart_as_if_each_were_alone(choices, rnd, batched) -> None:  # type: ignore[no-untyped-def]
    streams = [chunks_of(i, ps, fin) for i, (ps, fin) in enumerate(choices)]
    # any interleaving that keeps each choice's own order (a server's steps), sometimes several choices per chunk
    queues = [list(s) for s in streams]
    merged: list[dict[str, Any]] = []
    while any(queues):
        live = [q for q in queues if q]
        if batched and len(live) > 1 and rnd.random() < 0.3:
            both = [live[0].pop(0), live[1].pop(0)]
            merged.append({**TOP, "choices": [both[0]["choices"][0], both[1]["choices"][0]]})
        else:
            merged.append(rnd.choice(live).pop(0))
    total_ids = sum(len(ids) for ps, _ in choices for _, _, ids in ps)
    merged.append({**TOP, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": total_ids,
                                                   "total_tokens": 7 + total_ids}})
    demux = ChoiceStreams(StreamAccumulator, len(choices))
    for c in merged:
        demux.feed(c)
    got = demux.results()
    assert [i for i, _ in got] == list(range(len(choices)))
    assert demux.finish_reason is not None and demux.error is None
    for (i, ex), s in zip(got, streams, strict=True):
        want = alone(s)
        assert (ex.reasoning, ex.content, ex.finish_reason, ex.token_ids) == (
            want.reasoning, want.content, want.finish_reason, want.token_ids), i
        assert ex.usage == {"prompt_tokens": 7, "completion_tokens": len(want.token_ids or []),
                            "total_tokens": 7 + len(want.token_ids or [])}
        assert ex.extra["top"]["choice_index"] == i and ex.extra["top"]["request_usage"]["prompt_tokens"] == 7


def test_a_stream_that_ends_before_a_choice_finishes_is_unfinished() -> None:
    demux = ChoiceStreams(StreamAccumulator, 2)
    for c in chunks_of(0, [("content", "a", [1])], "stop") + chunks_of(1, [("content", "b", [2])], "stop")[:-1]:
        demux.feed(c)
    assert demux.finish_reason is None  # choice 1 never finished: the client records the stream as dropped


def test_a_whole_reply_splits_into_one_reply_per_choice() -> None:
    body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 1, "message": {"role": "assistant", "content": "two"}, "finish_reason": "length"},
                        {"index": 0, "message": {"role": "assistant", "content": "one"}, "finish_reason": "stop"},
                        {"index": 7, "message": {"role": "assistant", "content": "bad"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}
    parts = split_response(body)
    assert [i for i, _ in parts] == [0, 1]  # index 7 of 3 choices is nobody's: dropped
    read = [extract_response(b) for _, b in parts]
    assert [(e.content, e.finish_reason) for e in read] == [("one", "stop"), ("two", "length")]
    assert all("usage" not in b and b["choices"][0]["index"] == 0 for _, b in parts)
