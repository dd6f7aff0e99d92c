"""The alarm banner in a real browser: it appears live on the run page while the run is going."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect
from test_alarms import patch_sim
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser


def test_banner_appears_live_and_can_be_acknowledged(page: Page, engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    # healthy at first: the server sends reasoning_content and the run reads reasoning_content
    url = sim(reasoning_field="reasoning_content", seed=3, ttft_ms=80)
    config = make_config(url, prompts(400), concurrency=2, reasoning={"mode": "reasoning_content"})
    bg = CheckedBackground(engine, config).start()
    try:
        srv = live_app()
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 3, what="first records")
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        slot = page.locator("#alarm-slot")
        expect(slot).to_have_attribute("hx-trigger", "every 2s")  # the banner loaded and polls
        expect(page.locator(".alarm-banner")).to_have_count(0)
        # the server is upgraded mid-run and now sends `reasoning`: the machine must notice, not a person
        patch_sim(url, reasoning_field="reasoning")
        banner = page.locator('.alarm-banner[data-rule="field_mismatch"]')
        expect(banner).to_be_visible(timeout=15_000)
        expect(banner.locator(".alarm-title")).to_have_text("Reasoning is in a field this run does not read")
        expect(banner.locator(".alarm-message code")).to_have_text(["reasoning", "reasoning_content"])
        expect(banner.locator(".alarm-paused")).to_have_text("run paused automatically")
        expect(banner.locator(".alarm-fix")).to_contain_text('reasoning.mode = "reasoning"')
        expect(banner.locator("a.alarm-example")).to_have_attribute("href", re.compile(rf"^/runs/{bg.run_id}/records/\d+$"))
        expect(banner.locator(".alarm-count")).to_have_text(re.compile(r"^\d+ records?$"))
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused", what="run paused")
        # the same banner on the run's checks page
        page.goto(f"{srv.url}/runs/{bg.run_id}/checks")
        expect(page.locator('.alarm-banner[data-rule="field_mismatch"]')).to_be_visible()
        expect(page.locator('tr[data-check="field_mismatch"]')).to_have_class(re.compile("check-failing"))
        # one banner for the cause: the empty reasoning it causes raises no alarm of its own
        expect(page.locator(".alarm-banner")).to_have_count(1)
        card = page.locator('.alarm-banner[data-rule="field_mismatch"]')
        # the one acknowledge control, beside the fix (#37): here, held, it acknowledges and resumes
        expect(card.locator('[data-testid="ack-resume"], [data-testid="alarm-acknowledge"]')).to_have_count(1)
        control = card.locator('[data-testid="ack-resume"], [data-testid="alarm-acknowledge"]')
        control.locator("summary").click()
        control.locator("button[type=submit]").click()
        expect(page.locator(".alarm-banner")).to_have_count(0)
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)
