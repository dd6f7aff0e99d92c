"""Alarms in their place (#28 item 1), in a real browser on a live run with three alarms (one more is a symptom).

Every page of a run but the run page and the checks page shows one compact strip with the symptom under its cause;
the strip's count and severity lead to the full cards. On the run page at 1024x768 the state, the throughput, the
cards' summary and the controls are above the fold (the cards beyond the first wait behind "N more"); at 390 px
the controls sit in a bar at the bottom of the screen, whatever is scrolled."""

from __future__ import annotations

import os
import time

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser

LONG = ("1,758 of 1,758 ok records in the last 200 have no reasoning while the raw response holds it in `reasoning`; "
        "this run reads `reasoning_content`, so every one of them is stored without its reasoning. ")
ALARMS = (  # rule, severity, title, count: three causes, and one symptom of the first
    ("field_mismatch", "error", "Reasoning is in a field this run does not read", 1758),
    ("empty_reasoning", "error", "Empty reasoning", 1758),
    ("truncated", "warning", "Answers cut at max_tokens", 40),
    ("duplicate_output", "warning", "Duplicate answers", 31),
)


def add_alarms(engine, run_id: int) -> None:  # type: ignore[no-untyped-def]
    with engine.connect() as conn, store.write_begin(conn):
        for rule, severity, title, count in ALARMS:
            conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at, updated_at, active,"
                " auto_paused) VALUES (:r, :rule, :sev, :title, :msg, :fix, :n, :t, :t, true, false)"),
                {"r": run_id, "rule": rule, "sev": severity, "title": title, "msg": LONG * 2, "n": count,
                 "fix": "set `reasoning.mode = \"reasoning\"` and re-derive the records", "t": time.time()})


def _shot(page: Page, name: str) -> None:
    """SHOTS_DIR=dir keeps a screenshot of each fold measured, to look at."""
    if os.environ.get("SHOTS_DIR"):
        page.screenshot(path=os.path.join(os.environ["SHOTS_DIR"], name + ".png"))


def _box(page: Page, selector: str) -> dict[str, float]:
    loc = page.locator(selector).first
    expect(loc).to_be_visible()
    box = loc.bounding_box()
    assert box is not None, selector
    return box


def _above_fold(page: Page, selector: str, fold: float) -> dict[str, float]:
    box = _box(page, selector)
    assert box["y"] >= 0 and box["y"] + box["height"] <= fold + 0.5, (selector, box, fold)
    return box


@pytest.fixture
def alarmed_run(engine, sim, prompts):  # type: ignore[no-untyped-def]
    url = sim(seed=11, ttft_ms=40)
    bg = Background(engine, make_config(url, prompts(5000), concurrency=2, name="strip-run")).start()
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 5, what="first records")
        add_alarms(engine, bg.run_id)
        yield bg.run_id
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


def test_run_page_fold_at_1024_with_three_alarms(page: Page, live_app, alarmed_run) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{srv.url}/runs/{alarmed_run}")
    cards = page.locator("#alarm-slot > section.alarm-banner")
    expect(cards).to_have_count(1)  # the first cause open; the other two behind "2 more"
    expect(cards.first).to_have_attribute("data-rule", "field_mismatch")
    expect(cards.first.locator('[data-testid="alarm-symptoms"] li[data-rule="empty_reasoning"]')).to_contain_text(
        "Empty reasoning")  # the symptom under its cause, not a second red card
    more = page.get_by_test_id("alarm-more")
    expect(more.locator("> summary")).to_contain_text("2 more alarms")
    fold = 768
    _above_fold(page, "#alarm-slot > section.alarm-banner .alarm-title", fold)
    _above_fold(page, '[data-testid="alarm-more"] > summary', fold)
    _above_fold(page, '[data-control="pause"]', fold)
    _above_fold(page, '[data-control="stop_now"]', fold)
    _above_fold(page, ".status-line", fold)
    _above_fold(page, '[data-tile="throughput"]', fold)
    _shot(page, "run-1024")
    # "N more" opens, and stays open across the banner's polls
    more.locator("> summary").click()
    expect(page.locator("#alarm-slot section.alarm-banner")).to_have_count(3)
    page.evaluate("document.querySelector('#alarm-slot').dataset.polled = '1'")
    page.wait_for_function("() => document.querySelector('#alarm-slot').dataset.polled === undefined", timeout=10000)
    expect(page.get_by_test_id("alarm-more")).to_have_attribute("open", "")
    # the tab says the run has an alarm
    expect(page).to_have_title("⚠ · strip-run · synthwatch")


def test_controls_in_a_bottom_bar_at_390(page: Page, live_app, alarmed_run) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{srv.url}/runs/{alarmed_run}")
    expect(page.get_by_test_id("alarm-more")).to_be_visible()
    _shot(page, "run-390")
    bar = _box(page, "#run-controls")
    assert abs(bar["y"] + bar["height"] - 844) <= 1, bar  # at the bottom of the screen
    assert bar["height"] <= 844 * 0.2, bar  # and not a third of it
    for name in ("pause", "stop", "stop_now", "cap", "concurrency"):
        _above_fold(page, f'[data-control="{name}"]', 844)
    status = _above_fold(page, ".status-line", bar["y"])  # the state above the bar
    assert status["y"] < bar["y"]
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    assert page.evaluate("window.scrollY") > 500
    after = _box(page, "#run-controls")
    assert abs(after["y"] - bar["y"]) <= 1, (bar, after)  # it stays while the page scrolls
    # the page's last card is not hidden behind the bar
    last = page.locator("main .run-side .card").last.bounding_box()
    assert last and last["y"] + last["height"] <= after["y"] + 1, (last, after)
    assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0


def test_other_pages_show_one_strip_leading_to_the_cards(page: Page, live_app, alarmed_run) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    page.set_viewport_size({"width": 1024, "height": 768})
    for path in ("records", "repair", "export"):
        page.goto(f"{srv.url}/runs/{alarmed_run}/{path}")
        strip = page.get_by_test_id("alarm-strip")
        expect(strip).to_have_count(1)
        expect(page.locator("section.alarm-banner")).to_have_count(0)
        box = _above_fold(page, '[data-testid="alarm-strip"]', 768)
        _shot(page, f"{path}-1024")
        assert box["height"] <= 60, (path, box)  # compact: one or two lines
        expect(strip.get_by_test_id("strip-count")).to_have_text("⚠ 4 alarms")
        expect(strip.get_by_test_id("strip-worst")).to_have_text("error")
        causes = strip.locator(".strip-cause")
        expect(causes).to_have_count(3)  # the symptom is counted under its cause
        expect(causes.first).to_contain_text("explains empty reasoning")
    # the count leads to every card, open, on the checks page
    page.get_by_test_id("strip-count").click()
    page.wait_for_url(f"**/runs/{alarmed_run}/checks*")
    expect(page.locator("#alarm-slot section.alarm-banner")).to_have_count(3)
    expect(page.get_by_test_id("alarm-more")).to_have_count(0)
    # acknowledging the symptom there leaves the cause
    page.locator('[data-testid="alarm-symptoms"] li[data-rule="empty_reasoning"] button').click()
    expect(page.locator('[data-testid="alarm-symptoms"]')).to_have_count(0)
    expect(page.locator("#alarm-slot section.alarm-banner")).to_have_count(3)
