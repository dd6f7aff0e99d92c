"""A stream's tail (the in-flight checks' and the live view's read of the text so far) is exactly the last n characters
of what was sent in that field, across the accumulator's compaction every 256 chunks (#36 item 5: tail joins the short
pieces in C and slices the compacted head)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.stream import StreamAccumulator


def _chunk(field: str, text: str) -> dict[str, object]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {field: text}, "finish_reason": None}]}


@given(st.lists(st.tuples(st.sampled_from(["reasoning", "content"]), st.text(max_size=12)), max_size=700),
       st.lists(st.integers(min_value=1, max_value=9000), min_size=1, max_size=4))
def test_tail_is_the_last_characters_sent(deltas: list[tuple[str, str]], sizes: list[int]) -> None:
    acc = StreamAccumulator("auto", "<think>", "</think>", False)
    sent = {"reasoning": "", "content": ""}
    for i, (field, text) in enumerate(deltas):
        acc.feed(_chunk(field, text))
        sent[field] += text
        if i % 97 == 0 or i == len(deltas) - 1:
            for f, whole in sent.items():
                for n in sizes:
                    assert acc.tail(f, n) == whole[-n:]


def test_tail_named_cases() -> None:
    acc = StreamAccumulator("auto", "<think>", "</think>", False)
    assert acc.tail("content", 5) == ""
    for i in range(600):  # two compactions and a partial list after them
        acc.feed(_chunk("content", f"{i % 10}"))
    whole = "".join(f"{i % 10}" for i in range(600))
    for n in (1, 10, 87, 88, 89, 300, 599, 600, 601, 10_000):
        assert acc.tail("content", n) == whole[-n:]
    assert acc.tail("content", 0) == ""
