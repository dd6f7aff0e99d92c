"""Review puts the record first (#28 items 2 and 3), in a real browser at 1024x768: the record text starts high
enough for 450 px of it, the next record is swapped in place from a prefetch (key to next record p95 < 150 ms),
p / ArrowLeft go back through the session, z undoes the verdict auto-advance took away, focus stays on the control
it was on, skip links reach the verdict keys and the record, all with the keyboard alone."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_review import add_record, add_run
from workerkit import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LINES = "\n".join(f"step {i}: carry the {i} and check the sum again before going on." for i in range(80))


def rec_id(page: Page) -> int:
    return int(page.locator("#rec-id").inner_text())


def review_of(srv: Any, run_id: int, rid: int) -> str | None:
    return httpx.get(f"{srv.url}/api/runs/{run_id}/records/{rid}").json()["record"]["review"]


def test_record_first_swap_prefetch_history_undo_focus(page: Page, live_app: Any, engine: Any) -> None:
    run_id = add_run(engine)
    for i in range(30):
        add_record(engine, run_id, i, reasoning=LINES, content="The answer is 4.\n" * 20)
    with engine.begin() as conn:  # the counters a worker keeps
        conn.execute(text("UPDATE run SET n_ok = 30, total = 30 WHERE id = :r"), {"r": run_id})
    srv = live_app()
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{srv.url}/runs/{run_id}/sample?mode=unreviewed")
    expect(page.locator("#rec-id")).to_be_visible()

    # the record first: the text pane starts high enough that >= 450 px of the 768 are record text
    box = page.locator("#record-text").bounding_box()
    assert box is not None
    visible = min(768, box["y"] + box["height"]) - box["y"]
    print(f"record text starts at y={box['y']:.0f}: {visible:.0f} px of it visible at 1024x768")
    assert visible >= 450, f"only {visible:.0f} px of record text visible (text starts at y={box['y']:.0f})"
    expect(page.locator("#keys-help")).to_be_hidden()  # the key list sits behind ?
    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_visible()
    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_hidden()

    # one key per record, the next swapped in place: the page never reloads, and each key-to-record time is measured
    page.evaluate("() => { window.__loads = (window.__loads || 0) + 1; window.__shown = [];"
                  " document.addEventListener('sw:record-shown', e => window.__shown.push(e.detail.ms)); }")
    seen = []
    keys = ["g", "b", "1", "g", "g", "b", "g", "2", "g", "g", "b", "g", "g", "g", "b", "g"]
    for key in keys:
        current = rec_id(page)
        seen.append(current)
        # a reviewer reads before judging: by then the next record has been prefetched
        expect(page.locator("#review[data-prefetched]")).to_have_count(1)
        page.keyboard.press(key)
        expect(page.locator("#rec-id")).not_to_have_text(str(current))
    assert page.evaluate("() => window.__loads") == 1, "a key reloaded the page"
    assert len(set(seen)) == len(keys)
    times = sorted(page.evaluate("() => window.__shown"))
    assert len(times) == len(keys)
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"key -> next record: median {times[len(times) // 2]:.0f} ms, p95 {p95:.0f} ms over {len(times)} records")
    assert p95 < 150, times
    for rid, key in zip(seen, keys, strict=True):  # every verdict reached the database
        want = "good" if key == "g" else "bad"
        wait_for(lambda rid=rid, want=want: review_of(srv, run_id, rid) == want, what=f"verdict on {rid}")
    assert f"/records/{rec_id(page)}" in page.url  # the address follows the record shown

    # the toast names the record just judged; z takes the verdict back
    last = seen[-1]
    expect(page.locator("#review-toast")).to_have_text(f"flagged #{last} good · undo (z)")
    page.keyboard.press("z")
    expect(page.locator("#review-toast")).to_contain_text(f"undone: #{last}")
    wait_for(lambda: review_of(srv, run_id, last) is None, what="the undo")

    # p and ArrowLeft: back through the session's records, in order
    page.keyboard.press("p")
    expect(page.locator("#rec-id")).to_have_text(str(seen[-1]))
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#rec-id")).to_have_text(str(seen[-2]))
    expect(page.locator("#verdict")).to_contain_text("bad")  # its verdict as stored, not as prefetched

    # the keyboard alone: Tab reaches the skip links first; the first leads to the verdict keys
    page.goto(page.url)
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to the verdict keys")
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_id("flag-good")
    before = rec_id(page)
    page.keyboard.press("Enter")  # the focused Good button: verdict, then the next record swapped in
    expect(page.locator("#rec-id")).not_to_have_text(str(before))
    expect(page.locator(":focus")).to_have_id("flag-good")  # focus returns to the swapped control
    wait_for(lambda: review_of(srv, run_id, before) == "good", what="the verdict by Enter")
    page.goto(page.url)
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to the record")
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_id("record-text")
