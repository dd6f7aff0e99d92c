"""No layout wider than a 390 px screen (#37), on the page kinds the merges of #34-#36 brought, in a real browser:
the streams panel open on a live run, the record text's "Show the next …" viewer after a click, the weakenings
list on the run page and the export page, and the settings policy's refusals on the settings and checks forms.
tests/test_dashboard_day_browser.py covers the older page kinds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from test_dashboard_day_browser import _WIDEST
from workerkit import make_config, wait_for

from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser]

WIDTH_PX = 390
# user text as people type it: a path and a URL are one unbroken word
LONG_REASON = ("the endpoint behind https://inference.internal.example.com/v1/chat/completions/deepseek-r1-distill"
               "-qwen-32b-awq-int4 skips thinking on short prompts; see /srv/notes/runs/2026-12-03/long-file-name.md")


def _wide(page: Page) -> tuple[int, list[str]] | None:
    width = int(page.evaluate("document.documentElement.scrollWidth"))
    return (width, page.evaluate(_WIDEST)) if width > WIDTH_PX else None


def _expected_refusal(problems: list[str], path: str) -> None:
    """A refused form answers 400 on purpose: that response (and the browser's line about it) is no problem."""
    seen = [p for p in problems if "400" in p and (path in p or "Failed to load resource" in p)]
    assert seen, problems
    for p in seen:
        problems.remove(p)


def test_the_new_page_kinds_fit_a_390_px_screen(page: Page, engine: Any, sim: Any, prompts: Any, live_app: Any,
                                                db_path: Path, browser_problems: list[str]) -> None:
    from test_viewer_bounded import huge_record

    from synthwatch.review.display import VIEW_WINDOW_CHARS

    # slow and long: streams stay in flight while the page is looked at
    url = sim(reasoning_field="reasoning", seed=7, tokens_per_s=20, ttft_ms=200, reasoning_tokens="2000-2400",
              content_tokens="50-60")
    config = make_config(url, prompts(20), concurrency=3, reasoning={"mode": "reasoning"}, name="narrow-live",
                         timeouts={"connect_s": 10, "total_s": 600, "idle_s": 60})
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    wide: dict[str, Any] = {}
    try:
        srv = live_app()
        wait_for(lambda: len(httpx.get(f"{srv.url}/api/runs/{run_id}/streams", timeout=30).json()["streams"]) == 3,
                 timeout_s=30, what="3 streams in flight")
        t = time.time()
        with engine.connect() as conn, store.write_begin(conn):
            for kind, check in (("disabled", "empty_reasoning"), ("threshold", "truncated")):
                conn.execute(text("INSERT INTO check_override (run_id, kind, check_name, detail, reason, actor,"
                                  " created_at) VALUES (:r, :k, :c, :d, :why, 'ui', :t)"),
                             {"r": run_id, "k": kind, "c": check, "d": f"{check} {kind}", "why": LONG_REASON, "t": t})
        page.set_viewport_size({"width": WIDTH_PX, "height": 844})

        # the run page with its weakenings and the streams panel open, a stream watched
        page.goto(f"{srv.url}/runs/{run_id}")
        expect(page.get_by_test_id("weakening-overrides").first).to_be_visible(timeout=15_000)
        page.locator("#run-streams summary").click()
        rows = page.locator("[data-stream-row]")
        expect(rows).to_have_count(3, timeout=15_000)
        expect(rows.first.locator(".stream-tail pre").first).not_to_have_text("", timeout=10_000)
        if w := _wide(page):
            wide["run page, streams panel open"] = w
        rows.first.locator("[data-watch-stream]").click()
        expect(page.get_by_test_id("stream-one").locator("pre").first).not_to_have_text("", timeout=10_000)
        if w := _wide(page):
            wide["run page, one stream watched"] = w

        page.goto(f"{srv.url}/runs/{run_id}/export")
        expect(page.get_by_test_id("weakening-overrides").first).to_be_visible()
        if w := _wide(page):
            wide["export page, weakenings"] = w

        # the settings form refused by the settings policy (a key variable the dashboard may not name)
        page.goto(f"{srv.url}/runs/{run_id}/repair")
        page.get_by_test_id("set-endpoints").fill(f"{url} AWS_SECRET_ACCESS_KEY_FOR_THE_PRODUCTION_INFERENCE_CLUSTER")
        page.get_by_test_id("save-settings").click()
        expect(page.locator('[data-field-error="set.endpoints"]')).to_be_visible()
        _expected_refusal(browser_problems, "/settings")
        if w := _wide(page):
            wide["settings form, policy refusal"] = w

        # the checks form: a weakening without its reason
        page.goto(f"{srv.url}/runs/{run_id}/checks")
        page.locator('input[name="threshold__repetition"]').fill("90%")
        page.locator("form.checks-settings button[type=submit]").click()
        expect(page.locator(".checks-error")).to_be_visible()
        _expected_refusal(browser_problems, "/checks/settings")
        if w := _wide(page):
            wide["checks form, refusal"] = w
    finally:
        store.apply_control(engine, run_id, "stop_now")
        bg.join(30)

    # the record text's next-window viewer, after a click
    big_run, rid, _ = huge_record(db_path, 2 * VIEW_WINDOW_CHARS, 1000)
    page.goto(f"{srv.url}/runs/{big_run}/records/{rid}")
    side = page.locator("#side-content")
    side.locator("[data-next-chunk]").click()
    expect(side.locator("[data-next-chunk]")).to_have_count(0)
    if w := _wide(page):
        wide["record text, next window shown"] = w
    assert not wide, wide
