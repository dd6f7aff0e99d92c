"""The records table's selection (#28 item 4) in a real browser: row checkboxes, a sticky "N selected" bar that
flags the ticked records (one flag each) and sends them to the repair page's re-run preview, bulk-by-filter beside
the match count, and nothing wider than the screen at 390 px."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_review import add_record, add_run
from workerkit import wait_for

pytestmark = pytest.mark.browser


def test_select_rows_flag_and_rerun(page: Page, live_app: Any, engine: Any) -> None:
    run_id = add_run(engine)
    ids = [add_record(engine, run_id, i) for i in range(12)]
    with engine.begin() as conn:
        conn.execute(text("UPDATE run SET n_ok = 12, total = 12 WHERE id = :r"), {"r": run_id})
    pending = add_record(engine, run_id, 99, status="pending", reasoning=None, content=None, completion_tokens=None)
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/records")
    # the default view: finished records, newest first (a live run's pending rows are one choice away)
    expect(page).to_have_url(f"{srv.url}/runs/{run_id}/records?status=finished")
    expect(page.locator("#records tbody tr").first).to_have_attribute("data-record-id", str(ids[-1]))
    expect(page.locator(f'tr[data-record-id="{pending}"]')).to_have_count(0)
    page.locator('select[name="status"]').select_option("")
    expect(page.locator(f'tr[data-record-id="{pending}"]')).to_have_count(1)
    page.goto(f"{srv.url}/runs/{run_id}/records?status=finished")
    bar = page.locator("#selection-bar")
    expect(bar).to_be_hidden()
    picked = ids[:3]
    for rid in picked:
        page.locator(f'input.row-select[value="{rid}"]').check()
    expect(bar).to_be_visible()
    expect(page.locator("#selected-count")).to_have_text("3 selected")
    page.locator("#flag-selected-bad").click()
    expect(page.locator("#selected-done")).to_have_text("Flagged 3 records bad")
    for rid in ids:
        want = "bad" if rid in picked else None
        wait_for(lambda rid=rid, want=want: httpx.get(f"{srv.url}/api/runs/{run_id}/records/{rid}").json()["record"]
                 ["review"] == want, what=f"the flag of {rid}")
    expect(page.locator(f'tr[data-record-id="{picked[0]}"] td.flag-cell')).to_have_text("bad")  # the table redrew
    expect(page.locator(f'input.row-select[value="{picked[0]}"]')).to_be_checked()  # ... and kept the selection

    # the whole page at once, then re-run: the repair page previews exactly the ticked records
    page.locator("#select-page").check()
    expect(page.locator("#selected-count")).to_have_text("12 selected")
    page.locator("#clear-selection").click()
    expect(bar).to_be_hidden()
    for rid in picked[:2]:
        page.locator(f'input.row-select[value="{rid}"]').check()
    page.locator("#rerun-selected-button").click()
    expect(page).to_have_url(f"{srv.url}/runs/{run_id}/repair/preview")
    expect(page.locator("body")).to_contain_text("2 records")

    # bulk by filter sits beside the match count: right above it, at the top of the page, not below the histograms
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{srv.url}/runs/{run_id}/records?flag=bad")
    expect(page.locator("#records-count")).to_have_text("3 records match")
    page.locator("#bulk-by-filter").click()
    expect(page.locator("#bulk")).to_have_attribute("open", "")
    bulk, count = page.locator("#bulk").bounding_box(), page.locator("#records-count").bounding_box()
    assert bulk and count and 0 <= count["y"] - (bulk["y"] + bulk["height"]) <= 60, (bulk, count)
    expect(page.locator("#rerun-matches-button")).to_be_in_viewport()
    # ... and re-runs every match through the repair page's preview, with the filter as it is now (changed live)
    page.locator("#record-filters select[name=flag]").select_option("")
    expect(page.locator("#records-count")).to_have_text("13 records match")  # any status: the pending one too
    page.locator("#record-filters select[name=flag]").select_option("bad")
    expect(page.locator("#records-count")).to_have_text("3 records match")
    page.locator("#rerun-matches-button").click()
    expect(page).to_have_url(f"{srv.url}/runs/{run_id}/repair/preview")
    expect(page.get_by_test_id("preview-counts")).to_contain_text("3 of 3 records would be queued")


@pytest.mark.parametrize("width", [390])
def test_records_table_fits_390(page: Page, live_app: Any, engine: Any, width: int) -> None:
    run_id = add_run(engine)
    for i in range(5):
        add_record(engine, run_id, i, prompt="a long prompt " * 40)
    srv = live_app()
    page.set_viewport_size({"width": width, "height": 844})
    page.goto(f"{srv.url}/runs/{run_id}/records")
    expect(page.locator("#records")).to_be_visible()
    page.locator("input.row-select").first.check()
    expect(page.locator("#selection-bar")).to_be_visible()
    wide = page.evaluate("() => document.documentElement.scrollWidth")
    culprits = page.evaluate("w => Array.from(document.querySelectorAll('body *')).filter(e =>"
                             " e.getBoundingClientRect().right > w + 1 && !e.closest('.table-scroll'))"
                             ".slice(0, 8).map(e => e.tagName + '.' + e.className + '#' + e.id + ' '"
                             " + Math.round(e.getBoundingClientRect().right))", width)
    assert wide <= width, f"the records page is {wide} px wide at {width}: {culprits}"
