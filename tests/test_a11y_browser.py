"""axe-core on every page kind in a real browser (#28 item 3): no critical and no serious violations, in the
light theme and in the dark one (prefers-color-scheme, emulated; #28 item 9), with alarm cards and strips shown.

axe-core comes from the npm registry, pinned in package.json / package-lock.json, and ``./dev setup`` copies it to
tests/vendor/ (never committed). It is evaluated through the DevTools protocol, so the dashboard's CSP (no inline
scripts) stays as it is for the page under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page
from sqlalchemy import text

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AXE = Path(__file__).parent / "vendor" / "axe.min.js"
BAD = ("critical", "serious")


def axe_problems(page: Page) -> list[str]:
    """The page's critical and serious axe violations, each with the first elements it names."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    result: dict[str, Any] = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    out = []
    for v in result["violations"]:
        if v["impact"] in BAD:
            seen: dict[str, str] = {}  # one example per distinct failure (contrast: per colour pair)
            for n in v["nodes"]:
                summary = (n.get("failureSummary") or "").replace("\n", " ")
                seen.setdefault(summary[summary.find("of "):][:120] if "contrast" in summary else summary[:120],
                                " ".join(n["target"]))
            where = "; ".join(f"{t} {s}" for s, t in list(seen.items())[:8])
            out.append(f"{v['impact']} {v['id']} ({len(v['nodes'])}): {v['help']} at {where}")
    return out


SCHEMES = pytest.mark.parametrize("scheme", ["light", "dark"])


def _alarms(engine: Any, run_id: int) -> int:
    """A cause with a symptom under it (error) and a warning: the cards, the strips and their colours."""
    import time

    from synthwatch.store import queue as store

    with engine.connect() as conn, store.write_begin(conn):
        ids = [conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, :rule, :sev, :title, 'm `code`', 'f', 3, :t, :t, true, false) RETURNING id"),
            {"r": run_id, "rule": rule, "sev": sev, "title": title, "t": time.time()}).scalar_one()
            for rule, sev, title in (("field_mismatch", "error", "Reasoning in another field"),
                                     ("empty_reasoning", "error", "Empty reasoning"),
                                     ("think_tags_in_content", "warning", "Think tags in the content"))]
    return int(ids[-1])


@SCHEMES
def test_every_page_kind_has_no_critical_or_serious_violation(page: Page, live_app: Any, engine: Any, sim: Any,
                                                             prompts: Any, scheme: str) -> None:
    from workerkit import Background, make_config

    page.emulate_media(color_scheme=scheme)

    if not AXE.exists():
        pytest.fail("tests/vendor/axe.min.js is missing: run ./dev setup (it copies axe-core from node_modules)")
    url = sim()
    runs = []
    for name in ("a11y-a", "a11y-b"):
        config = make_config(url, prompts(6, name=f"{name}.jsonl"), concurrency=3, name=name)
        worker = Background(engine, config).start()
        assert worker.join(60) == "completed"
        runs.append(worker.run_id)
    a, b = runs
    fixable = _alarms(engine, a)
    with engine.connect() as conn:
        rec = conn.execute(text("SELECT id FROM record WHERE run_id = :r ORDER BY id LIMIT 1"), {"r": a}).scalar_one()
    srv = live_app()
    pages = {
        "runs list": "/runs", "run page": f"/runs/{a}", "records table": f"/runs/{a}/records",
        "record page": f"/runs/{a}/records/{rec}", "review": f"/runs/{a}/sample?mode=unreviewed",
        "compare": f"/compare?run={a}&run={b}", "export": f"/runs/{a}/export", "checks": f"/runs/{a}/checks",
        "checks help": "/help/checks", "settings & repairs": f"/runs/{a}/repair",
        "new run": "/runs/new", "API docs": "/docs", "likely fix": f"/runs/{a}/alarms/{fixable}/fix",
        "runs list filtered": "/runs?q=a11y&state=completed&sort=name",
    }
    found = {}
    for kind, path in pages.items():
        page.goto(srv.url + path)
        page.wait_for_load_state("networkidle")
        if kind == "records table":  # the theme is the one asked for, and the alarm strip is among what is checked
            bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert bg == ("rgb(20, 22, 25)" if scheme == "dark" else "rgb(247, 247, 248)"), bg
            assert page.get_by_test_id("alarm-strip").is_visible()
        problems = axe_problems(page)
        if problems:
            found[kind] = problems
    assert not found, "\n".join(f"{k}: {p}" for k, ps in found.items() for p in ps)


@SCHEMES
def test_live_and_paused_runs_have_no_critical_or_serious_violation(page: Page, live_app: Any, engine: Any,
                                                                    sim: Any, prompts: Any, scheme: str) -> None:
    """The running and paused pills, the controls (Stop (graceful) among them) and the workers table of a live
    run: the colours the review measured at 3.79-4.41:1."""
    from workerkit import Background, make_config, run_row, wait_for

    page.emulate_media(color_scheme=scheme)
    url = sim(ttft_ms=150)
    worker = Background(engine, make_config(url, prompts(400), concurrency=2, name="a11y-live")).start()
    srv = live_app()
    wait_for(lambda: run_row(engine, worker.run_id)["n_ok"] >= 2, what="the first records")
    found = {}
    for state in ("running", "paused"):
        for kind, path in (("runs list", "/runs"), ("run page", f"/runs/{worker.run_id}")):
            page.goto(srv.url + path)
            page.wait_for_load_state("load")
            problems = axe_problems(page)
            if problems:
                found[f"{kind} ({state})"] = problems
        if state == "running":  # the run page is open: pause it with its own button
            page.locator('[data-control="pause"]').click()
            wait_for(lambda: run_row(engine, worker.run_id)["status"] == "paused", what="the pause")
    page.once("dialog", lambda d: d.accept())
    page.locator('[data-control="stop_now"]').click()
    assert worker.join(60) in ("stopped", "cancelled", "completed")
    assert not found, "\n".join(f"{k}: {p}" for k, ps in found.items() for p in ps)
