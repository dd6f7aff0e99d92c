"""The in-flight judges (#36) agree with the finished-record checks: drawn streams fed chunk by chunk through the
real accumulator, judged as they go, then checked whole by RecordChecker (named cases first, then Hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.stream import StreamAccumulator
from synthwatch.check_catalog import CheckSettings
from synthwatch.quality.checks import RecordChecker, RecordView, RunContext
from synthwatch.quality.inflight import FIRST_DELTAS, JudgeRules, StreamJudge

FIELD_MODES = ("reasoning", "reasoning_content")


def chunk(key: str | None, text: str) -> dict[str, Any]:
    value: Any = [{"type": "reasoning.text", "text": text}] if key == "reasoning_details" else text
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {key: value} if key else {}, "finish_reason": None}]}


def judge_stream(mode: str, deltas: list[tuple[str, str]], expects: bool = True,
                 checks: CheckSettings | None = None) -> tuple[list[Any], set[str]]:
    """(the verdicts the judge gave while the stream ran, the checks the finished record fails)."""
    checks = checks or CheckSettings.model_validate({})
    acc = StreamAccumulator(mode)
    rules = JudgeRules(mode=mode, expects=expects, disabled=frozenset(checks.disabled),
                       repetition_min_chars=checks.repetition_min_chars,
                       repetition_min_repeats=checks.repetition_min_repeats,
                       repetition_tail_chars=checks.repetition_tail_chars)
    judge = StreamJudge(7, "ep", rules)
    got: list[Any] = []
    for key, text in deltas:
        acc.feed(chunk(key, text))
        got += judge.observe(acc) or []
    ex = acc.result()
    checker = RecordChecker(RunContext(1, "r", expects=expects, mode=mode, settings=checks))
    view = RecordView(7, 0, "ok", ex.reasoning, ex.content, "stop", None, None, ex.unread_fields)
    _applied, _failed, det = checker.check(view)
    return got, set(det)


def failed_names(mode: str, deltas: list[tuple[str, str]]) -> set[str]:
    from synthwatch.check_catalog import BIT
    acc = StreamAccumulator(mode)
    for key, text in deltas:
        acc.feed(chunk(key, text))
    ex = acc.result()
    checker = RecordChecker(RunContext(1, "r", mode=mode))
    _a, failed, _d = checker.check(RecordView(7, 0, "ok", ex.reasoning, ex.content, "stop", None, None,
                                              ex.unread_fields))
    return {n for n, b in BIT.items() if failed & b}


def test_mismatch_from_the_first_reasoning_delta() -> None:
    deltas = [("role", "assistant"), ("reasoning", "Let me think"), *[("reasoning", " more")] * 100,
              ("content", "42")]
    got, _ = judge_stream("reasoning_content", deltas)
    [v] = got
    assert v.check == "field_mismatch" and v.delta == 5 and v.detail["fields"] == ["reasoning"]
    assert v.excerpt == "Let me think more more more" and v.evidence()["record_id"] == 7
    assert "field_mismatch" in failed_names("reasoning_content", deltas)


def test_a_second_field_a_delta_later_is_no_mismatch() -> None:
    """OpenRouter sends `reasoning` and `reasoning_details`: the field read may come a delta after the other."""
    deltas = [("reasoning", "Let me"), ("reasoning_details", "Let me"), *[("reasoning", " go")] * 10]
    assert judge_stream("reasoning_details", deltas)[0] == []
    assert "field_mismatch" not in failed_names("reasoning_details", deltas)
    assert "field_mismatch" in failed_names("reasoning_content", deltas)


def test_no_reasoning_from_the_first_content_delta_and_after_16_in_auto() -> None:
    deltas = [("content", "The answer")] + [("content", f" is {i}") for i in range(40)]
    [v] = judge_stream("reasoning", deltas)[0]
    assert v.check == "empty_reasoning" and v.delta == 1
    [v] = judge_stream("auto", deltas)[0]
    assert v.check == "empty_reasoning" and v.delta == 16
    assert judge_stream("reasoning", deltas, expects=False)[0] == []


def test_healthy_stream_and_inline_reasoning_give_no_verdict() -> None:
    healthy = [("reasoning", f"step {i} ") for i in range(80)] + [("content", f"part {i} ") for i in range(80)]
    assert judge_stream("reasoning", healthy)[0] == []
    assert judge_stream("auto", healthy)[0] == []
    inline = [("content", "<think>"), *[("content", f"hmm {i} ") for i in range(30)], ("content", "</think>"),
              ("content", "42")]
    assert judge_stream("auto", inline)[0] == []


def test_think_tags_and_leaked_template_text() -> None:
    got, _ = judge_stream("reasoning", [("reasoning", "r"), ("content", "a </think> b")])
    assert [v.check for v in got] == ["think_tags_in_content"] and got[0].detail["tags"] == ["</think>"]
    got, _ = judge_stream("reasoning", [("reasoning", "r"), ("content", "42<|im_end|>")])
    assert [v.check for v in got] == ["think_tags_in_content"] and got[0].detail["leaked"] == ["<|im_end|>"]


def test_looping_with_the_finished_checks_detector() -> None:
    loop = [("reasoning", "I will check this again. ")] * 200
    got, _ = judge_stream("reasoning", loop)
    [v] = got
    assert v.check == "repetition" and v.delta == 64 and v.detail["period_chars"] == len("I will check this again. ")
    assert "repetition" in failed_names("reasoning", loop)
    assert judge_stream("reasoning", loop, checks=CheckSettings.model_validate({"disabled": ["repetition"]}))[0] == []


words = st.sampled_from(["a", "b ", "think ", "\n", " ", "<think>", "</think>", "42", "x" * 30])


@st.composite
def streams(draw: Any) -> tuple[str, list[tuple[str, str]]]:
    """A stream as servers send one: reasoning (in one field, or none) first, then content."""
    mode = draw(st.sampled_from(FIELD_MODES))
    field = draw(st.sampled_from([None, "reasoning", "reasoning_content", "thinking"]))
    reasoning = draw(st.lists(words, max_size=30)) if field else []
    content = draw(st.lists(words, max_size=30))
    return mode, [(field, w) for w in reasoning if field] + [("content", w) for w in content]


@given(streams())
def test_an_early_verdict_is_the_finished_records(drawn: tuple[str, list[tuple[str, str]]]) -> None:
    """A field mismatch or no reasoning said in flight is what the whole record says too (field modes); each
    check is said at most once per stream, within the first deltas or at the loop detector's cadence."""
    mode, deltas = drawn
    got, _ = judge_stream(mode, deltas)
    final = failed_names(mode, deltas)
    names = [v.check for v in got]
    assert len(names) == len(set(names))
    for v in got:
        assert 1 <= v.delta <= max(len(deltas), 1)
        if v.check in ("field_mismatch", "empty_reasoning"):
            assert v.delta <= FIRST_DELTAS
            assert v.check in final or ("field_mismatch" in final and v.check == "empty_reasoning"), (v, final)
