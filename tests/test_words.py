"""Words a person reads: counts, run states, check labels (the same name everywhere)."""

from __future__ import annotations

import re

import httpx
import pytest
from markupsafe import escape as html_escape

from synthwatch.app.filters import run_state, state_note
from synthwatch.app.words import check_help, check_label, plural
from synthwatch.check_catalog import CHECK_INFO, CHECK_NAMES, DEFAULT_RULES


def test_counts_have_correct_grammar() -> None:
    assert plural(1, "error") == "1 error"
    assert plural(0, "error") == "0 errors"
    assert plural(12345, "record") == "12,345 records"
    assert plural(None, "alarm") == "0 alarms"


@pytest.mark.parametrize(("status", "desired", "message", "state", "note"), [
    ("running", "run", None, "running", ""),
    ("running", "pause", None, "pausing…", ""),
    ("paused", "pause", "paused", "paused", ""),  # not "paused paused"
    ("paused", "pause", "paused; 2 in-flight requests finishing", "paused", "paused; 2 in-flight requests finishing"),
    ("paused", "run", "paused", "resuming…", ""),
    ("running", "stop", None, "stopping…", ""),
    ("stopped", "stop", "stopped", "stopped", ""),  # was "stopped stopped"
    ("completed", "run", "completed with 3 errors", "completed", "completed with 3 errors"),
])
def test_one_state_word(status: str, desired: str, message: str | None, state: str, note: str) -> None:
    run = {"status": status, "desired": desired, "status_message": message}
    assert run_state(run) == state
    assert state_note(run) == note


def test_every_check_has_a_label_and_a_one_line_tooltip() -> None:
    labels = [check_label(n) for n in CHECK_NAMES]
    assert len(set(labels)) == len(labels), labels  # no two checks read the same
    for n in CHECK_NAMES:
        assert n in DEFAULT_RULES and check_label(n) == DEFAULT_RULES[n].title
        assert check_help(n) == CHECK_INFO[n] and "\n" not in check_help(n)
        assert check_label(n) != n and " " in check_label(n) or n in ("timeout", "error"), n


def test_help_page_has_a_row_per_check(live_app) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    html = httpx.get(f"{srv.url}/help/checks", timeout=10).text
    for n in CHECK_NAMES:
        row = re.search(rf'<tr id="check-{n}"[^>]*>(.*?)</tr>', html, re.S)
        assert row, n
        assert str(html_escape(check_label(n))) in row.group(1)


def test_endpoint_urls_are_shown_without_credentials() -> None:
    from synthwatch.app.launch import config_to_form, shown_url

    assert shown_url("http://user:s3cret@10.0.0.5:8000/v1") == "http://10.0.0.5:8000/v1"
    assert shown_url("https://api.example.com/v1") == "https://api.example.com/v1"
    form = config_to_form({"endpoints": [{"base_url": "http://u:p@h:1/v1", "api_key": "sk-never",
                                          "api_key_env": "SYNTHWATCH_KEY_A"}], "model": "m"})
    assert form["endpoints"] == "http://h:1/v1" and form["api_key_env"] == "SYNTHWATCH_KEY_A"
    assert "sk-never" not in str(form)
