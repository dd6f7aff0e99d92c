"""Resume in a real browser while an alarm holds the run (#26): the plain Resume button does not start claims;
"Acknowledge and resume" says for how many records, and the run pauses again after them."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.quality.detection.alarms import set_auto_pause
from synthwatch.store import queue as store

pytestmark = pytest.mark.browser


def _claimed(engine, run_id: int) -> int:  # type: ignore[no-untyped-def]
    r = run_row(engine, run_id)
    return int(r["total"] - r["n_pending"])


def test_resume_button_with_an_open_alarm(page: Page, browser_problems, engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=2, ttft_ms=20)
    config = make_config(url, prompts(400), concurrency=4, reasoning={"mode": "reasoning_content"})
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    try:
        wait_for(lambda: run_row(engine, run_id)["status"] == "paused" and run_row(engine, run_id)["n_in_flight"] == 0,
                 timeout_s=60, what="auto-pause")
        srv = live_app()
        # a page drawn while the alarm did not hold the run (auto-pause off for the check) shows a plain Resume;
        # the hold comes back (auto-pause on again) before the button is pressed
        set_auto_pause(engine, run_id, "field_mismatch", False, reason="looking at it", actor="test")
        page.goto(f"{srv.url}/runs/{run_id}")
        plain = page.locator('button[data-control="resume"]')
        expect(plain).to_be_visible()
        set_auto_pause(engine, run_id, "field_mismatch", True, actor="test")
        before, t0 = _claimed(engine, run_id), time.time()
        plain.click()
        expect(page.locator('[data-testid="control-error"]')).to_contain_text("not resumed: alarm #")
        expect(page.get_by_test_id("ack-on-alarm")).to_be_visible()
        dialog = page.locator('.alarm-banner [data-testid="ack-resume"]')  # the one control, on the card (#37)
        expect(dialog).to_have_count(1)
        dialog.locator("summary").click()
        assert run_row(engine, run_id)["desired"] == "pause" and _claimed(engine, run_id) == before
        # the refusal is a 409 (expected here, not a page fault)
        wait_for(lambda: any("409" in p for p in browser_problems), timeout_s=5, what="the 409 seen")
        browser_problems[:] = [p for p in browser_problems if "409" not in p]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND claimed_at > :t"),
                                {"r": run_id, "t": t0}).scalar_one() == 0
        # acknowledge and resume for 6 records: 6 more are claimed, then the open alarm pauses the run again
        dialog.locator('[data-testid="ack-amount"]').fill("6")
        dialog.locator('button[data-control="ack-resume-submit"]').click()
        expect(page.locator('[data-testid="control-message"]')).to_contain_text("acknowledged for 6 more records")
        wait_for(lambda: _claimed(engine, run_id) == before + 6 and run_row(engine, run_id)["desired"] == "pause"
                 and run_row(engine, run_id)["n_in_flight"] == 0, timeout_s=30, what="paused again after 6")
        page.reload()
        expect(page.locator('.alarm-banner [data-testid="ack-resume"]')).to_be_visible()
        expect(page.locator('.alarm-banner[data-rule="field_mismatch"] .alarm-paused')).to_have_text(
            "run paused automatically")
        assert _claimed(engine, run_id) == before + 6
    finally:
        store.apply_control(engine, run_id, "stop")
        bg.join(30)
