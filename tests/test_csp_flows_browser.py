"""No console error, CSP refusals included, on the paused run's flows (#37: "CSP console errors after using the
controls"), in a real browser, in both themes and at 1440, 1024 and 390 px: a run the field-mismatch alarm paused,
its card's acknowledge control opened, cap and concurrency set, "Acknowledge and resume" from the card, pause and
resume from the controls, a warning alarm acknowledged for N records, and the likely-fix page.

Every `securitypolicyviolation` the page sees is recorded (an init script) besides the console, so a refusal the
console would word differently still fails; the autouse browser watch (tests/conftest.py) fails on console errors
and failed requests."""

from __future__ import annotations

import time
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_alarms import patch_sim
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser]

WATCH_CSP = """window.__csp = []; document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || '') + ' ' + (e.sample || '')));"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_paused_runs_flows_leave_no_console_error(page: Page, engine: Any, sim: Any, prompts: Any,
                                                      live_app: Any, scheme: str, browser_problems: list[str]) -> None:
    url = sim(reasoning_field="reasoning_content", seed=5, ttft_ms=60)
    config = make_config(url, prompts(3000), concurrency=2, reasoning={"mode": "reasoning_content"},
                         name=f"csp-{scheme}")
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    violations: list[str] = []
    page.add_init_script(WATCH_CSP)
    page.emulate_media(color_scheme=scheme)

    def seen() -> None:
        violations.extend(page.evaluate("window.__csp || []"))

    try:
        srv = live_app(poll_interval_ms=500)
        wait_for(lambda: run_row(engine, run_id)["n_ok"] >= 3, what="first records")
        patch_sim(url, reasoning_field="reasoning")
        wait_for(lambda: run_row(engine, run_id)["status"] == "paused", timeout_s=30, what="auto-pause")
        patch_sim(url, reasoning_field="reasoning_content")
        with engine.connect() as conn, store.write_begin(conn):  # a warning alarm's card beside the pausing one
            conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at, updated_at, active,"
                " auto_paused) VALUES (:r, 'repetition', 'warning', 'Repetition',"
                " 'The answer repeats itself.', 'Lower `sampling.temperature`.', 3, :t, :t, true, false)"),
                {"r": run_id, "t": time.time()})
        run_page = f"{srv.url}/runs/{run_id}"
        # the premise: the watch sees a refusal (an inline style inserted as a swap would insert it)
        page.goto(run_page)
        page.evaluate("document.body.insertAdjacentHTML('beforeend', '<div style=\\'color: red\\'>x</div>')")
        wait_for(lambda: page.evaluate("window.__csp.length") > 0, timeout_s=5, what="the CSP watch")
        page.evaluate("window.__csp = []")
        wait_for(lambda: any("Content Security Policy" in p for p in browser_problems), timeout_s=5,
                 what="the console's CSP line")
        browser_problems[:] = [p for p in browser_problems if "Content Security Policy" not in p]

        # 1440 px: the paused run's cards, cap and concurrency, the likely-fix page and back
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(run_page)
        expect(page.locator('.alarm-banner [data-control="ack-resume"]')).to_be_visible(timeout=10_000)
        page.locator("#cap-input").fill("2500")
        page.locator('[data-control="cap"]').click()
        expect(page.get_by_test_id("control-message")).to_contain_text("2500")
        page.locator("#concurrency-input").fill("3")
        page.locator('[data-control="concurrency"]').click()
        expect(page.get_by_test_id("control-message")).to_contain_text("3")
        page.wait_for_timeout(1_500)  # polls land on the changed controls
        seen()
        fix = page.get_by_test_id("apply-likely-fix")
        if fix.count():
            fix.first.click()
            page.wait_for_load_state("load")
            seen()
            page.go_back()

        # 1024 px: the warning alarm acknowledged for N records from its card
        page.set_viewport_size({"width": 1024, "height": 800})
        page.goto(run_page)
        page.get_by_test_id("alarm-more").locator("> summary").click()  # the second card waits behind "1 more"
        card = page.locator('[data-testid="alarm-acknowledge"]').first
        expect(card).to_be_visible(timeout=10_000)
        card.locator("summary").click()
        card.get_by_test_id("ack-amount").fill("40")
        card.locator('[data-control="alarm-ack-submit"]').click()
        expect(page.locator('[data-testid="alarm-acknowledge"]')).to_have_count(0, timeout=10_000)
        page.wait_for_timeout(1_500)
        seen()

        # 390 px: acknowledge and resume from the card, then pause and resume from the controls
        page.set_viewport_size({"width": 390, "height": 844})
        page.goto(run_page)
        ack = page.locator('.alarm-banner [data-testid="ack-resume"]')
        ack.locator('[data-control="ack-resume"]').click()
        ack.get_by_test_id("ack-amount").fill("500")
        ack.locator('[data-control="ack-resume-submit"]').click()
        wait_for(lambda: run_row(engine, run_id)["status"] == "running", timeout_s=20, what="resumed")
        expect(page.locator('[data-control="pause"]')).to_be_visible(timeout=10_000)
        page.locator('[data-control="pause"]').click()
        expect(page.locator('[data-control="resume"]')).to_be_visible(timeout=10_000)
        page.locator('[data-control="resume"]').click()
        expect(page.locator('[data-control="pause"]')).to_be_visible(timeout=10_000)
        page.wait_for_timeout(1_500)
        seen()
    finally:
        store.apply_control(engine, run_id, "stop_now")
        bg.join(30)
    assert not violations, violations
