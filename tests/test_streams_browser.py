"""The streams in flight on the run page and at /api/runs/{id}/streams (#36): text the simulator is sending shows
while no record has finished, and it updates; one stream opened is watched as it is written."""

from __future__ import annotations

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S
from playwright.sync_api import Page, expect
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser


def _api(srv_url: str, run_id: int) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{srv_url}/api/runs/{run_id}/streams", timeout=HTTP_TIMEOUT_S).json()


def test_streams_panel_shows_text_in_flight_and_updates(page: Page, engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    # slow and long: no record finishes while the test looks (about 2,000 reasoning tokens at 20 tokens/s)
    url = sim(reasoning_field="reasoning", seed=7, tokens_per_s=20, ttft_ms=200, reasoning_tokens="2000-2400",
              content_tokens="50-60")
    config = make_config(url, prompts(20), concurrency=4, reasoning={"mode": "reasoning"},
                         timeouts={"connect_s": 10, "total_s": 600, "idle_s": 60})
    bg = CheckedBackground(engine, config).start()
    try:
        srv = live_app()
        got = wait_for(lambda: (d := _api(srv.url, bg.run_id))["streams"] and all(s["reasoning"] for s in d["streams"])
                       and len(d["streams"]) == 4 and d, timeout_s=30, what="4 streams with text")
        s0 = got["streams"][0]
        assert got["n_in_flight"] == 4 and s0["field"] == "reasoning" and s0["reasoning_field"] == "reasoning"
        assert s0["endpoint"] and s0["tokens"] > 0 and s0["age_s"] > 0 and len(s0["reasoning"]) <= 300
        assert run_row(engine, bg.run_id)["n_ok"] == 0

        page.goto(f"{srv.url}/runs/{bg.run_id}")
        panel = page.get_by_test_id("streams-panel")
        expect(panel).to_be_visible()
        page.locator("#run-streams summary").click()
        rows = page.locator("[data-stream-row]")
        expect(rows).to_have_count(4, timeout=15_000)
        first = rows.first.locator(".stream-tail pre").first
        expect(first).not_to_have_text("", timeout=10_000)
        seen = first.inner_text()
        assert seen.strip() and seen.strip() in _api(srv.url, bg.run_id)["streams"][0]["reasoning"] + seen
        # it updates: the text moves on with the stream, the page is not reloaded
        page.evaluate("window.__same = true")
        expect(first).not_to_have_text(seen, timeout=15_000)
        assert page.evaluate("window.__same") is True

        # open one stream and watch it being written
        rid = rows.first.get_attribute("data-stream-row")
        rows.first.locator("[data-watch-stream]").click()
        one = page.get_by_test_id("stream-one")
        expect(one).to_have_attribute("data-stream", str(rid), timeout=10_000)
        text = one.locator("pre").first
        expect(text).not_to_have_text("", timeout=10_000)
        before = text.inner_text()
        expect(text).not_to_have_text(before, timeout=10_000)
        assert len(text.inner_text()) <= 300
        assert run_row(engine, bg.run_id)["n_ok"] == 0  # all of it while no record had finished
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
