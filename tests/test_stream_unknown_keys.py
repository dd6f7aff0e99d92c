"""Unknown top-level keys repeated in every chunk of a stream (OpenAI's ``service_tier`` and ``obfuscation``,
vLLM's ``prompt_text``, a router's ``provider``): StreamAccumulator reads only those keys' values once it has seen
the layout (#25); what it keeps must stay what it kept before: each key's last non-null value, or null if it only
ever came as null, and an ``error`` key is never cached away."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.stream import StreamAccumulator

UNKNOWN = ("service_tier", "obfuscation", "provider")


def _chunk(text: str, **top: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}], **top}


def test_openai_style_repeated_keys_keep_their_last_value() -> None:
    acc = StreamAccumulator()
    acc.feed(_chunk("a", service_tier="default", obfuscation="x1"))
    acc.feed(_chunk("b", service_tier="default", obfuscation="x2"))
    acc.feed(_chunk("c", service_tier=None, obfuscation="x3"))  # same layout, a null: the last value stays
    acc.feed(_chunk("d", service_tier="flex", obfuscation="x4", provider="p"))  # a new key: a new layout
    acc.feed(_chunk("e", service_tier="flex", obfuscation="x5", provider=None))
    x = acc.result()
    assert x.content == "abcde" and x.problems == []
    assert x.extra["top"] == {"service_tier": "flex", "obfuscation": "x5", "provider": "p"}


def test_an_error_in_a_repeated_layout_is_still_seen() -> None:
    acc = StreamAccumulator()
    acc.feed(_chunk("a", obfuscation="x1"))
    acc.feed(_chunk("b", obfuscation="x2"))
    assert acc.error is None
    acc.feed(_chunk("c", obfuscation="x3", error={"message": "overloaded"}))
    assert acc.error == {"message": "overloaded"}


_values = st.sampled_from([None, "v1", "v2", 7])
_layout = st.dictionaries(st.sampled_from(UNKNOWN), _values, max_size=3)


@given(st.lists(st.tuples(_layout, st.booleans()), min_size=1, max_size=12))
def test_unknown_keys_are_kept_as_the_last_non_null_value(chunks: list[tuple[dict[str, Any], bool]]) -> None:
    acc = StreamAccumulator()
    expected: dict[str, Any] = {}
    error_seen = False
    for top, error in chunks:
        extra = dict(top)
        if error:
            extra["error"] = {"message": "e"}
            error_seen = True
        acc.feed(_chunk("t", **extra))
        for k, v in top.items():
            if v is not None or k not in expected:
                expected[k] = v
    x = acc.result()
    assert x.extra.get("top", {}) == expected
    assert (acc.error is not None) == error_seen
    assert x.content == "t" * len(chunks)
