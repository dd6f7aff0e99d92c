"""Property-based: the capture layer alone (capture/reasoning.py, capture/stream.py, workers/sse.py) (#25 item 7).

- Any sequence of chunk payloads (JSON of any shape, including text that is not JSON) gives an Extracted or a
  recorded error (the client's "malformed"), never an exception, and every text field of it is a ``str``.
- Any whole-response body gives an Extracted or a ResponseShapeError (the client records it), nothing else.
- The SSE parser returns the same events whatever pieces the bytes arrive in, and gives back each event's data.
- The same answer read from a stream (any split of its texts into deltas) and from a whole response agrees: the
  reasoning, its source, the content, the fields left unread or duplicated, finish reason, usage, id and model.

Pure functions, no I/O: hundreds of examples in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthwatch.capture.reasoning import MODES, Extracted, ResponseShapeError, extract_response
from synthwatch.capture.stream import StreamAccumulator
from synthwatch.workers.sse import SSEParser
from tests.fuzzkit import (
    PHASES,
    chunk_obj,
    completion_obj,
    dump,
    events,
    examples,
    load_regression,
    payloads,
    regression_files,
    save_regression,
    spend,
    values,
)

PAYLOADS = st.lists(st.one_of(chunk_obj, payloads, values), max_size=10)


def _parse(v: Any) -> tuple[bool, Any]:
    """What the client does with an event's data: orjson, or a recorded "malformed"."""
    try:
        return True, orjson.loads(dump(v))
    except orjson.JSONDecodeError:
        return False, None


def _assert_well_formed(ex: Extracted) -> None:
    assert isinstance(ex, Extracted)
    for name in ("reasoning", "content", "reasoning_source"):
        assert type(getattr(ex, name)) is str, name
    for name in ("finish_reason", "response_id", "model", "system_fingerprint", "raw_content"):
        assert getattr(ex, name) is None or type(getattr(ex, name)) is str, name
    assert ex.usage is None or type(ex.usage) is dict
    assert all(type(k) is str and type(v) is str for k, v in ex.unread_fields.items())
    assert all(type(p) is str for p in ex.problems)
    for ids in (ex.token_ids, ex.prompt_token_ids):
        assert ids is None or all(type(i) is int for i in ids)


def check_chunks(chunks: list[Any], mode: str) -> None:
    acc = StreamAccumulator(mode)
    for v in chunks:
        ok, parsed = _parse(v)
        if not ok:
            return  # the client records "malformed" and stops reading
        acc.feed(parsed)
        _assert_well_formed(acc.result())  # a failed attempt keeps the partial text: any point is a result
    _assert_well_formed(acc.result())


def check_whole(body: Any, mode: str) -> None:
    ok, parsed = _parse(body)
    if not ok:
        return
    try:
        ex = extract_response(parsed, mode)
    except ResponseShapeError as exc:
        assert str(exc)
        return
    _assert_well_formed(ex)


def _property(suite: str, check: Any, **args: Any) -> None:
    spend(suite, share=0.25)  # four tests share the file's time under ./dev fuzz
    try:
        check(**args)
    except BaseException as exc:
        save_regression(suite, args, exc)
        raise


@pytest.mark.slow  # 7-25 s for 300 examples here
@settings(max_examples=examples(ci=300), phases=PHASES)
@given(chunks=PAYLOADS, mode=st.sampled_from(MODES))
def test_any_chunks_give_an_extracted_or_a_recorded_error(chunks: list[Any], mode: str) -> None:
    _property("capture_chunks", check_chunks, chunks=chunks, mode=mode)


@pytest.mark.slow  # 7-25 s for 300 examples here
@settings(max_examples=examples(ci=300), phases=PHASES)
@given(body=st.one_of(completion_obj, values), mode=st.sampled_from(MODES))
def test_any_whole_body_gives_an_extracted_or_a_shape_error(body: Any, mode: str) -> None:
    _property("capture_whole", check_whole, body=body, mode=mode)


def check_sse(data: bytes, cuts: list[int]) -> list[bytes]:
    whole = SSEParser()
    expected = whole.feed(data) + whole.flush()
    pieces = SSEParser()
    got: list[bytes] = []
    points = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    for a, b in zip(points, points[1:], strict=False):
        got += pieces.feed(data[a:b])
    got += pieces.flush()
    assert got == expected
    assert pieces.pending() == whole.pending()
    return got


@pytest.mark.slow  # 7-25 s for 300 examples here
@settings(max_examples=examples(ci=300), phases=PHASES)
@given(evs=st.lists(events, max_size=8), junk=st.binary(max_size=64), cuts=st.lists(st.integers(0, 1 << 16)))
def test_sse_events_do_not_depend_on_how_the_bytes_arrive(evs: list[Any], junk: bytes, cuts: list[int]) -> None:
    data = b"".join(e.encode() for e in evs) + junk
    spend("capture_sse", share=0.25)
    try:
        got = check_sse(data, cuts)
    except BaseException as exc:
        save_regression("capture_sse", {"data": data, "cuts": cuts}, exc)
        raise
    # an event whose data holds no line break comes back exactly (after a BOM only at the very start)
    if not junk and evs and all(b"\n" not in dump(e.payload) and b"\r" not in dump(e.payload) for e in evs):
        want = []
        for e in evs:
            if e.before.startswith(b"\xef\xbb\xbf") and e is not evs[0]:
                want = None  # a BOM later in the stream is an unknown field line: the event is not plain any more
                break
            # "data:" then one optional space: a second space is part of the data
            want.append((b" " if e.prefix == b"data:  " else b"") + dump(e.payload, e.ascii_only))
        if want is not None:
            assert got == want


# ------------------------------------------------------------------------------ streamed vs whole: the same answer

think_text = st.one_of(st.text(max_size=40), st.builds("<think>{}</think>{}".format, st.text(max_size=20),
                                                        st.text(max_size=20)),
                       st.builds("{}</think>\n\n{}".format, st.text(max_size=20), st.text(max_size=20)))
answers = st.fixed_dictionaries({"content": think_text}, optional={
    "reasoning": st.text(max_size=40), "reasoning_content": st.text(max_size=40), "thinking": st.text(max_size=40),
    "reasoning_details": st.lists(st.text(max_size=20), max_size=3),
})
tops = st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=10), "model": st.text(max_size=10),
    "usage": st.fixed_dictionaries({"prompt_tokens": st.integers(0, 10**6), "completion_tokens": st.integers(0, 10**6)}),
})


def _split(s: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted({c % (len(s) + 1) for c in cuts}), len(s)]
    return [s[a:b] for a, b in zip(points, points[1:], strict=False)]


def _details(items: list[str]) -> list[dict[str, str]]:
    return [{"type": "reasoning.text", "text": t} for t in items]


def check_agree(answer: dict[str, Any], top: dict[str, Any], finish: str | None, mode: str, cuts: list[int],
                prefilled: bool) -> None:
    message = {"role": "assistant", **answer}
    if "reasoning_details" in message:
        message["reasoning_details"] = _details(message["reasoning_details"])
    whole = {"object": "chat.completion", **{k: v for k, v in top.items()},
             "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    w = extract_response(whole, mode, prefilled_open=prefilled)

    acc = StreamAccumulator(mode, prefilled_open=prefilled)
    base = {"object": "chat.completion.chunk", **{k: v for k, v in top.items() if k != "usage"}}
    acc.feed({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    for key, value in answer.items():
        parts = [[item] for item in value] if key == "reasoning_details" else _split(value, cuts)
        for part in parts:
            d = _details(part) if key == "reasoning_details" else part
            acc.feed({**base, "choices": [{"index": 0, "delta": {key: d}, "finish_reason": None}]})
    acc.feed({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if "usage" in top:
        acc.feed({**base, "choices": [], "usage": top["usage"]})
    s = acc.result()

    for name in ("reasoning", "content", "reasoning_source", "unread_fields", "duplicate_fields", "finish_reason",
                 "usage", "response_id", "model", "raw_content", "content_was_null"):
        assert getattr(s, name) == getattr(w, name), (name, getattr(s, name), getattr(w, name))


@settings(max_examples=examples(ci=300), phases=PHASES)
@given(answer=answers, top=tops, finish=st.sampled_from(["stop", "length", None]), mode=st.sampled_from(MODES),
       cuts=st.lists(st.integers(0, 200), max_size=6), prefilled=st.booleans())
def test_streamed_and_whole_readings_agree(answer: dict[str, Any], top: dict[str, Any], finish: str | None, mode: str,
                                           cuts: list[int], prefilled: bool) -> None:
    _property("capture_agree", check_agree, answer=answer, top=top, finish=finish, mode=mode, cuts=cuts,
              prefilled=prefilled)


CHECKS = {"capture_chunks": check_chunks, "capture_whole": check_whole, "capture_sse": check_sse,
          "capture_agree": check_agree}


SAVED = [p for suite in CHECKS for p in regression_files(suite)]
if SAVED:  # the replay exists once ./dev fuzz has saved a case (no quiet empty-set skip)

    @pytest.mark.parametrize("path", SAVED, ids=lambda p: p.stem)
    def test_regression(path: Path, request: pytest.FixtureRequest) -> None:
        """Each saved falsifying example (tests/fuzz_regressions/capture_*.json) replayed through its property."""
        CHECKS[path.stem.rsplit("-", 1)[0]](**load_regression(path, request))
