"""Charts you can read and query, length histograms and the compare page, in a real browser (#19 items 8-10).

A real worker writes a real SQLite file from the simulator; the dashboard runs on a real port; charts.js draws
with uPlot from the JSON API. The conftest's problem checks fail a test on any JS error or HTTP >= 400.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import Page, expect
from test_checks_kit import CheckedBackground
from workerkit import Background, make_config, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser

CHART_JS = "sel => { const u = document.querySelector(sel)._uplot; return {min: u.scales.x.min, max: u.scales.x.max}; }"


def _scale(page: Page, chart: str) -> dict[str, float]:
    return page.evaluate(CHART_JS, f'#run-charts [data-chart="{chart}"]')  # type: ignore[no-any-return]


def _legend(page: Page, chart: str, label: str) -> str:
    row = page.locator(f'#run-charts [data-chart="{chart}"] .u-legend .u-series', has_text=label).first
    return row.locator(".u-value").inner_text()


def _ok_span_s(engine: Any, run_id: int) -> float:
    """Seconds between the run's first and last ok record: the data the charts' buckets hold."""
    from sqlalchemy import text

    with engine.connect() as conn:
        span = conn.execute(text("SELECT MAX(finished_at) - MIN(finished_at) FROM record WHERE run_id = :r"
                                 " AND status = 'ok'"), {"r": run_id}).scalar()
    return float(span or 0.0)


# Over 30 s under load (~40 s with -n 2): a live run long enough for the charts to have several 5-s buckets, then
# hover, zoom, Back/Forward and reload in a real browser; the buckets are the time.
def test_charts_hover_zoom_text_and_url(page: Page, live_app: Any, engine: Any, sim: Any, prompts: Any) -> None:
    url = sim(tokens_per_s=200, seed=81, reasoning_tokens="20-60", content_tokens="10-30")
    bg = Background(engine, make_config(url, prompts(100_000), name="charts-run", concurrency=4)).start()
    srv = live_app()
    timeseries: list[str] = []
    page.on("request", lambda r: "/timeseries" in r.url and timeseries.append(r.url))
    try:
        # three 5 s buckets of data, then stop: the chart's values no longer move under the cursor
        wait_for(lambda: _ok_span_s(engine, bg.run_id) >= 12, timeout_s=120, what="12 s of ok records")
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        page.locator('#run-charts [data-chart="requests"] canvas').wait_for()
        assert "&since=" not in timeseries[0]
        page.wait_for_timeout(10_500)  # one live poll: it asks only for the buckets that can still change
        assert any("&since=" in u for u in timeseries), timeseries
        store.apply_control(engine, bg.run_id, "stop_now")
        assert bg.join(30) == "stopped"
        page.reload()
        page.locator('#run-charts [data-chart="requests"] canvas').wait_for()

        # text on screen: titles, legends and axis labels at least 11 px
        sizes = page.evaluate("""() => {
            const out = [];
            for (const el of document.querySelectorAll('#run-charts .u-title, #run-charts .u-legend, #lengths .u-title'))
                out.push(parseFloat(getComputedStyle(el).fontSize));
            for (const cell of document.querySelectorAll('#run-charts [data-chart]'))
                for (const a of cell._uplot.axes) out.push(a.font[1] / uPlot.pxRatio);
            return out; }""")
        assert len(sizes) >= 20 and min(sizes) >= 11, sizes

        # hover: the legend shows the exact value of the bucket under the cursor (checked against the API)
        ts = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/timeseries", params={"window": "5m"}).json()
        by_mid = {p["t"] + ts["bucket_s"] / 2: p for p in ts["points"]}
        over = page.locator('#run-charts [data-chart="requests"] .u-over')
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        assert box
        busiest = max(ts["points"], key=lambda p: p["ok_s"])
        x = page.evaluate("([sel, v]) => document.querySelector(sel)._uplot.valToPos(v, 'x')",
                          ['#run-charts [data-chart="requests"]', busiest["t"] + ts["bucket_s"] / 2])
        page.mouse.move(box["x"] + x, box["y"] + box["height"] / 2)
        idx_t = page.evaluate("sel => { const u = document.querySelector(sel)._uplot; return u.data[0][u.cursor.idx]; }",
                              '#run-charts [data-chart="requests"]')
        point = by_mid[idx_t]
        shown = _legend(page, "requests", "ok/s")
        assert shown != "–" and float(shown.replace(",", "")) == pytest.approx(point["ok_s"], abs=0.006), (shown, point)
        shown = _legend(page, "tokens", "all output tok/s")  # the cursor is shared by every chart
        assert float(shown.replace(",", "")) == pytest.approx(point["tok_s"], rel=0.01, abs=0.06), (shown, point)

        # drag across a chart: every chart zooms to that range, and the URL keeps it
        full = _scale(page, "latency")
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 40)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 60, steps=5)
        page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + 60, steps=5)
        page.mouse.up()
        zoomed = _scale(page, "latency")
        span, zspan = full["max"] - full["min"], zoomed["max"] - zoomed["min"]
        assert 0.3 * span < zspan < 0.5 * span, (full, zoomed)
        assert _scale(page, "requests") == zoomed
        expect(page.locator("[data-reset-zoom]")).to_be_visible()
        q = parse_qs(urlparse(page.url).query)
        assert q["window"] == ["5m"] and abs(float(q["from"][0]) - zoomed["min"]) <= 1
        page.reload()  # the zoom survives a reload
        page.locator('#run-charts [data-chart="requests"] canvas').wait_for()
        again = _scale(page, "failures")
        assert abs(again["min"] - zoomed["min"]) <= 1 and abs(again["max"] - zoomed["max"]) <= 1
        page.locator("[data-reset-zoom]").click()
        assert _scale(page, "requests") == pytest.approx(full)
        assert "from=" not in page.url

        # the window is kept in the URL across a reload
        page.locator('#run-charts .windows a[data-window="1h"]').click()
        expect(page).to_have_url(f"{srv.url}/runs/{bg.run_id}?window=1h")
        page.reload()
        expect(page.locator("#run-charts")).to_have_attribute("data-window", "1h")
        page.locator('#run-charts [data-chart="requests"] canvas').wait_for()
        assert "window=1h" in timeseries[-1]
        page.locator('#run-charts .windows a[data-window="all"]').click()
        expect(page).to_have_url(f"{srv.url}/runs/{bg.run_id}?window=all")
        page.go_back()  # Back: the window of that URL again
        expect(page.locator("#run-charts")).to_have_attribute("data-window", "1h")
        expect(page.locator('#run-charts .windows a[data-window="1h"]')).to_have_class("active")
        page.wait_for_timeout(500)
        assert "window=1h" in timeseries[-1]

        # a run that is over is not polled
        n = len(timeseries)
        page.wait_for_timeout(11_000)
        assert len(timeseries) == n, timeseries[n:]
    finally:
        if bg.thread.is_alive():
            store.apply_control(engine, bg.run_id, "stop_now")
            bg.join(30)


def _hist(page: Page, kind: str) -> dict[str, Any]:
    return page.evaluate("""kind => {
        const cell = document.querySelector('#lengths [data-hist="' + kind + '"]');
        const u = cell._uplot;
        return {limit: cell.getAttribute('data-limit'), counts: u.data[1], records: document.querySelector('#lengths').getAttribute('data-records')};
    }""", kind)  # type: ignore[no-any-return]


def test_histograms_show_truncation_and_follow_the_filter(page: Page, live_app: Any, engine: Any, sim: Any,
                                                         prompts: Any) -> None:
    # reasoning 20-120 tokens with max_tokens 64: about half the records are cut inside their reasoning
    url = sim(tokens_per_s=0, seed=82, reasoning_tokens="20-120", content_tokens="5-10")
    config = make_config(url, prompts(80), name="cut-run", concurrency=8, sampling={"max_tokens": 64})
    bg = Background(engine, config).start()
    assert bg.join(60) == "completed"
    with engine.connect() as conn:
        from sqlalchemy import text

        cut = conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND completion_tokens >= 64"),
                           {"r": bg.run_id}).scalar_one()
        length = conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND finish_reason = 'length'"),
                              {"r": bg.run_id}).scalar_one()
    assert 10 < cut < 70 and length == cut
    srv = live_app()
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(f"{srv.url}/runs/{bg.run_id}")
    page.locator('#lengths [data-hist="output"] canvas').wait_for()
    expect(page.locator("#lengths [data-hist-note]")).to_contain_text(f"{cut} at max_tokens = 64")
    out = _hist(page, "output")
    assert out["limit"] == str(cut) and out["counts"][-1] == cut and out["records"] == "80"
    assert _hist(page, "reasoning")["counts"][-1] > 0  # cut inside the reasoning: all 64 tokens are reasoning
    # the bar at the limit: hovering it names the bin and its count
    cell = page.locator('#lengths [data-hist="output"]')
    cell.scroll_into_view_if_needed()
    box = cell.locator(".u-over").bounding_box()
    assert box
    x = page.evaluate("v => document.querySelector('#lengths [data-hist=\"output\"]')._uplot.valToPos(v, 'x')",
                      len(out["counts"]) - 1)
    page.mouse.move(box["x"] + x, box["y"] + box["height"] - 5)
    legend = cell.locator(".u-legend").inner_text()
    assert "64+ (max_tokens)" in legend and str(cut) in legend, legend

    # the x ticks fall on round numbers: bin edges every 1, 2 or 5 x 10^k tokens, the limit bar last (#28)
    for kind in ("reasoning", "content", "output"):
        labels = [v for v in page.evaluate(
            "k => document.querySelector('#lengths [data-hist=\"' + k + '\"]')._uplot.axes[0]._values", kind) if v]
        assert labels[0] == "0" and labels[-1] == "64+", (kind, labels)
        edges = [int(v.replace(",", "")) for v in labels[:-1]]
        steps = {b - a for a, b in zip(edges, edges[1:], strict=False)}
        assert len(steps) == 1 and len(edges) >= 3, (kind, labels)
        step = steps.pop()
        assert int(str(step)[0]) in (1, 2, 5) and set(str(step)[1:]) <= {"0"}, (kind, labels)

    # the records table's filter: the histogram follows it as it changes
    page.goto(f"{srv.url}/runs/{bg.run_id}/records")
    page.locator('#lengths [data-hist="output"] canvas').wait_for()
    expect(page.locator("#lengths")).to_have_attribute("data-records", "80")
    page.locator('select[name="finish_reason"]').select_option("length")
    expect(page.locator("#lengths")).to_have_attribute("data-records", str(cut))
    out = _hist(page, "output")
    assert out["counts"][-1] == cut and sum(out["counts"][:-1]) == 0
    page.locator('select[name="finish_reason"]').select_option("stop")
    expect(page.locator("#lengths")).to_have_attribute("data-records", str(80 - cut))
    assert _hist(page, "output")["counts"][-1] == 0


def test_compare_two_runs(page: Page, live_app: Any, engine: Any, sim: Any, prompts: Any) -> None:
    fast = sim(tokens_per_s=0, seed=83, reasoning_tokens="20-40", content_tokens="5-10")
    slow = sim(tokens_per_s=0, ttft_ms=150, seed=84, reasoning_tokens="60-90", content_tokens="5-10",
               rate_empty_reasoning=0.5)
    ids = []
    for name, url, n in (("run-fast", fast, 40), ("run-slow", slow, 30)):
        bg = CheckedBackground(engine, make_config(url, prompts(n, f"{name}.jsonl"), name=name, concurrency=8,
                                                   sampling={"max_tokens": 80})).start()
        assert bg.join(60) == "completed"
        ids.append(bg.run_id)
    srv = live_app()
    page.set_viewport_size({"width": 1400, "height": 1000})
    # pick two in the runs list
    page.goto(f"{srv.url}/runs")
    for rid in ids:
        page.locator(f"#compare-{rid}").check()
    page.locator("#compare-runs").click()
    page.wait_for_url("**/compare?**")
    picked = [int(v) for v in parse_qs(urlparse(page.url).query)["run"]]
    assert sorted(picked) == ids
    page.goto(f"{srv.url}/compare?run={ids[0]}&run={ids[1]}")  # A: the fast run, B: the slow one
    api = httpx.get(f"{srv.url}/api/compare", params=[("run", ids[0]), ("run", ids[1])]).json()
    expect(page.get_by_test_id("run-1")).to_contain_text("run-fast")
    expect(page.get_by_test_id("run-2")).to_contain_text("run-slow")
    ok = page.locator('tr[data-row="ok"] td')
    expect(ok.nth(0)).to_have_text("40")
    expect(ok.nth(1)).to_have_text("30")
    rows = {r["key"]: r for r in api["rows"]}
    assert rows["empty_reasoning_pct"]["a"] == 0 and rows["empty_reasoning_pct"]["b"] > 20
    assert rows["empty_reasoning_pct"]["worse"] == "b"
    b_empty = page.locator('tr[data-row="empty_reasoning_pct"] td[data-side="b"]')
    expect(b_empty).to_have_class("num worse")
    expect(b_empty).to_have_text(f"{rows['empty_reasoning_pct']['b']:.2f}%")
    expect(page.locator('tr[data-row="latency_p50_s"] td[data-side="b"]')).not_to_have_text("–")
    # check rates of both runs, and both runs' length histograms in one chart per kind
    checks = {c["name"]: c for c in api["checks"]}
    b_rate = checks["empty_reasoning"]["b"]["rate"] * 100
    expect(page.locator('#compare-checks tr[data-check="empty_reasoning"] td').nth(1)).to_contain_text(f"{b_rate:.2f}%")
    page.locator('#lengths [data-hist="reasoning"] canvas').wait_for()
    expect(page.locator("#lengths")).to_have_attribute("data-records", "40,30")
    legend = page.locator('#lengths [data-hist="reasoning"] .u-legend').inner_text()
    assert "A run-fast" in legend and "B run-slow" in legend
    zero = page.evaluate("() => document.querySelector('#lengths [data-hist=\"reasoning\"]')._uplot.data.map(s => s[0])")
    assert zero[1] == 0 and zero[2] > 20  # half the slow run's reasoning never arrived: a pile at zero, in %
    # from a run page: "Compare with…" picks the first run, then a second is chosen
    page.goto(f"{srv.url}/runs/{ids[0]}")
    page.get_by_test_id("compare-link").click()
    page.get_by_test_id("pick-b").select_option(str(ids[1]))
    page.get_by_role("button", name="Compare", exact=True).click()
    expect(page.get_by_test_id("run-2")).to_contain_text("run-slow")
