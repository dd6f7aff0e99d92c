"""The likely fix an alarm's evidence proposes (synthwatch/repair/likely_fix.py; the flow: test_likely_fix_browser)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.reasoning import MODES
from synthwatch.check_catalog import CHECK_NAMES
from synthwatch.repair.likely_fix import MAX_TOKENS_CEILING, proposal


def _alarm(rule: str, **ctx: object) -> dict[str, object]:
    return {"rule": rule, "evidence_json": orjson.dumps({"ctx": ctx, "counts": [1, 1, 1, 1]}).decode()}


def test_field_mismatch_reads_the_field_the_answers_hold() -> None:
    a = _alarm("field_mismatch", fields=["reasoning"], mode="reasoning_content")
    assert proposal(a, {"reasoning": {"mode": "reasoning_content"}}, "generate") == (
        {"reasoning.mode": "reasoning"}, "rederive")
    # the setting was fixed after the records were made: only the re-derive is left
    assert proposal(a, {"reasoning": {"mode": "reasoning"}}, "generate") == ({}, "rederive")


def test_field_mismatch_without_evidence_proposes_auto_or_nothing() -> None:
    assert proposal(_alarm("field_mismatch"), {"reasoning": {"mode": "reasoning"}}, "generate") == (
        {"reasoning.mode": "auto"}, "rederive")
    assert proposal(_alarm("field_mismatch"), {"reasoning": {"mode": "auto"}}, "generate") is None


def test_cut_answers_run_again_with_twice_the_tokens_on_generated_runs_only() -> None:
    cfg = {"sampling": {"max_tokens": 4096}}
    assert proposal(_alarm("truncated"), cfg, "generate") == ({"sampling.max_tokens": 8192}, "rerun")
    assert proposal(_alarm("truncated_in_reasoning"), cfg, "watch") is None
    assert proposal(_alarm("truncated"), {"sampling": {}}, "generate") is None
    big = {"sampling": {"max_tokens": MAX_TOKENS_CEILING - 1}}
    assert proposal(_alarm("truncated"), big, "generate") == ({"sampling.max_tokens": MAX_TOKENS_CEILING}, "rerun")


@given(st.sampled_from(CHECK_NAMES), st.lists(st.sampled_from([*MODES, "inline"]), max_size=3),
       st.sampled_from(MODES), st.sampled_from(MODES), st.one_of(st.none(), st.integers(-5, 300_000)))
def test_never_proposes_what_the_run_already_has(rule: str, fields: list[str], made: str, now: str,
                                                 max_tokens: int | None) -> None:
    cfg = {"reasoning": {"mode": now}, "sampling": {"max_tokens": max_tokens}}
    got = proposal(_alarm(rule, fields=fields, mode=made), cfg, "generate")
    if got is None:
        return
    changes, repair = got
    assert repair in ("rederive", "rerun")
    for key, value in changes.items():
        current = cfg[key.split(".")[0]][key.split(".")[1]]
        assert value != current, (key, value)
        if key == "sampling.max_tokens":
            assert isinstance(max_tokens, int) and max_tokens < value <= MAX_TOKENS_CEILING
