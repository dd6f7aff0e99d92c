"""Whatever a reply holds, what capture keeps of it can be stored (#25): property tests with Hypothesis.

For any JSON value a server may put in a reply (any shape, huge or negative integers, NUL and other control
characters, nesting up to what orjson parses), a reply is either refused at parse time (nested deeper than
``MAX_JSON_DEPTH``: ``reply_too_deep`` in workers/client.py) or its record columns can be stored by every backend:
no NUL in a text column, every integer column within ``0..MAX_COUNT``, every JSON column valid JSON, and the exact
text of a column that held NUL kept in ``extra_json.nul_text``.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.reasoning import extract_response
from synthwatch.capture.safety import MAX_COUNT, MAX_JSON_DEPTH, depth_over, too_deep
from synthwatch.capture.stream import StreamAccumulator
from synthwatch.workers.series import record_columns

# what orjson.loads gives: integers within [-2^63, 2^64), finite floats, any valid Unicode text
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(st.characters(exclude_categories=("Cs",))))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                                          max_size=3), max_leaves=12)
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40) | st.just("a\u0000b")
counts = st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.integers(0, 10_000) | scalars


def _nest(v: Any, depth: int) -> Any:
    for _ in range(depth):
        v = [v]
    return v


def _assert_storable(cols: dict[str, Any], sent: dict[str, str]) -> None:
    for k, v in cols.items():
        if isinstance(v, str):
            assert "\x00" not in v, k
            if k.endswith("_json"):
                orjson.loads(v)
        elif type(v) is int and k.endswith("_tokens"):
            assert 0 <= v <= MAX_COUNT, (k, v)
    nul = orjson.loads(cols["extra_json"]).get("nul_text", {}) if cols["extra_json"] else {}
    for k, original in sent.items():
        if "\x00" in original:
            assert nul[k] == original  # the reply's exact text, round-tripped through JSON
            assert cols[k] == original.replace("\x00", "\u2400")
        else:
            assert k not in nul


@given(content=texts, reasoning=texts, model=texts, prompt=counts, completion=counts, odd=json_values,
       depth=st.integers(0, MAX_JSON_DEPTH + 40))
def test_a_whole_reply_is_refused_or_storable(content: str, reasoning: str, model: str, prompt: Any,
                                              completion: Any, odd: Any, depth: int) -> None:
    body = {"id": "r", "object": "chat.completion", "model": model, "odd": _nest(odd, depth),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content, "reasoning": reasoning}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    raw = orjson.dumps(body)
    parsed = orjson.loads(raw)
    if too_deep(raw, parsed):
        assert depth_over(parsed)
        return
    cols = record_columns(extract_response(parsed, "reasoning"))
    _assert_storable(cols, {"content": content, "model": model})
    if type(prompt) is int and not 0 <= prompt <= MAX_COUNT:
        problems = orjson.loads(cols["extra_json"])["problems"]
        assert any(p.startswith(f"usage.prompt_tokens = {prompt} is impossible") for p in problems)


@given(content=texts, odd=json_values, depth=st.integers(0, MAX_JSON_DEPTH + 40), prompt=counts)
def test_a_streamed_reply_is_refused_or_storable(content: str, odd: Any, depth: int, prompt: Any) -> None:
    acc = StreamAccumulator("reasoning")
    chunks = [{"id": "r", "choices": [{"index": 0, "delta": {"content": content, "odd": _nest(odd, depth)}}]},
              {"id": "r", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {"id": "r", "choices": [], "usage": {"prompt_tokens": prompt}}]
    for chunk in chunks:
        raw = orjson.dumps(chunk)
        parsed = orjson.loads(raw)
        if too_deep(raw, parsed):
            return  # the client ends the attempt here: reply_too_deep
        acc.feed(parsed)
    _assert_storable(record_columns(acc.result()), {"content": content})


def test_the_depth_limit_leaves_room_for_what_wraps_a_stored_value() -> None:
    """The deepest value capture accepts, inside the deepest wrapper the store puts around one, still serialises."""
    v = _nest("x", MAX_JSON_DEPTH - 1)
    assert not depth_over(v) and depth_over([v, [v]])
    orjson.dumps({"turns": [{"extra": {"delta": {"odd": v}}}]})
