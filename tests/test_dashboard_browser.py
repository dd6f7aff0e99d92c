"""The live run page in a real browser (Debian chromium) while a real worker writes the database.

The conftest's problem checks fail the test on any JS error, failed request or HTTP >= 400.
"""

from __future__ import annotations

import re
import time

import pytest
from sqlalchemy import text
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser


def _n_ok(page) -> int:  # type: ignore[no-untyped-def]
    return int(page.locator('[data-testid="n-ok"]').inner_text().replace(",", ""))


def _poll(page, pred, what: str, timeout_s: float = 15) -> None:  # type: ignore[no-untyped-def]
    """Wait in Python (the CSP forbids the string evaluation wait_for_function would need)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        page.wait_for_timeout(100)


def test_run_page_live_controls(page, live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    # ~1 s per request at 4-way concurrency: the run would take over a minute, the test stops it early
    url = sim(tokens_per_s=150, seed=4, rate_429=0.05)
    config = make_config(url, prompts(400), name="browser-run", concurrency=4)
    bg = Background(engine, config).start()
    srv = live_app(poll_interval_ms=500)
    page.on("dialog", lambda d: d.accept())
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 1, what="first ok record")
        page.goto(f"{srv.url}/runs")
        row = page.locator(f'tr[data-run-id="{bg.run_id}"]')
        row.get_by_role("link", name="browser-run").click()
        page.wait_for_url(f"**/runs/{bg.run_id}")
        page.evaluate("window.__noReload = 'still here'")

        # counts and charts change without a reload
        first = _n_ok(page)
        _poll(page, lambda: _n_ok(page) > first, "the ok count to grow")
        charts = page.locator("#run-charts")
        last_t = charts.get_attribute("data-last-t")
        _poll(page, lambda: charts.get_attribute("data-last-t") not in (None, last_t), "the chart to change")
        assert charts.get_attribute("data-n-points") not in (None, "0")
        assert last_t is not None
        assert page.evaluate("window.__noReload") == "still here"
        for tile in ("progress", "throughput", "timeouts", "errors", "empty_reasoning"):
            assert page.locator(f'[data-tile="{tile}"]').count() == 1, tile

        # window switch: the whole run
        page.locator('#run-charts a[data-window="all"]').click()
        page.wait_for_selector('#run-charts[data-window="all"]')

        # pause: the page shows it within 2 s and the worker stops claiming
        page.locator('button[data-control="pause"]').click()
        page.wait_for_selector('[data-testid="control-message"]:has-text("Pause requested")', timeout=2000)
        page.wait_for_selector('[data-testid="run-status"]:has-text("paused")', timeout=2000)
        wait_for(lambda: run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=20, what="in-flight drained")
        paused_ok = run_row(engine, bg.run_id)["n_ok"]
        time.sleep(1.5)
        row_now = run_row(engine, bg.run_id)
        assert (row_now["status"], row_now["desired"], row_now["n_ok"]) == ("paused", "pause", paused_ok)
        page.locator('button[data-control="resume"]').click()
        page.wait_for_selector('[data-testid="run-status"]:has-text("running")', timeout=2000)

        # a lower cap: the worker never goes past it
        cap = run_row(engine, bg.run_id)["n_ok"] + 6
        page.locator("#cap-input").fill(str(cap))
        page.locator('button[data-control="cap"]').click()
        page.wait_for_selector(f'[data-testid="control-message"]:has-text("Cap set: {cap}")', timeout=2000)
        assert run_row(engine, bg.run_id)["cap"] == cap
        page.wait_for_selector('#run-stats:has-text("to cap")', timeout=2000)

        # stop (graceful, confirmed in a dialog)
        page.locator('button[data-control="stop"]').click()
        # within 2 s the page shows the request ("asked: stop") or already the final status
        page.wait_for_selector('#run-stats .status-line:has-text("stop")', timeout=2000)
        assert bg.join(30) in ("stopped", "completed")
        final = run_row(engine, bg.run_id)
        assert final["status"] in ("stopped", "completed") and final["n_ok"] <= cap and final["n_in_flight"] == 0
        with engine.connect() as conn:
            over = conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND status = 'ok'"),
                                {"r": bg.run_id}).scalar_one()
        assert over == final["n_ok"] <= cap

        # the page settles: final status shown, polling stops, controls off, audit log lists every action
        page.wait_for_selector('#run-stats[data-live="false"]', timeout=5000)
        page.wait_for_selector('[data-testid="controls-ended"]', timeout=5000)
        assert page.locator("#run-stats").get_attribute("hx-trigger") is None
        actions = page.locator("#run-audit tr[data-action]").evaluate_all("rows => rows.map(r => r.dataset.action)")
        for a in ("pause", "resume", "cap", "stop"):
            assert a in actions, actions
        audit_text = page.locator("#run-audit").inner_text()
        assert re.search(r"\d\d:\d\d:\d\d", audit_text)
        assert page.evaluate("window.__noReload") == "still here"
    finally:
        if bg.thread.is_alive():
            store.apply_control(engine, bg.run_id, "stop_now")
            bg.join(30)


def test_start_run_form_in_browser(page, browser_problems, live_app, engine, sim, prompts,  # type: ignore[no-untyped-def]
                                   tmp_path) -> None:
    srv = live_app(launch_dataset_dirs=str(tmp_path))
    url = sim(seed=1)
    page.goto(f"{srv.url}/runs/new")
    page.fill('input[name="name"]', "browser-form")
    page.fill('input[name="dataset"]', str(tmp_path / "missing.jsonl"))
    page.fill('textarea[name="endpoints"]', url)
    page.fill('input[name="model"]', "sim-reasoner")
    with page.expect_response(lambda r: r.url.endswith("/runs/new") and r.request.method == "POST") as resp:
        page.locator('[data-testid="start-run"]').click()
    assert resp.value.status == 400
    assert "does not exist" in page.locator('[data-testid="form-error"]').inner_text()
    # this 400 is the expected answer to bad input, not a browser problem
    page.wait_for_timeout(200)  # let the console message for the 400 arrive
    expected = [f"HTTP 400: POST {srv.url}/runs/new",
                "console.error: Failed to load resource: the server responded with a status of 400 (Bad Request)"]
    assert expected[0] in browser_problems
    for p in expected:
        if p in browser_problems:
            browser_problems.remove(p)
    assert page.input_value('input[name="name"]') == "browser-form"  # the form kept what was typed
    page.fill('input[name="dataset"]', str(prompts(4)))
    page.locator('[data-testid="start-run"]').click()
    page.wait_for_url(re.compile(r".*/runs/\d+$"), timeout=30_000)
    page.wait_for_selector('[data-testid="run-status"]:has-text("completed")', timeout=30_000)
    assert page.locator('[data-testid="n-ok"]').inner_text() == "4"


def test_a_page_without_the_layout_asks_for_no_missing_icon(page, browser_problems, live_app) -> None:  # type: ignore[no-untyped-def]
    """A fragment or JSON opened on its own has no <link rel=icon>: the browser then fetches /favicon.ico
    by itself, after the page has loaded, and a 404 there is a console error (a flaky hostile-page test)."""
    app = live_app()
    page.goto(f"{app.url}/healthz")
    page.wait_for_timeout(1500)  # goto does not wait for the browser's own icon request
    assert page.request.get(f"{app.url}/favicon.ico").status == 204
    assert not [p for p in browser_problems if "404" in p], browser_problems
