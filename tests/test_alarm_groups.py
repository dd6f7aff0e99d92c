"""Symptom alarms grouped under their cause (#28 item 1): named cases and a property over any set of open alarms."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from synthwatch.check_catalog import CHECK_NAMES
from synthwatch.quality.detection.alarms import ALARM_CAUSES, group_alarms, worst_severity


def _a(i: int, rule: str, severity: str = "error") -> dict[str, object]:
    return {"id": i, "rule": rule, "severity": severity, "title": rule, "count": 1}


def test_symptom_goes_under_its_open_cause() -> None:
    groups = group_alarms([_a(3, "empty_reasoning"), _a(2, "field_mismatch"), _a(1, "truncated", "warning")])
    assert [g["rule"] for g in groups] == ["field_mismatch", "truncated"]
    assert [s["rule"] for s in groups[0]["symptoms"]] == ["empty_reasoning"]
    assert groups[1]["symptoms"] == []


def test_symptom_without_its_cause_stands_alone() -> None:
    groups = group_alarms([_a(1, "empty_reasoning"), _a(2, "duplicate_output", "warning")])
    assert [g["rule"] for g in groups] == ["empty_reasoning", "duplicate_output"]


def test_a_warning_cause_with_an_error_symptom_counts_as_error() -> None:
    groups = group_alarms([_a(1, "duplicate_output", "error"), _a(2, "truncated", "warning"),
                           _a(3, "truncated_in_reasoning", "error")])
    assert groups[0]["rule"] == "duplicate_output" and groups[1]["rule"] == "truncated"
    assert groups[1]["worst"] == "error"
    assert worst_severity([]) is None and worst_severity([_a(1, "x", "warning")]) == "warning"


@given(st.lists(st.tuples(st.sampled_from(CHECK_NAMES), st.sampled_from(["error", "warning"])),
                unique_by=lambda t: t[0], max_size=len(CHECK_NAMES)))
def test_every_alarm_appears_exactly_once(rules: list[tuple[str, str]]) -> None:
    alarms = [_a(i, r, s) for i, (r, s) in enumerate(rules)]
    groups = group_alarms(alarms)
    seen = [g["id"] for g in groups] + [s["id"] for g in groups for s in g["symptoms"]]
    assert sorted(seen) == sorted(a["id"] for a in alarms)
    open_rules = {a["rule"] for a in alarms}
    for g in groups:
        assert not set(ALARM_CAUSES.get(g["rule"], ())) & open_rules  # a shown cause is not some open alarm's symptom
        for s in g["symptoms"]:
            assert g["rule"] in ALARM_CAUSES[s["rule"]]
    worst = [g["worst"] for g in groups]
    assert worst == sorted(worst, key=lambda w: w != "error")
