"""The runs list (#28 items 5 and 9) in a real browser: filter and sort that survive the table's polls, a throughput
sparkline per live run, a short status pill with an "N checks failing" badge, and tab titles that show a pause."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = pytest.mark.browser


def _open_items(engine, run_id: int) -> None:  # type: ignore[no-untyped-def]
    t = time.time()
    with engine.connect() as conn, store.write_begin(conn):
        for check, n in (("truncated", 40), ("duplicate_output", 31)):
            conn.execute(text(
                "INSERT INTO open_item (run_id, check_name, state, opened_at, updated_at, n_records, n_excluded,"
                " n_queued, n_peak) VALUES (:r, :c, 'open', :t, :t, :n, 0, 0, :n)"), {"r": run_id, "c": check, "t": t,
                                                                                   "n": n})


def _names(page: Page) -> list[str]:
    return page.locator("#runs-table tbody tr[data-run-id] td:first-child a").all_inner_texts()


def test_runs_list_filter_sort_spark_badge_and_titles(page: Page, engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    fast = sim(seed=3)
    done = []
    for name in ("beta-done", "alpha-done"):
        bg = Background(engine, make_config(fast, prompts(6, name=f"{name}.jsonl"), concurrency=3, name=name)).start()
        assert bg.join(60) == "completed"
        done.append(bg.run_id)
    _open_items(engine, done[1])
    slow = sim(seed=4, ttft_ms=60)
    live = Background(engine, make_config(slow, prompts(5000, name="g.jsonl"), concurrency=2, name="gamma-live")).start()
    try:
        wait_for(lambda: run_row(engine, live.run_id)["n_ok"] >= 5, what="first records")
        srv = live_app()
        page.set_viewport_size({"width": 1024, "height": 768})
        page.goto(f"{srv.url}/runs")
        assert _names(page) == ["gamma-live", "alpha-done", "beta-done"]  # newest first

        # the pill is one word, what fails is a badge beside it, by the checks' labels
        alpha = page.locator(f'tr[data-run-id="{done[1]}"]')
        expect(alpha.get_by_test_id("run-state")).to_have_text("completed")
        badge = alpha.get_by_test_id("checks-failing")
        expect(badge).to_have_text("2 checks failing")
        title = badge.get_attribute("title") or ""
        assert "truncated" not in title.split(", ") and "duplicate_output" not in title, title  # labels, not ids
        assert len(title.split(", ")) == 2
        expect(page.locator(f'tr[data-run-id="{done[0]}"]').get_by_test_id("checks-failing")).to_have_count(0)

        # a sparkline for the live run only, from its time series: drawn by the table's polls once the run has two
        # 10-s buckets
        spark = page.locator(f'tr[data-run-id="{live.run_id}"] svg.spark polyline')
        expect(spark).to_have_count(1, timeout=30_000)
        assert len((spark.get_attribute("points") or "").split()) >= 2
        expect(page.locator("svg.spark")).to_have_count(1)
        assert "ok records/s" in (page.locator("svg.spark").get_attribute("aria-label") or "")

        # filter by name, then by state; the table's polls keep the filter
        page.get_by_test_id("filter-name").fill("alp")
        page.get_by_test_id("filter-name").press("Enter")
        page.wait_for_url("**/runs?q=alp*")
        assert _names(page) == ["alpha-done"]
        expect(page.get_by_test_id("runs-shown")).to_have_text("1 of 3 runs shown")
        table = page.locator("#runs-table")
        table.evaluate("el => el.dataset.polled = '1'")
        page.wait_for_function("() => !document.querySelector('#runs-table').dataset.polled", timeout=10_000)
        assert _names(page) == ["alpha-done"]
        page.goto(f"{srv.url}/runs")
        page.get_by_test_id("filter-state").select_option("live")  # applies on change
        page.wait_for_url("**/runs?*state=live*")
        assert _names(page) == ["gamma-live"]

        # sort by name, both ways
        page.goto(f"{srv.url}/runs?sort=name")
        assert _names(page) == ["alpha-done", "beta-done", "gamma-live"]
        page.get_by_test_id("order").select_option("desc")
        page.wait_for_url("**/runs?*order=desc*")
        assert _names(page) == ["gamma-live", "beta-done", "alpha-done"]

        # the tab title of a run page shows a pause and an alarm, updated by the page's polls
        page.goto(f"{srv.url}/runs/{live.run_id}")
        expect(page).to_have_title("gamma-live · synthwatch")
        store.apply_control(engine, live.run_id, "pause")
        expect(page).to_have_title("⏸ · gamma-live · synthwatch", timeout=10_000)
        store.apply_control(engine, live.run_id, "resume")
        expect(page).to_have_title("gamma-live · synthwatch", timeout=10_000)
    finally:
        store.apply_control(engine, live.run_id, "stop_now")
        live.join(30)
