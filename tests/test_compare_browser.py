"""Compare like Weights & Biases (#28 item 6), in a real browser: one colour per run on every panel, rates
instead of raw counts, overlaid time series from the timeseries API, a settings diff, and a live refresh that
polls only while either run is live."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STROKES = """(sel) => Array.from(document.querySelectorAll(sel)).map(cell => {
  const u = cell._uplot; return u.series.slice(1).map((s, i) => typeof s.stroke === 'function' ? s.stroke(u, i + 1) : s.stroke); })"""


def _css_var(page: Page, name: str) -> str:
    return str(page.evaluate(f"getComputedStyle(document.documentElement).getPropertyValue('{name}').trim()"))


def _rgb(page: Page, color: str) -> str:
    return str(page.evaluate("(c) => { const d = document.createElement('i'); d.style.color = c; document.body.append(d);"
                             " const v = getComputedStyle(d).color; d.remove(); return v; }", color))


def test_compare_a_finished_and_a_live_run(page: Page, live_app: Any, engine: Any, sim: Any, prompts: Any) -> None:
    fast = sim(seed=83, reasoning_tokens="20-40", content_tokens="5-10", rate_429=0.2)
    slow = sim(seed=84, ttft_ms=80, reasoning_tokens="20-40", content_tokens="5-10")
    done = CheckedBackground(engine, make_config(fast, prompts(60, "a.jsonl"), name="run-done", concurrency=4,
                                                 sampling={"max_tokens": 80})).start()
    assert done.join(60) == "completed"
    live = CheckedBackground(engine, make_config(slow, prompts(5000, "b.jsonl"), name="run-live", concurrency=2,
                                                 sampling={"max_tokens": 120})).start()
    try:
        wait_for(lambda: run_row(engine, live.run_id)["n_ok"] >= 20, what="the live run's first records")
        srv = live_app()
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.goto(f"{srv.url}/compare?run={done.run_id}&run={live.run_id}")
        a_color, b_color = _rgb(page, _css_var(page, "--run-a")), _rgb(page, _css_var(page, "--run-b"))
        assert a_color != b_color

        # one colour per run: the column heads' swatches, the overlaid series and the length histograms
        for side, color in (("a", a_color), ("b", b_color)):
            for sw in page.get_by_test_id(f"swatch-{side}").all():
                assert sw.evaluate("e => getComputedStyle(e).backgroundColor") == color
        page.locator('[data-compare-chart="checks"] canvas').wait_for()
        page.locator('#lengths [data-hist="output"] canvas').wait_for()
        series = page.evaluate(STROKES, "[data-compare-chart]")
        hists = page.evaluate(STROKES, "#lengths [data-hist]")
        assert len(series) == 3 and len(hists) == 3
        for strokes in series:  # A's series first (one per metric), then B's
            half = len(strokes) // 2
            assert {_rgb(page, c) for c in strokes[:half]} == {a_color}
            assert {_rgb(page, c) for c in strokes[half:]} == {b_color}
        for strokes in hists:
            assert [_rgb(page, c) for c in strokes] == [a_color, b_color]

        # overlaid: both runs have points on the same axis of minutes since their own start
        data = page.evaluate("() => document.querySelector('[data-compare-chart=\"throughput\"]')._uplot.data")
        assert sum(v is not None for v in data[1]) >= 1 and sum(v is not None for v in data[2]) >= 1
        assert data[0][0] <= 0.1  # both start at 0 minutes

        # rates, not raw counts: retries and 429s per 100 finished records; "now" is filled for the live run
        api = httpx.get(f"{srv.url}/api/compare", params=[("run", done.run_id), ("run", live.run_id)]).json()
        rows = {r["key"]: r for r in api["rows"]}
        assert "retries" not in rows and "http_429" not in rows
        assert rows["http_429_per_100"]["a"] is not None and rows["retries_per_100"]["a"] > 0
        expect(page.locator('tr[data-row="retries_per_100"] td[data-side="a"]')).to_have_text(
            f"{rows['retries_per_100']['a']:.2f} per 100")
        expect(page.locator('tr[data-row="ok_per_s_now"] td[data-side="b"]')).not_to_have_text("–")
        expect(page.locator('tr[data-row="ok_per_s_now"] td[data-side="a"]')).to_have_text("–")  # ended

        # the settings diff: A → B, the run names aside
        diff = page.get_by_test_id("settings-diff")
        expect(diff).to_contain_text("sampling.max_tokens: 80 → 120")
        assert "name:" not in diff.inner_text()

        # live refresh while a run is live: the live run's count moves without a reload
        body = page.get_by_test_id("compare-body")
        expect(body).to_have_attribute("hx-trigger", "every 5s")
        ok_b = page.locator('tr[data-row="ok"] td[data-side="b"]')
        first = ok_b.inner_text()
        page.wait_for_function("(t) => document.querySelector('tr[data-row=\"ok\"] td[data-side=\"b\"]').innerText !== t",
                               arg=first, timeout=15_000)
        # both over: the next refresh is the last one
        store.apply_control(engine, live.run_id, "stop_now")
        live.join(30)
        expect(page.get_by_test_id("compare-body")).to_have_attribute("data-live", "0", timeout=15_000)
        expect(page.get_by_test_id("compare-body")).not_to_have_attribute("hx-trigger", "every 5s")
    finally:
        if live.thread.is_alive():
            store.apply_control(engine, live.run_id, "stop_now")
            live.join(30)
