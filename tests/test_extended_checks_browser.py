"""Extended checks' verdicts in a real browser (#30): the record page shows each verdict and "pending check",
a verdict's reason (untrusted: user code, model output) is text, never markup; the run page counts pending
records; the checks page lists the extended check with its rate and errors. Real SQLite, chromium."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect
from test_extended_checks import crafted_run

from synthwatch.quality import verdicts as vd

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def test_verdicts_and_pending_on_the_record_run_and_checks_pages(page: Page, live_app: Any, engine: Any) -> None:
    checks = {"rule": [{"name": "long", "min_chars": 10}], "user": [{"name": "judge_me", "function": "x:y"}]}
    run_id, ids = crafted_run(engine, checks, [("q", "short", {}), ("q", "long enough answer", {})])
    with engine.begin() as conn:  # as the verdict writer appends them: one record judged, one still pending
        vd.append(conn, [vd.NewVerdict(run_id, ids[0], "rule:long", vd.Verdict("fail", 5.0, None,
                                                                               "content has 5 characters")),
                         vd.NewVerdict(run_id, ids[0], "user:judge_me", vd.Verdict("error", reason=HOSTILE))])
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/records/{ids[0]}")
    meta = page.locator("#meta-verdicts")
    expect(meta.locator('[data-check="rule:long"]')).to_contain_text("fail: content has 5 characters")
    expect(meta.locator('[data-check="user:judge_me"]')).to_contain_text("error: <img src=x")
    assert page.evaluate("window.__pwned === undefined"), "a verdict's reason ran as markup"
    assert meta.locator("img, script").count() == 0
    page.goto(f"{srv.url}/runs/{run_id}/records/{ids[1]}")
    expect(page.locator('#meta-verdicts [data-check="rule:long"]')).to_contain_text("pending check")
    page.goto(f"{srv.url}/runs/{run_id}")
    expect(page.locator('[data-testid="pending-checks"]')).to_contain_text("1 records wait for their extended checks")
    page.goto(f"{srv.url}/runs/{run_id}/checks")
    expect(page.locator('[data-rule="rule:long"]')).to_be_visible()
