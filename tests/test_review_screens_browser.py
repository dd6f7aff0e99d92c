"""The review page at the three widths of the #28 review (1024, 1440, 390 px), on records the real worker wrote
from the simulator: the record first (>= 450 px of its text in the first screen at 1024x768 and 1440x900), the
verdict keys in reach at 390 px, and no sideways scroll anywhere. UPDATE_SCREENSHOTS=1 refreshes
docs/screenshots/review.png (1440) and review-phone.png (390)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser]

SHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"


def text_in_first_screen(page: Page, height: int) -> tuple[float, float]:
    """(px of record text in the first screen, px the layout leaves for it there: from its top to the screen's end).
    The first is smaller when the record's text ends above the screen's end: the record's length, not the layout."""
    expect(page.locator("#record-text")).to_be_visible()
    box = page.locator("#record-text").bounding_box()
    assert box is not None
    return min(height, box["y"] + box["height"]) - box["y"], height - box["y"]


def test_review_page_at_1024_1440_and_390(page: Page, live_app: Any, engine: Any, sim: Any, prompts: Any) -> None:
    from workerkit import Background, make_config

    url = sim(token_ids="deepseek", reasoning_tokens="300-500", content_tokens="60-120")
    config = make_config(url, prompts(6), concurrency=3, request_token_ids=True,
                         tokenizer={"name_or_path": "deepseek-v4"})
    worker = Background(engine, config).start()
    assert worker.join(60) == "completed"
    srv = live_app()
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{srv.url}/runs/{worker.run_id}/sample?mode=unreviewed")
    expect(page.locator("#rec-id")).to_be_visible()
    first = page.locator("#rec-id").inner_text()
    page.keyboard.press("g")  # one verdict, so the toast and the progress show what a session looks like
    expect(page.locator("#review-toast")).to_contain_text(f"flagged #{first}")
    expect(page.locator("#rec-id")).not_to_have_text(first)  # the next record is in place
    for width, height, name in ((1024, 768, None), (1440, 900, "review.png"), (390, 844, "review-phone.png")):
        page.set_viewport_size({"width": width, "height": height})
        page.evaluate("() => window.scrollTo(0, 0)")
        seen, room = text_in_first_screen(page, height)
        wide = page.evaluate("() => document.documentElement.scrollWidth")
        print(f"{width}x{height}: {seen:.0f} px of record text in the first screen ({room:.0f} px left for it),"
              f" page {wide} px wide")
        assert wide <= width, f"the review page scrolls sideways at {width} px ({wide} px)"
        expect(page.locator("#flag-good")).to_be_in_viewport()
        floor = 450 if width >= 1024 else 200
        # the layout's promise: the header leaves the floor for the text (how much of it the text then fills is the
        # record's length, which the simulator draws at random: it may end above the screen's end)
        assert room >= floor, f"the header leaves only {room:.0f} px for the record text at {width}x{height}"
        assert seen > 0, f"no record text in the first screen at {width}x{height}"
        if name and os.environ.get("UPDATE_SCREENSHOTS") == "1":
            page.screenshot(path=str(SHOTS / name), full_page=False)
