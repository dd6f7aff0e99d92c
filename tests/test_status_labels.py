"""A run's status message names checks by their labels on the pages (#37: "paused by alarm #2 field_mismatch: …",
"completed with 3 records failing empty_reasoning"). The stored message stays as written (the CLI, the API and the
tests of the store read it); the page translates it, and a command inside it keeps its ids.

A real worker auto-paused by the simulator's reasoning in another field, over a real SQLite file and HTTP."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.app.words import check_label, status_in_labels
from synthwatch.check_catalog import DEFAULT_RULES
from synthwatch.store import queue as store


def _status_message(html: str) -> str:
    m = re.search(r'<span class="status-message">(.*?)</span>', html, re.S)
    assert m, html[:1500]
    return unescape(m.group(1))


def test_a_paused_runs_status_names_the_check_in_words(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    url = sim(reasoning_field="reasoning", seed=2, ttft_ms=20)
    config = make_config(url, prompts(300), concurrency=4, reasoning={"mode": "reasoning_content"}, name="labels")
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    try:
        wait_for(lambda: "paused by alarm" in (run_row(engine, run_id)["status_message"] or ""), timeout_s=60,
                 what="auto-pause by the field-mismatch alarm")
        stored = run_row(engine, run_id)["status_message"]
        assert "field_mismatch" in stored, stored  # the premise: the store writes the id
        html = httpx.get(f"{live_app().url}/runs/{run_id}", timeout=30).text
        shown = _status_message(html)
        assert "field_mismatch" not in shown, shown
        # the card's "Acknowledge and resume" names the alarm in words too (the id only in a tooltip)
        banner = httpx.get(f"{live_app().url}/runs/{run_id}/alarms/banner", timeout=30).text
        ack = re.search(r'<details class="ack-resume".*?</details>', banner, re.S)
        assert ack and "(field_mismatch)" not in ack.group(0), ack and ack.group(0)
        assert re.search(r"paused by alarm #\d+: \w", shown), shown
        assert "field_mismatch" in run_row(engine, run_id)["status_message"]  # the stored text stays as written
    finally:
        store.apply_control(engine, run_id, "stop")
        bg.join(30)


def test_a_completed_runs_status_names_the_checks_in_words(engine: Any, sim: Any, prompts: Any,
                                                           live_app: Any) -> None:
    from workerkit import run_to_end

    run_id, status = run_to_end(engine, make_config(sim(ttft_ms=20), prompts(6), concurrency=2, name="done"))
    assert status == "completed"
    msg = ("completed with 3 records failing empty_reasoning, 1 record failing truncated, 2 records queued for a"
           " re-run (field_mismatch)")
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE run SET status_message = :m WHERE id = :r"), {"m": msg, "r": run_id})
    shown = _status_message(httpx.get(f"{live_app().url}/runs/{run_id}", timeout=30).text)
    for check in ("empty_reasoning", "truncated", "field_mismatch"):
        assert check not in shown and check_label(check) in shown, (check, shown)


def test_a_command_in_the_message_keeps_its_ids() -> None:
    msg = ("paused by alarm #7 empty_reasoning: Empty reasoning. Acknowledge and resume to go on (synthwatch control"
           " failing_run resume --ack --for-records 100 --db /tmp/x.db), or fix the cause")
    out = status_in_labels(msg)
    assert out.startswith("paused by alarm #7: Empty reasoning.")
    assert "(synthwatch control failing_run resume --ack --for-records 100 --db /tmp/x.db)" in out


@given(st.text(alphabet="abcdefghij_ #:;,.()0123456789", max_size=80))
def test_a_message_with_no_check_id_is_shown_as_stored(msg: str) -> None:
    if any(re.search(rf"\b{k}\b", msg) for k in DEFAULT_RULES):
        return
    assert status_in_labels(msg) == msg


@given(st.sampled_from(sorted(DEFAULT_RULES)), st.integers(0, 10**6))
def test_every_check_id_in_a_completion_message_becomes_its_label(check: str, n: int) -> None:
    out = status_in_labels(f"completed with {n:,} records failing {check}")
    assert out == f"completed with {n:,} records failing {check_label(check)}"
