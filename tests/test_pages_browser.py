"""Pages a person opens from the top bar, in a real browser: the API page and the checks help."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser


def test_api_link_opens_a_readable_page(page: Page, live_app) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    page.goto(f"{srv.url}/runs")
    page.get_by_role("link", name="API", exact=True).click()
    # Swagger UI from npm, under the dashboard's own CSP (a blocked script or style is a console error: the
    # conftest's problem checker fails the test on it), with no request leaving the machine
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("synthwatch", timeout=10_000)
    expect(page.locator(".opblock-summary-path", has_text="/api/runs/{run_id}/stats").first).to_be_visible()


def test_checks_help_rows_are_linked_by_name(page: Page, live_app) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    page.goto(f"{srv.url}/help/checks#check-empty_reasoning")
    row = page.locator("#check-empty_reasoning")
    expect(row).to_be_in_viewport()
    expect(row.locator("th")).to_have_text("Empty reasoning")
