"""Repair in one step from the banner (#28 item 7), in a real browser on a real drifting run.

The simulator sends `reasoning` while the run reads `reasoning_content`: the field-mismatch alarm pauses the run.
"Apply the likely fix…" on its card previews the settings diff and the records it re-derives (writing nothing,
sending nothing), applies both on confirm through the CLI's code paths (a new config version appended; every
earlier output kept in the records' history), keeps the alarm selected, redraws the repairs row when the job ends,
and offers Resume, which runs the run to its cap with the reasoning read."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from workerkit import make_config, records, run_row, wait_for

from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _paused(engine: Any, run_id: int) -> bool:
    r = run_row(engine, run_id)
    return r["status"] == "paused" and r["n_in_flight"] == 0


def _versions(engine: Any, run_id: int) -> list[int]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT version FROM config_version WHERE run_id = :r"
                                                " ORDER BY version"), {"r": run_id})]


def test_apply_the_likely_fix_from_the_banner(page, live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=41, ttft_ms=5, reasoning_tokens="8-24", content_tokens="4-12")
    cap = 60
    config = make_config(url, prompts(300), concurrency=4, reasoning={"mode": "reasoning_content"},
                         name="one-step-fix", cap=cap)
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    srv = live_app(poll_interval_ms=500)
    try:
        wait_for(lambda: _paused(engine, run_id), timeout_s=30, what="auto-pause")
        n_ok = run_row(engine, run_id)["n_ok"]
        assert 0 < n_ok < cap
        page.goto(f"{srv.url}/runs/{run_id}")
        card = page.locator('#alarm-slot section.alarm-banner[data-rule="field_mismatch"]')
        card.wait_for()
        alarm_id = card.get_attribute("data-alarm-id")

        # the preview: the settings diff and the records, nothing written, nothing sent
        sent = httpx.get(f"{url.removesuffix('/v1')}/sim/stats").json()["chat_requests"]
        card.get_by_test_id("apply-likely-fix").click()
        page.wait_for_url(f"**/runs/{run_id}/alarms/{alarm_id}/fix")
        fix = page.get_by_test_id("likely-fix")
        expect(fix.get_by_test_id("fix-diff")).to_have_text("reasoning.mode: 'reasoning_content' → 'reasoning'")
        expect(fix.get_by_test_id("fix-counts")).to_contain_text(f"{n_ok} of {n_ok} records named by the alarm")
        expect(fix.get_by_test_id("fix-apply")).to_have_text(f"Apply: save version 2, re-derive {n_ok} records")
        assert _versions(engine, run_id) == [1]
        assert all(not r["reasoning"] for r in records(engine, run_id, "status = 'ok'"))

        # a cross-site POST of the same form is refused and changes nothing
        token = fix.locator('input[name="token"]').get_attribute("value")
        r = httpx.post(f"{srv.url}/runs/{run_id}/alarms/{alarm_id}/fix", data={"token": token},
                       headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403 and "cross-site request refused" in r.text
        assert _versions(engine, run_id) == [1]

        # confirm: a new version appended, the alarm still selected, the job's end redraws the repairs row
        fix.get_by_test_id("fix-apply").click()
        page.wait_for_url(f"**/runs/{run_id}/repair?*")
        expect(page.get_by_test_id("repair-message")).to_contain_text(
            "Config version 2: reasoning.mode 'reasoning_content' → 'reasoning'")
        expect(page.get_by_test_id("select-alarm").locator("option:checked")).to_have_attribute("value", alarm_id)
        job = page.get_by_test_id("repair-job")
        expect(job).to_have_attribute("data-state", "done", timeout=30_000)
        expect(job).to_contain_text(f"done — {n_ok} records changed of {n_ok}")
        repair_row = page.locator("#repairs tr[data-repair]").first
        expect(repair_row).to_contain_text(f"{n_ok} changed of {n_ok}")
        expect(repair_row).to_contain_text("(done)")
        expect(repair_row).not_to_contain_text("running")
        # the job's last poll carries the repairs table, so a page drawn while it ran shows the row as done too
        frag = httpx.get(f"{srv.url}/runs/{run_id}/repair/job").text
        assert 'id="repairs" hx-swap-oob="outerHTML"' in frag and f"{n_ok} changed of {n_ok}" in frag
        assert _versions(engine, run_id) == [1, 2]  # appended, never overwritten
        expect(page.locator('#versions tr[data-version="1"]')).to_be_visible()
        assert httpx.get(f"{url.removesuffix('/v1')}/sim/stats").json()["chat_requests"] == sent  # no new request
        ok = records(engine, run_id, "status = 'ok'")
        assert len(ok) == n_ok and all(r["reasoning"] for r in ok)
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT COUNT(*) FROM record_history WHERE run_id = :r AND action = 'rederive'"),
                                {"r": run_id}).scalar_one()
        assert kept == n_ok  # every earlier output kept

        # the way on: Resume, from the same page; the run goes to its cap and the alarm is gone
        page.get_by_test_id("resume-after-fix").click()
        page.wait_for_url(f"**/runs/{run_id}")
        assert bg.join(60) == "completed"
        assert run_row(engine, run_id)["n_ok"] == cap
        assert all(r["reasoning"] for r in records(engine, run_id, "status = 'ok'"))
        page.reload()
        expect(page.locator("#alarm-slot section.alarm-banner")).to_have_count(0)
    finally:
        if bg.thread.is_alive():
            store.apply_control(engine, run_id, "stop")
            bg.join(30)


def test_an_alarm_without_a_one_step_fix_says_so(page, live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=5, ttft_ms=5)
    bg = CheckedBackground(engine, make_config(url, prompts(20), concurrency=2, name="no-fix")).start()
    try:
        assert bg.join(60) == "completed"
        with engine.connect() as conn, store.write_begin(conn):
            aid = conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
                " auto_paused) VALUES (:r, 'duplicate_output', 'warning', 'Duplicate answers', 'm', 2, :t, :t, true,"
                " false) RETURNING id"), {"r": bg.run_id, "t": time.time()}).scalar_one()
        srv = live_app()
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        card = page.locator('#alarm-slot section.alarm-banner[data-rule="duplicate_output"]')
        card.wait_for()
        expect(card.get_by_test_id("apply-likely-fix")).to_have_count(0)  # the link to the repair page stays
        r = httpx.get(f"{srv.url}/runs/{bg.run_id}/alarms/{aid}/fix")
        assert r.status_code == 400 and "no fix that can be applied in one step" in r.text
    finally:
        if bg.thread.is_alive():
            store.apply_control(engine, bg.run_id, "stop")
            bg.join(30)
