"""Property-based: hostile logprobs (#38 item 5), next to the reply fuzzers (test_fuzz_capture, test_fuzz_replies).

- The packer alone (capture/logprobs.py): any ``choices[0].logprobs`` value (NaN, infinities, wrong types, huge
  arrays, entries that do not match the completion's ids) with any completion ids and any size bound gives a
  column (or none) and problems, never an exception; the column is within its bound, reads back, and holds no more
  tokens than were sent.
- Through the real worker (tests/hostileserver.py serving a reply whose logprobs are drawn the same way, streamed
  or not, to one record of a run that asked for logprobs): the worker stays whole as in test_fuzz_replies
  (every record final, the two valid ones ok, nothing escapes, the dashboard reads it all back), and the hostile
  record's logprobs column reads back or is empty, with any problem recorded on the record.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthwatch.capture.logprobs import MAX_TOP, pack, unpack
from tests.fuzzkit import GOOD_CHUNK, PHASES, Event, Wire, dump, examples, spend, stream_body, values
from tests.test_fuzz_replies import Rig, run_one

_floats = st.one_of(st.floats(max_value=0.0, allow_nan=False), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([-9999.0, -1e300, 0.0, -0.0, 1.5]), st.integers(-10**30, 10**30))
_tokens = st.one_of(st.text(max_size=8), st.builds(lambda i: f"token_id:{i}", st.integers(-5, 2**40)),
                    st.sampled_from(["token_id:", "token_id:x", "token_id:０", "\ud800", "\x00", "a" * 300]))


def _often_bad(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, good, good, values)


_alt = st.fixed_dictionaries({"token": _often_bad(_tokens), "logprob": _often_bad(_floats)},
                             optional={"bytes": values})
_entry = st.fixed_dictionaries(
    {"token": _often_bad(_tokens), "logprob": _often_bad(_floats)},
    optional={"bytes": values, "top_logprobs": _often_bad(st.lists(_often_bad(_alt), max_size=MAX_TOP + 3))})
# a huge array that still fits the fuzz run's reply limits (event 1 MiB, body 4 MiB): the packer's own bound is
# drawn small in the pure test above
_HUGE = {"content": [{"token": "token_id:7", "logprob": -0.25, "top_logprobs": [{"token": "a", "logprob": -1.0}]}]
         * 8_000}
logprobs_values = st.one_of(
    st.fixed_dictionaries({"content": st.lists(_often_bad(_entry), max_size=40)}),
    st.fixed_dictionaries({"content": values}),
    values,
    st.just(_HUGE),
)
_ids = st.one_of(st.none(), st.lists(st.integers(0, 200_000), max_size=45), st.lists(st.integers(), max_size=5))


@settings(max_examples=examples(ci=200), phases=PHASES, deadline=None)
@given(lp=logprobs_values, ids=_ids, max_bytes=st.sampled_from([0, 100, 700, 5000, 4 * 2**20]))
def test_any_logprobs_pack_or_are_a_recorded_problem(lp: Any, ids: list[int] | None, max_bytes: int) -> None:
    spend("test_any_logprobs_pack_or_are_a_recorded_problem")
    column, problems = pack(lp, ids, max_bytes)
    assert all(type(p) is str and len(p) < 300 for p in problems) and len(problems) <= 10
    if column is None:
        return
    assert len(column) <= max(max_bytes, 0) + 200, len(column)  # the bound, with the object's own few keys
    orjson.loads(column)  # storable JSON: no lone surrogate, no NaN literal
    got = unpack(column)
    assert got is not None
    sent = lp["content"] if isinstance(lp, dict) and isinstance(lp.get("content"), list) else []
    assert len(got.ids) + got.dropped == len(sent) and len(got.ids) == len(got.lp) == len(got.top_ids)
    assert all(math.isnan(v) or v <= 0.0 for v in got.lp)
    assert all(len(t) <= MAX_TOP for t in got.top_ids)


# ------------------------------------------------------------------------------ through the real worker

_names = itertools.count()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("fuzz-logprobs"))
    yield r
    r.close()


def _wire(stream: bool, lp: Any) -> Wire:
    if stream:
        chunk = {**GOOD_CHUNK, "choices": [{**GOOD_CHUNK["choices"][0], "logprobs": lp}]}
        return Wire(True, stream_body([Event(chunk), Event(chunk)], "finish+done", 1))
    doc = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer."},
                        "logprobs": lp, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    return Wire(False, dump(doc), ctype="application/json", framing="length")


def _check(rig: Rig, stream: bool, lp: Any) -> dict[str, Any]:
    hostile = run_one(rig, _wire(stream, lp))
    if hostile["status"] == "ok":
        got = unpack(hostile["logprobs_json"])  # reads back, or there is none
        extra = json.loads(hostile["extra_json"] or "{}")
        # packed, not kept as sent (a null is kept: which keys a server sends identifies it)
        assert (extra.get("choice") or {}).get("logprobs") is None, "logprobs are packed, not kept as sent"
        if got is not None and got.dropped:
            assert any("max_logprobs_bytes" in p for p in extra.get("problems", []))
    return hostile


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("case", ["nan", "types", "huge", "mismatch"])
def test_named_hostile_logprobs(rig: Rig, stream: bool, case: str) -> None:
    lp = {
        # JSON has no NaN literal (a chunk holding one is a malformed reply, recorded as such): "NaN" as a string,
        # and a positive logprob, are what a server can send
        "nan": {"content": [{"token": "a", "logprob": "NaN", "top_logprobs": [{"token": "b", "logprob": 3}]}]},
        "types": {"content": [{"token": 5, "logprob": "x", "top_logprobs": "no"}, None, [1]]},
        "huge": _HUGE,
        "mismatch": {"content": [{"token": "token_id:9", "logprob": -1.0}] * 7},
    }[case]
    hostile = _check(rig, stream, lp)
    assert hostile["status"] == "ok", (hostile["error_kind"], hostile["error"])  # bad logprobs never fail a record
    got = unpack(hostile["logprobs_json"])
    problems = json.loads(hostile["extra_json"] or "{}").get("problems", [])
    sent = len(lp["content"]) * (2 if stream else 1)  # streamed: both chunks carry them
    assert got is not None and len(got.ids) == sent
    if case == "nan":
        assert math.isnan(got.lp[0]) and math.isnan(got.top_lp[0][0])
        assert any("not a number" in p for p in problems) and any("NaN or above 0" in p for p in problems)
    if case == "types":
        assert any("not a string" in p for p in problems) and any("not an object" in p for p in problems)
    if case == "huge":
        assert got.k == 1 and got.ids[-1] == 7


@pytest.mark.slow
@settings(max_examples=examples(ci=20), phases=PHASES, deadline=None)
@given(stream=st.booleans(), lp=logprobs_values.filter(lambda v: v is not _HUGE))
def test_any_logprobs_leave_the_worker_whole(rig: Rig, stream: bool, lp: Any) -> None:
    spend("test_any_logprobs_leave_the_worker_whole")
    _check(rig, stream, lp)

