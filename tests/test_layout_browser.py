"""Controls at hand at every width, and no page that scrolls sideways at 1024 px (real browser, live run)."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser

WIDTHS = [(1400, 900), (1024, 768), (390, 844)]


def _add_alarm(engine, run_id: int) -> None:  # type: ignore[no-untyped-def]
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, 'empty_reasoning', 'error', 'Empty reasoning', 'test', 1, :t, :t, true, false)"),
            {"r": run_id, "t": time.time()})


def _sideways(page: Page) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth"))


_WIDEST = """() => { const w = document.documentElement.clientWidth; const out = [];
  for (const el of document.querySelectorAll('body *')) { const r = el.getBoundingClientRect();
    if (r.right > w + 1 && !(el.parentElement && el.parentElement.getBoundingClientRect().right > w + 1))
      out.push(el.tagName + '.' + el.className + '#' + el.id + ' ' + Math.round(r.right)); }
  return out.slice(0, 8); }"""


def _no_sideways(page: Page, what: str) -> None:
    over = _sideways(page)
    assert over <= 0, f"{what} scrolls sideways by {over} px: {page.evaluate(_WIDEST)}"


@pytest.mark.parametrize(("width", "height"), WIDTHS, ids=[str(w) for w, _ in WIDTHS])
def test_controls_at_hand_and_nothing_scrolls_sideways(page: Page, engine, sim, prompts, live_app,  # type: ignore[no-untyped-def]
                                                       width: int, height: int) -> None:
    url = sim(seed=7, ttft_ms=40)
    bg = Background(engine, make_config(url, prompts(5000), concurrency=2)).start()
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 5, what="first records")
        _add_alarm(engine, bg.run_id)
        srv = live_app()
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        pause = page.locator('[data-control="pause"]')
        expect(pause).to_be_in_viewport()
        bar = page.locator("#run-controls").bounding_box()
        tiles = page.locator(".tiles").bounding_box()
        assert bar and tiles
        if width > 700:
            assert bar["y"] + bar["height"] <= tiles["y"] + 1, (bar, tiles)  # above the tiles
        else:  # a phone: in a bar at the bottom of the screen (#28 item 1, tests/test_alarm_strip_browser.py)
            assert abs(bar["y"] + bar["height"] - height) <= 1, (bar, height)
        for name in ("stop", "stop_now", "cap", "concurrency"):
            expect(page.locator(f'[data-control="{name}"]')).to_be_in_viewport()
        if width >= 1024 or width <= 700:  # and it stays at hand while the page scrolls
            page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
            assert page.evaluate("window.scrollY") > 500
            expect(pause).to_be_in_viewport()
        if width == 1400:  # the chart window is kept in the URL: a reload shows the same window
            page.evaluate("window.scrollTo(0, 0)")
            page.locator('.windows a[data-window="1h"]').click()
            expect(page).to_have_url(f"{srv.url}/runs/{bg.run_id}?window=1h")
            expect(page.locator("#run-charts")).to_have_attribute("data-window", "1h")
            page.reload()
            expect(page.locator("#run-charts")).to_have_attribute("data-window", "1h")
        if width <= 1024:
            _no_sideways(page, f"the run page at {width} px")
        if width == 390:  # the runs list on a phone says which run has an alarm
            page.goto(f"{srv.url}/runs")
            expect(page.get_by_test_id("run-alarm-narrow")).to_be_visible()
            expect(page.get_by_test_id("run-alarm-narrow")).to_have_text("1 alarm")
            _no_sideways(page, "the runs list at 390 px")
        if width == 1024:
            rid = bg.run_id
            for path in ("/runs", f"/runs/{rid}/records", f"/runs/{rid}/records?q=the", f"/runs/{rid}/checks",
                         f"/runs/{rid}/repair", f"/runs/{rid}/sample", f"/runs/{rid}/export", "/runs/new",
                         "/help/checks", "/docs"):
                page.goto(srv.url + path)
                page.wait_for_load_state("load")
                _no_sideways(page, f"{path} at 1024 px")
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
