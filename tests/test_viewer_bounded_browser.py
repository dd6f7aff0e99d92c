"""Viewing is bounded (#34), in a real browser: a 3 Mi-character answer shows its first window, "Show the next"
appends the next window in place (htmx, no reload) with a button for the one after, and the download link is there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from test_viewer_bounded import huge_record

from synthwatch.review.display import VIEW_WINDOW_CHARS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_next_window_of_a_long_answer_comes_on_demand(page: Page, live_app: Any, db_path: Path) -> None:
    run_id, rid, content = huge_record(db_path, 3 * VIEW_WINDOW_CHARS - 1000, 1000)
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/records/{rid}")
    side = page.locator("#side-content")
    expect(side.locator("[data-text-window]")).to_contain_text(
        f"Showing the first {VIEW_WINDOW_CHARS:,} of {len(content):,} characters")
    expect(side.locator("a[data-download]")).to_have_attribute("href", f"/runs/{run_id}/records/{rid}/download/content")

    def shown() -> str:
        return side.locator("pre.text").evaluate(
            "pre => Array.from(pre.querySelectorAll('span.chunk')).map(s => s.textContent).join('')")

    assert shown() == content[:VIEW_WINDOW_CHARS]
    side.locator("[data-next-chunk]").click()
    expect(side.locator("[data-next-chunk]")).to_contain_text(f"({len(content) - 2 * VIEW_WINDOW_CHARS:,} left)")
    assert shown() == content[: 2 * VIEW_WINDOW_CHARS]
    side.locator("[data-next-chunk]").click()
    expect(side.locator("[data-next-chunk]")).to_have_count(0)
    assert shown() == content
