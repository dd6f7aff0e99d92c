"""A finished run with a stretch of bad records, in a real browser (#26 item 2): the run page's tiles show the
whole run's rate, the open item is listed and can be accepted with a reason, the charts shade the alarm's span,
and the runs list counts the open problem. A real worker, the simulator, a real SQLite file and chromium."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from test_open_items import _failing, _item, stretch_run

from synthwatch.app.words import check_label

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# the colour of the canvas at (x, a few px under the plot's top) in one chart: the band sits behind the series
PIXEL_JS = """([sel, t]) => {
  const u = document.querySelector(sel)._uplot;
  const x = Math.round(u.valToPos(Math.min(Math.max(t, u.scales.x.min), u.scales.x.max), 'x', true));
  const y = Math.round(u.bbox.top + 3 * uPlot.pxRatio);
  const d = u.ctx.getImageData(x, y, 1, 1).data;
  return [d[0], d[1], d[2]];
}"""


def test_finished_run_page_shows_the_whole_run_the_span_and_the_open_item(page: Page, live_app: Any, engine: Any,
                                                                        sim: Any, prompts: Any) -> None:
    # slowed down so that the run spans several 5 s buckets of the charts
    run_id, _url, _span = stretch_run(engine, sim, prompts, "browser-stretch", clean=60, bad=80, after=160,
                                      ttft_ms=150)
    bad = _failing(engine, run_id)
    item = _item(engine, run_id)
    srv = live_app()
    stats = httpx.get(f"{srv.url}/api/runs/{run_id}/stats", timeout=30).json()
    tile = next(t for t in stats["tiles"] if t["key"] == "empty_reasoning")
    assert tile["value"] != "0.0%" and "whole run" in tile["title"]

    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(f"{srv.url}/runs/{run_id}")
    t = page.locator('[data-tile="empty_reasoning"]')
    expect(t).to_have_attribute("data-level", "bad")
    expect(t).to_contain_text("whole run")
    expect(t).to_contain_text(tile["value"])
    row = page.locator(f'[data-testid="open-item"][data-item-id="{item["id"]}"]')
    expect(row).to_contain_text(f"{len(bad)} records failed {check_label('empty_reasoning')} between")  # labels (#37)

    # the alarm's span, shaded behind the series of every chart, and named in words under them
    page.locator('#run-charts [data-chart="requests"] canvas').wait_for()
    charts = page.locator("#run-charts")
    expect(charts).not_to_have_attribute("data-alarm-spans", "0")
    expect(page.locator('[data-testid="alarm-spans"]')).to_contain_text("Empty reasoning")
    ts = httpx.get(f"{srv.url}/api/runs/{run_id}/timeseries", params={"window": "all"}, timeout=30).json()
    [span] = [a for a in ts["alarms"] if a["rule"] == "empty_reasoning"]
    page.locator('#run-charts .windows a[data-window="all"]').click()
    page.wait_for_timeout(500)
    sel = '#run-charts [data-chart="requests"]'
    inside = page.evaluate(PIXEL_JS, [sel, (span["t0"] + span["t1"]) / 2])
    assert inside[0] - inside[1] >= 10, f"no red band in the alarm's span: {inside}"
    scale = page.evaluate("sel => { const u = document.querySelector(sel)._uplot; return [u.scales.x.min,"
                          " u.scales.x.max]; }", sel)
    if scale[1] - span["t1"] > 6:  # a clean stretch after the span on the chart: no band there
        outside = page.evaluate(PIXEL_JS, [sel, (span["t1"] + scale[1]) / 2])
        assert abs(outside[0] - outside[1]) < 10, f"a band outside the alarm's span: {outside}"

    # the runs list counts it under Problems
    page.goto(f"{srv.url}/runs")
    problems = page.locator(f'tr[data-run-id="{run_id}"] td.col-opt').nth(1)
    expect(problems).to_contain_text("open problem")

    # accepting from the run page: the reason is required, then the item is gone and the audit log says who
    page.goto(f"{srv.url}/runs/{run_id}")
    n = page.locator('[data-testid="open-item"]').count()
    assert n >= 1
    for _ in range(n):  # the page reloads after each: take the first one left
        iid = page.locator('[data-testid="open-item"]').first.get_attribute("data-item-id")
        page.locator(f'[data-testid="accept-{iid}"]').click()  # empty reason: the browser keeps the form
        assert page.locator(f'[data-testid="accept-reason-{iid}"]').evaluate("e => e.validity.valueMissing")
        page.locator(f'[data-testid="accept-reason-{iid}"]').fill("known server incident, kept for analysis")
        page.locator(f'[data-testid="accept-{iid}"]').click()
        expect(page.locator('[data-testid="control-message"]')).to_contain_text("Accepted:")
    expect(page.locator('[data-testid="open-items"]')).to_have_count(0)
    expect(page.locator('[data-tile="empty_reasoning"]')).not_to_have_attribute("data-level", "bad")
    page.goto(f"{srv.url}/runs")
    expect(page.locator(f'tr[data-run-id="{run_id}"] td.col-opt').nth(1)).not_to_contain_text("open problem")
