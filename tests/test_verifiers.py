"""Verifiers and the check processes on their own (#30): named cases, then generated inputs that must never
escape as an exception or take the check process down."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthwatch.check_catalog import CheckSettings
from synthwatch.check_extended import VerifierSettings
from synthwatch.quality.check_pool import CheckProcess, PoolCheck, pool_checks_budget, run_check, view_args
from synthwatch.quality.checks import RecordView
from synthwatch.quality.user_checks import coerce
from synthwatch.quality.verdicts import REASON_MAX, STATES, Verdict
from synthwatch.quality.verifiers import choice_letter, make_verifier


def view(content: str, idx: int = 0) -> RecordView:
    return RecordView(1, idx, "ok", "thinking", content)


def verdict(kind: str, content: str, ref: object, **kw: object) -> Verdict:
    check = make_verifier(VerifierSettings.model_validate({"kind": kind, "reference": "ref", **kw}))
    return check(view(content), {"ref": ref})


@pytest.mark.parametrize(("content", "ref", "state"), [
    ("The answer is $\\boxed{42}$.", "42", "pass"),
    ("so x = \\boxed{\\frac{2}{4}}", "1/2", "pass"),
    ("\\boxed{\\sqrt{4}}", 2, "pass"),
    ("The answer is \\boxed{41}.", "42", "fail"),
    ("no number at all", "42", "fail"),
])
def test_math(content: str, ref: object, state: str) -> None:
    assert verdict("math", content, ref).state == state


@pytest.mark.parametrize(("kind", "content", "ref", "kw", "state"), [
    ("exact", "  Paris ", "paris", {}, "pass"),
    ("exact", "Paris", "paris", {"case_sensitive": True}, "fail"),
    ("exact", "The answer is **12**. Working: 5 + 7 = 12", "12", {"answer_regex": r"\*\*(\d+)\*\*"}, "pass"),
    ("regex", "It is 3.14159", r"3\.14\d*", {}, "pass"),
    ("regex", "whatever", "(unclosed", {}, "error"),
    ("choice", "After thinking, the answer is (C).", "C", {}, "pass"),
    ("choice", "\\boxed{D}", "B) the second one", {}, "fail"),
    ("choice", "I am not sure.", "A", {}, "fail"),
    ("json_schema", '{"a": 1}', {"type": "object", "required": ["a"]}, {}, "pass"),
    ("json_schema", '{"a": "x"}', '{"properties": {"a": {"type": "integer"}}}', {}, "fail"),
    ("json_schema", "not json", {"type": "object"}, {}, "fail"),
    ("json_schema", "{}", {"type": "no-such-type"}, {}, "error"),
])
def test_named_cases(kind: str, content: str, ref: object, kw: dict[str, object], state: str) -> None:
    assert verdict(kind, content, ref, **kw).state == state


def test_missing_reference_is_an_error_not_a_failure() -> None:
    check = make_verifier(VerifierSettings.model_validate({"kind": "exact", "reference": "gold.answer"}))
    assert check(view("x"), {"gold": {"answer": "x"}}).state == "pass"  # dotted paths reach nested fields
    v = check(view("x"), {"other": 1})
    assert v.state == "error" and "gold.answer" in (v.reason or "")


def test_choice_letter() -> None:
    assert choice_letter("Answer: b") == "B"
    assert choice_letter("(A) is wrong, the answer is (D)") == "D"
    assert choice_letter("nothing here") is None


def test_coerce_shapes() -> None:
    assert coerce(True).state == "pass" and coerce((False, "why")).reason == "why"
    assert coerce({"state": "fail", "score": 0.2, "label": 3}) == Verdict("fail", 0.2, "3", None)
    assert coerce(None).state == "error" and coerce("yes").state == "error"


KINDS = ["math", "exact", "regex", "choice", "json_schema"]
texts = st.text(max_size=300) | st.sampled_from(["\\boxed{", "$$", "\\frac{1}{0}", "{", "((((a*)*)*)*", "[1,2",
                                                   "\\boxed{\\boxed{x}}", "1/0", "null"])
refs = texts | st.integers() | st.floats(allow_nan=True) | st.none() | st.booleans() | st.dictionaries(
    st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3) | st.lists(st.integers(), max_size=3)


@settings(deadline=None, max_examples=60)
@given(st.sampled_from(KINDS), texts, refs)
def test_generated_inputs_never_escape_a_verifier(kind: str, content: str, ref: object) -> None:
    """run_check is what the check process runs per check: whatever the model wrote and the dataset holds, the
    result is a verdict, bounded, and no exception leaves it."""
    s = VerifierSettings.model_validate({"kind": kind, "reference": "ref", "timeout_s": 3})
    c = PoolCheck(s.check_name, make_verifier(s), s.timeout_s, own_timer=kind != "math")
    name, state, _score, label, reason, ms = run_check(c, view(content), {"ref": ref})
    assert name == s.check_name and state in STATES and ms >= 0
    assert reason is None or isinstance(reason, str) and len(reason) <= REASON_MAX + 20
    assert label is None or isinstance(label, str)


# ------------------------------------------------------------------------------------ the process itself


def test_a_process_that_dies_or_hangs_is_restarted_and_the_record_gets_errors(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "swtest_hard.py").write_text(textwrap.dedent(f'''
        import os, signal, time

        def hard(record):
            if record.idx == 1:
                os.kill(os.getpid(), {int(signal.SIGKILL)})  # the interpreter dies
            if record.idx == 2:
                signal.signal(signal.SIGALRM, signal.SIG_IGN)  # its own budget cannot stop it now
                time.sleep(60)
            return True
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    settings_ = CheckSettings.model_validate({"user": [{"name": "hard", "function": "swtest_hard:hard",
                                                        "timeout_s": 0.3}]})
    proc = CheckProcess(settings_, ["user:hard"], budget_s=0.3)
    try:
        items = [(10 + i, (10 + i, i, "ok", "", "answer", None, None, None, {}, None, None, None, None, None),
                  {}) for i in range(5)]
        out = dict(proc.run(items))
    finally:
        proc.close()
    assert sorted(out) == [10, 11, 12, 13, 14]
    states = {rid: res[0][1] for rid, res in out.items()}
    assert states == {10: "pass", 11: "error", 12: "error", 13: "pass", 14: "pass"}
    assert "died" in (out[11][0][4] or "") and "did not finish" in (out[12][0][4] or "")
    assert proc.restarts == 2


@pytest.fixture(scope="module")
def every_check_process() -> Iterator[CheckProcess]:
    """One check process with every verifier, a rule and the language check, kept across generated examples."""
    s = CheckSettings.model_validate({
        "verifiers": [{"kind": k, "reference": "ref", "timeout_s": 3} for k in KINDS],
        "rule": [{"name": "r", "regex": "a+b", "min_chars": 1, "language": "en"}],
        "language": {"enabled": True, "languages": ["en", "de"], "min_chars": 1},
    })
    names = s.extended_names()
    proc = CheckProcess(s, names, pool_checks_budget(s))
    assert proc.start(), proc.start_error
    yield proc
    proc.close()


@settings(deadline=None, max_examples=40)
@given(texts, texts, refs)
def test_generated_records_never_take_the_check_process_down(every_check_process: CheckProcess, content: str,
                                                             prompt: str, ref: object) -> None:
    proc = every_check_process
    before = proc.restarts
    args = view_args(RecordView(7, 0, "ok", "", content, "stop", messages=[{"role": "user", "content": prompt}]))
    [(rid, results)] = list(proc.run([(7, args, {"ref": ref})]))
    assert rid == 7 and [r[0] for r in results] == proc.names
    assert all(r[1] in STATES and r[1] != "pending" for r in results)
    assert proc.restarts == before  # answered by the same process: nothing generated crashed or hung it
