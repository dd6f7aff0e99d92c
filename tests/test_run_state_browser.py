"""One state everywhere, within one poll: a run paused by its alarm changes the whole run page without a reload."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect
from test_alarms import patch_sim
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser


def test_alarm_pause_reaches_controls_eta_and_rates_without_reload(page: Page, engine, sim, prompts,  # type: ignore[no-untyped-def]
                                                                  live_app) -> None:
    url = sim(reasoning_field="reasoning_content", seed=5, ttft_ms=60)
    config = make_config(url, prompts(2000), concurrency=2, reasoning={"mode": "reasoning_content"})
    bg = CheckedBackground(engine, config).start()
    try:
        srv = live_app(poll_interval_ms=500)
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 3, what="first records")
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
        expect(page.get_by_test_id("run-status")).to_have_text("running")
        expect(page.locator('[data-control="pause"]')).to_be_visible()
        expect(page.get_by_test_id("req-s")).not_to_have_text("0.00", timeout=10_000)
        expect(page.get_by_test_id("eta")).to_have_text(re.compile(r"^ETA (?!paused)"))

        # the server starts sending `reasoning`: the alarm pauses the run; nobody touches the page
        patch_sim(url, reasoning_field="reasoning")
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused", timeout_s=20, what="auto-pause")
        # the open alarm holds the run: Resume is "Acknowledge and resume" (#26)
        # one acknowledge control, on the alarm's card beside its fix (#37); the controls say where it is
        expect(page.locator('.alarm-banner [data-control="ack-resume"]')).to_be_visible(timeout=10_000)
        expect(page.get_by_role("region", name="Controls").get_by_test_id("ack-on-alarm")).to_be_visible()
        expect(page.locator('[data-testid="ack-resume"], [data-testid="alarm-acknowledge"]')).to_have_count(1)
        expect(page.locator('[data-control="pause"]')).to_have_count(0)
        expect(page.get_by_test_id("run-status")).to_have_text("paused")
        expect(page.get_by_test_id("eta")).to_have_text("ETA paused")
        expect(page.get_by_test_id("req-s")).to_have_text("0.00")
        expect(page.locator('[data-tile="throughput"] .tile-title')).to_contain_text("nothing runs")
        assert page.evaluate("window.__sameDocument") is True

        # and back: Resume from the page flips everything again, still without a reload
        patch_sim(url, reasoning_field="reasoning_content")
        store.apply_control(engine, bg.run_id, "resume", ack_records=100)
        expect(page.locator('[data-control="pause"]')).to_be_visible(timeout=5_000)
        assert page.evaluate("window.__sameDocument") is True
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
    # the end reaches the page within a poll as well: no controls, one word of status
    expect(page.get_by_test_id("controls-ended")).to_be_visible(timeout=5_000)
    expect(page.get_by_test_id("run-status")).to_have_text(re.compile(r"^\w+$"))
