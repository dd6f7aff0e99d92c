"""The screenshots of docs/screenshots for #37, taken from real runs in a real browser, in both themes: a run the
field-mismatch alarm paused (its one acknowledge control beside the fix), a finished run (finished wording), and a
32k-token record's token view with its jump links. ``UPDATE_SCREENSHOTS=1`` writes them; without it the same pages
are checked and nothing is written.

    UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_screenshots_browser.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from test_a11y_browser import axe_problems
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, run_to_end, wait_for

from synthwatch.app.words import check_label
from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
SCHEMES = ("light", "dark")


# Words of the audit log's cells drawn over more than one line ("alar m", #37); a value (column 3) may break.
BROKEN_WORDS = """() => { const out = [];
  for (const td of document.querySelectorAll('.audit table.data td:not(:nth-child(3))')) {
    const node = td.firstChild; if (!node || node.nodeType !== 3) continue;
    const s = node.nodeValue; const re = /\\S+/g; let m;
    while ((m = re.exec(s))) { const r = document.createRange(); r.setStart(node, m.index);
      r.setEnd(node, m.index + m[0].length);
      const tops = new Set(Array.from(r.getClientRects()).filter(x => x.width > 0).map(x => Math.round(x.top)));
      if (tops.size > 1) out.push(m[0]); } }
  return out; }"""


def shot(page: Page, name: str, *, full: bool = False) -> None:
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        page.screenshot(path=str(SHOTS / name), full_page=full)


def test_paused_and_finished_runs_in_both_themes(page: Page, engine: Any, sim: Any, prompts: Any,
                                                 live_app: Any) -> None:
    url = sim(reasoning_field="reasoning", seed=31, ttft_ms=5, reasoning_tokens="8-24", content_tokens="4-12")
    config = make_config(url, prompts(300), concurrency=4, reasoning={"mode": "reasoning_content"},
                         name="paused-by-an-alarm")
    bg = CheckedBackground(engine, config).start()
    done_url = sim(ttft_ms=30, seed=5)
    finished, status = run_to_end(engine, make_config(done_url, prompts(40, name="done.jsonl"), concurrency=4,
                                                      name="finished-run"))
    assert status == "completed"
    srv = live_app()
    page.set_viewport_size({"width": 1440, "height": 1000})
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused"
                 and run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=60, what="auto-pause")
        for scheme in SCHEMES:
            page.emulate_media(color_scheme=scheme)
            page.goto(f"{srv.url}/runs/{bg.run_id}")
            card = page.locator('.alarm-banner[data-rule="field_mismatch"]')
            expect(card.locator('[data-testid="ack-resume"]')).to_be_visible()
            expect(page.locator('[data-testid="ack-resume"], [data-testid="alarm-acknowledge"]')).to_have_count(1)
            expect(page.locator(".audit table.data td").first).to_be_visible()
            assert page.evaluate(BROKEN_WORDS) == []
            # the audit log names checks by their labels, not their ids (#37)
            opened = page.locator('.audit tr[data-action="open_item_opened"] td').nth(2)
            expect(opened).to_have_text(check_label("field_mismatch"))
            card.locator('[data-testid="ack-resume"] summary').click()
            expect(card.get_by_test_id("apply-likely-fix")).to_be_visible()
            # axe on the paused run with "Apply the likely fix" and the acknowledge form open (#37: 1.67:1 in dark)
            assert axe_problems(page) == [], scheme
            shot(page, f"paused-run-{scheme}.png")
            card.locator('[data-testid="ack-resume"] summary').click()

            page.goto(f"{srv.url}/runs/{finished}")
            expect(page.locator('[data-tile="throughput"] .tile-title')).to_contain_text("average over the run")
            expect(page.get_by_test_id("req-s")).not_to_have_text("0.00")
            assert axe_problems(page) == [], scheme
            shot(page, f"finished-run-{scheme}.png")
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


def test_a_32k_token_record_in_both_themes(page: Page, engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    from test_long_record_browser import make_long_record

    run_id, rid = make_long_record(engine, sim, prompts)
    srv = live_app()
    page.set_viewport_size({"width": 1440, "height": 900})
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)
        page.goto(f"{srv.url}/runs/{run_id}/records/{rid}")
        page.keyboard.press("t")
        nav = page.locator("#token-jumps")
        expect(nav).to_be_visible(timeout=60_000)
        end_think = nav.locator('a[data-jump="</think>"]')
        end_think.click()
        target = end_think.get_attribute("href") or ""
        expect(page).to_have_url(f"{srv.url}/runs/{run_id}/records/{rid}{target}")
        expect(page.locator(f"#chips {target}")).to_be_in_viewport()
        page.evaluate("() => window.scrollTo(0, document.getElementById('token-jumps').getBoundingClientRect().top"
                      " + scrollY - 120)")
        shot(page, f"long-record-jumps-{scheme}.png")  # the jump links, above the record's first tokens
        page.locator(f"#chips {target}").evaluate("e => e.scrollIntoView({block: 'center'})")
        shot(page, f"long-record-end-think-{scheme}.png")  # where </think> took the reader, marked
