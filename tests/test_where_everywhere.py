"""Every check of a run where the records table and the repair page read "a check" (#38 item 1): the table's checks
column lists every failing check (verdicts too, escaped, bounded), "failing a check" / "passing all" read every check
the run knows (SQLite and PostgreSQL, with and without search), and the repair page's auto-pause picker offers the
run's extended checks and turns one off. Real SQLite / PostgreSQL, a real dashboard over real HTTP, chromium."""

from __future__ import annotations

import itertools
import re
import time
from typing import Any

import httpx
import pytest
from conftest import LiveServer
from hypothesis import given
from hypothesis import strategies as st
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_review import add_record, add_run
from test_where_dashboard import CONFIG, SAME, VERIFY, listed, pick, verdict_run

from synthwatch.check_catalog import BIT
from synthwatch.quality import selection
from synthwatch.quality import verdicts as vd
from synthwatch.quality.detection.windows import claim_gate
from synthwatch.review import queries
from synthwatch.review.filters import Filters
from synthwatch.store import queue as store

MANY = ["user:boxed", "language", VERIFY, "judge", "rule:has_boxed", "user:<b>x</b>"]


def _many_failing(engine: Any, run_id: int) -> int:
    """A record failing six checks, one of them a stored name with markup (a name from an old config)."""
    rid = add_record(engine, run_id, 99, content="fails everything")
    with engine.connect() as conn, store.write_begin(conn):
        vd.append(conn, [vd.NewVerdict(run_id, rid, name, vd.Verdict("fail", reason="x")) for name in MANY])
    return rid


def test_failing_a_check_and_passing_all_read_every_check(engine: Any, live_app: Any) -> None:
    """Records failing only a verdict check (user:boxed, judge, language, verify) were "passing all"."""
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        # 1: user:boxed and judge; 2: language, verify; 3: truncated (user:boxed failed, then passed; verify error);
        # 4: user:boxed, language, rule; 0 passes everything; 5 has no verdict yet (pending is not a failure)
        assert listed(c, run_id, check="any") == pick(ids, 1, 2, 3, 4)
        assert listed(c, run_id, check="none") == pick(ids, 0, 5)
        assert c.get(f"/api/runs/{run_id}/records/count", params={"check": "any"}).json()["count"] == 4
        # with search (the FTS join, records under an alias)
        assert listed(c, run_id, check="any", q="needle") == pick(ids, 1)
        assert listed(c, run_id, check="none", q="needle") == pick(ids, 5)
        html = c.get(f"/runs/{run_id}/records", params={"status": "finished"}).text
        assert ">failing a check<" in html and ">passing all<" in html and "every built-in check" not in html


def test_failing_a_check_on_both_databases(any_db: str, any_engine: Any) -> None:
    """The same answers on SQLite and PostgreSQL, with and without search, through a dashboard on that database."""
    from synthwatch.app.main import create_app
    from synthwatch.settings import Settings

    run_id, ids = verdict_run(any_engine)
    srv = LiveServer(create_app(any_db, Settings(db=any_db))).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert listed(c, run_id, check="any") == pick(ids, 1, 2, 3, 4)
            assert listed(c, run_id, check="none") == pick(ids, 0, 5)
            assert listed(c, run_id, check="any", q="needle") == pick(ids, 1)
            assert listed(c, run_id, check="none", q="needle", flag="unreviewed") == pick(ids, 5)
    finally:
        srv.stop()


def _checks_cell(html: str, rid: int) -> str:
    row = html.split(f'data-record-id="{rid}"')[1].split("</tr>")[0]
    return re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[10]


def test_checks_column_shows_every_failing_check(engine: Any, live_app: Any) -> None:
    run_id, ids = verdict_run(engine)
    many = _many_failing(engine, run_id)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for headers in ({}, {"HX-Request": "true", "HX-Target": "records-table"}):  # the page, then its fragment
            html = c.get(f"/runs/{run_id}/records", params={"status": "finished"}, headers=headers).text
            assert ("<html" in html) == (not headers)
            cell = _checks_cell(html, ids[1])
            assert 'data-check-name="user:boxed"' in cell and 'data-check-name="judge"' in cell
            assert ">user:boxed<" in cell  # a configured name as written
            cell = _checks_cell(html, ids[4])
            for name in ("user:boxed", "language", "rule:has_boxed"):
                assert f'data-check-name="{name}"' in cell
            assert 'data-check-name="truncated"' in _checks_cell(html, ids[3])
            assert "user:boxed" not in _checks_cell(html, ids[3])  # failed, then passed: the latest is in force
            assert _checks_cell(html, ids[0]).strip() == "ok"
            cell = _checks_cell(html, many)
            assert cell.count("data-check-name=") == 4 and "+2 more" in cell  # bounded
            assert "<b>x</b>" not in html and "user:&lt;b&gt;x&lt;/b&gt;" in cell  # escaped


def _gate(engine: Any, run_id: int) -> list[str]:
    with engine.connect() as conn:
        return [a["rule"] for a in claim_gate(conn, run_id, 0, time.time())[0]]


def test_auto_pause_picker_offers_and_turns_off_a_user_check(engine: Any, live_app: Any) -> None:
    """The picker offered the built-in checks only; a user check's auto-pause, turned off there, lets claims go."""
    run_id, _ids = verdict_run(engine)
    with engine.connect() as conn, store.write_begin(conn):  # user:boxed's alarm paused the run
        conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, 'user:boxed', 'error', 'user:boxed fails', 'm', 2, 1.0, 1.0, true, true)"),
            {"r": run_id})
    assert _gate(engine, run_id) == ["user:boxed"]
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30, headers=SAME) as c:
        html = c.get(f"/runs/{run_id}/repair").text
        picker = html.split('class="autopause-form"')[1].split("</select>")[0]
        for name in ("truncated", "user:boxed", "language", "rule:has_boxed"):
            assert f'value="{name}"' in picker, name
        r = c.post(f"/runs/{run_id}/autopause", data={"check": "user:boxed", "state": "off",
                                                     "reason": "boxed answers are checked by hand"})
        assert r.status_code in (200, 303), r.text
        html = c.get(f"/runs/{run_id}/repair").text
        assert 'class="autopause-override" data-check="user:boxed"' in html
    assert _gate(engine, run_id) == []  # the claim gate no longer holds the run for it


@pytest.mark.browser
def test_auto_pause_of_a_user_check_in_a_browser(page: Page, live_app: Any, engine: Any,
                                                 browser_problems: Any) -> None:
    run_id, ids = verdict_run(engine)
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/records?status=finished")
    page.locator('#record-filters select[name="check"]').select_option("any")
    expect(page.locator("#records tbody tr")).to_have_count(4)
    row = page.locator(f'#records tbody tr[data-record-id="{ids[1]}"]')
    expect(row.locator('[data-check-name="user:boxed"]')).to_have_count(1)
    page.goto(f"{srv.url}/runs/{run_id}/repair")
    form = page.locator("form.autopause-form")
    form.locator('select[name="check"]').select_option("user:boxed")
    form.locator('input[name="reason"]').fill("boxed answers are checked by hand")
    form.locator('button[type="submit"]').click()
    expect(page.locator('.autopause-override[data-check="user:boxed"]')).to_be_visible()


_RUNS = itertools.count()
STATES = st.sampled_from(["pass", "fail", "error", "pending"])
RECORD_DRAW = st.tuples(st.sampled_from([0, BIT["truncated"], BIT["truncated"] | BIT["empty_reasoning"]]),
                        st.dictionaries(st.sampled_from(["user:boxed", "language", VERIFY, "judge", "rule:has_boxed",
                                                         "near_duplicate"]),
                                        st.lists(STATES, min_size=1, max_size=3), max_size=4))


@given(records=st.lists(RECORD_DRAW, min_size=1, max_size=6), sort=st.sampled_from(["id", "content_len"]))
def test_failing_a_check_is_the_catalogue_s_any_fail(engine: Any, records: Any, sort: str) -> None:
    """For drawn bits and verdict histories, "failing a check" lists exactly the records the catalogue's expression
    `NAME=fail or ...` over every name selects, and "passing all" the others (search: the HTTP tests above)."""
    run_id = add_run(engine, f"drawn-{next(_RUNS)}", CONFIG)  # a run per example, the same database
    ids = [add_record(engine, run_id, i, content=f"needle {i}", check_flags=flags)
           for i, (flags, _h) in enumerate(records)]
    with engine.connect() as conn, store.write_begin(conn):
        for rid, (_f, history) in zip(ids, records, strict=True):
            for name, seq in history.items():
                vd.append(conn, [vd.NewVerdict(run_id, rid, name, vd.Verdict(s)) for s in seq])
    extra = {"sort": sort}
    with engine.connect() as conn:
        cat = selection.catalogue(conn, run_id)
        every = selection.any_of(*(selection.check_is(cat, n, "fail") for n in cat.names))
        want = selection.record_ids(conn, run_id, every)
        expected = [rid for rid, (flags, history) in zip(ids, records, strict=True)
                    if flags or any(seq[-1] == "fail" for seq in history.values())]
        assert want == expected
        failing = queries.select_ids(conn, run_id, Filters.from_params({"check": "any", **extra}), limit=100)
        passing = queries.select_ids(conn, run_id, Filters.from_params({"check": "none", **extra}), limit=100)
        n, _capped = queries.count(conn, run_id, Filters.from_params({"check": "any", **extra}))
    assert sorted(failing) == want and n == len(want)
    assert sorted(passing) == sorted(set(ids) - set(want))
