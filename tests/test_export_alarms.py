"""Exporting a run paused by an open data-quality alarm needs an explicit yes, everywhere (#19).

A real worker reads `reasoning_content` from a simulator that sends `reasoning`: the field-mismatch alarm
fires and pauses the run. The export page warns (the alarm's label, its failing records, a link to repair
them) and needs a ticked box; the API answers 409 until `allow_open_alarms`; `synthwatch export` refuses
until `--allow-open-alarms`. Nothing is written before the yes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import run_cli
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.app.export_guard import open_alarms
from synthwatch.app.words import check_label
from synthwatch.check_catalog import BIT
from synthwatch.export.stream import manifest_path
from synthwatch.store import queue as store


@pytest.fixture
def paused_by_alarm(engine: Any, sim: Any, prompts: Any) -> Any:
    url = sim(reasoning_field="reasoning", seed=12, reasoning_tokens="4-8", content_tokens="4-8")
    config = make_config(url, prompts(200), concurrency=4, reasoning={"mode": "reasoning_content"}, name="alarmed")
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused"
                 and run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=60, what="the alarm's pause")
        yield bg.run_id
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


def _failing(engine: Any, run_id: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT n_fail FROM check_stat WHERE run_id = :r AND check_name = :c"),
                                {"r": run_id, "c": "field_mismatch"}).scalar_one())


def _jobs(engine: Any, run_id: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM export_job WHERE run_id = :r"), {"r": run_id}).scalar_one())


def test_the_export_page_and_api_warn_and_need_a_yes(paused_by_alarm: int, engine: Any, live_app: Any) -> None:
    run_id = paused_by_alarm
    n_fail = _failing(engine, run_id)
    assert n_fail >= 1
    with engine.connect() as conn:
        guard = open_alarms(conn, run_id)
    assert guard is not None and guard.paused
    [alarm] = guard.alarms
    assert (alarm["rule"], alarm["n_fail"], alarm["auto_paused"]) == ("field_mismatch", n_fail, True)
    label = check_label("field_mismatch")
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        page = c.get(f"/runs/{run_id}/export").text
        warning = re.search(r'data-testid="export-alarm-warning">(.*?)</div>', page, re.S)
        assert warning, page[-3000:]
        w = warning.group(1)
        # the alarm and the open item it leaves (records failing until repaired, excluded or accepted; #26)
        assert "is paused and has 1 open data-quality alarm and 1 open problem." in w and label in w
        assert f'data-testid="alarm-failing">{n_fail:,} record{"" if n_fail == 1 else "s"}</span>' in w
        assert f'href="/runs/{run_id}/repair?alarm={alarm["id"]}#repair"' in w
        assert re.search(r'<input type="checkbox" name="allow_open_alarms" required', page)

        refused = c.post(f"/runs/{run_id}/export", data={"format": "raw", "default_exclusions": "on"},
                         follow_redirects=False)
        assert refused.status_code == 400 and 'data-export-error' in refused.text
        assert label in refused.text and 'aria-invalid="true"' in refused.text
        api = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw"})
        assert api.status_code == 409 and api.json()["confirm"] == "allow_open_alarms"
        assert api.json()["open_alarms"]["alarms"][0]["n_fail"] == n_fail and label in api.json()["detail"]
        assert _jobs(engine, run_id) == 0  # nothing started

        ok = c.post(f"/runs/{run_id}/export", data={"format": "raw", "allow_open_alarms": "on"},
                    follow_redirects=False)
        assert ok.status_code == 303, ok.text[-2000:]
        api = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw", "allow_open_alarms": True})
        assert api.status_code == 202, api.text
        assert _jobs(engine, run_id) == 2
        bad = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw", "allow_open_alarms": "yes"})
        assert bad.status_code == 409  # only true is a yes


def test_the_cli_refuses_until_allow_open_alarms(paused_by_alarm: int, engine: Any, db_path: Path,
                                                 tmp_path: Path) -> None:
    run_id = paused_by_alarm
    n_fail = _failing(engine, run_id)
    out = tmp_path / "out.jsonl"
    r = run_cli("export", "alarmed", "--format", "raw", "--out", str(out), "--db", str(db_path), "--quiet")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "run 'alarmed' has 1 open data-quality alarm and 1 open problem and is paused" in r.stderr
    assert f"{check_label('field_mismatch')} (alarm #" in r.stderr
    assert f"{n_fail:,} record{'' if n_fail == 1 else 's'} failing field_mismatch" in r.stderr
    assert f"/runs/{run_id}/repair?alarm=" in r.stderr and "--allow-open-alarms" in r.stderr
    assert not out.exists() and not list(tmp_path.glob("out.jsonl*"))
    r = run_cli("export", "alarmed", "--format", "raw", "--out", str(out), "--db", str(db_path), "--quiet",
                "--allow-open-alarms")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "warning: exporting with open alarms" in r.stderr and out.is_file()
    # the manifest says it was exported anyway, by whom and when, and names the open item (#26)
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["confirmed_with_open_alarms"] is True and manifest["confirmed_by"] == "cli"
    assert manifest["confirmed_at"] and [i["check_name"] for i in manifest["open_items"]] == ["field_mismatch"]


@pytest.mark.browser
def test_the_export_page_in_a_browser(paused_by_alarm: int, engine: Any, live_app: Any, page: Any) -> None:
    run_id = paused_by_alarm
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/export")
    warning = page.locator('[data-testid="export-alarm-warning"]')
    assert warning.is_visible() and check_label("field_mismatch") in warning.inner_text()
    page.locator(".export-start").click()  # not ticked: the browser keeps the form, nothing is sent
    page.wait_for_timeout(300)
    assert page.url.endswith(f"/runs/{run_id}/export") and _jobs(engine, run_id) == 0
    assert page.locator('[data-testid="allow-open-alarms"]').evaluate("e => e.validity.valueMissing")
    page.locator('[data-testid="allow-open-alarms"]').check()
    page.locator(".export-start").click()
    page.wait_for_url(f"**/runs/{run_id}/exports/*")
    assert _jobs(engine, run_id) == 1
    # the warning's link leads to repairing the alarm's records
    page.goto(f"{srv.url}/runs/{run_id}/export")
    page.locator('[data-testid="alarm-repair-link"]').click()
    page.wait_for_url(f"**/runs/{run_id}/repair?alarm=*")
    assert page.locator('[data-testid="select-alarm"] option:checked').inner_text().startswith("#")


def test_a_selection_leaving_out_every_failing_record_needs_no_yes(paused_by_alarm: int, engine: Any, db_path: Path,
                                                                    tmp_path: Path, live_app: Any) -> None:
    """#35: `--exclude-check field_mismatch` leaves out every record the open alarm and its open item name, so the
    guard holds without --allow-open-alarms; a selection that keeps any of them is still refused."""
    run_id = paused_by_alarm
    n_fail = _failing(engine, run_id)
    out = tmp_path / "clean.jsonl"
    # keeps them: another check excluded, and the default exclusions off (empty reasoning would be exported)
    for extra in (["--exclude-check", "repetition"], ["--no-default-exclusions", "--exclude-check", "truncated"]):
        r = run_cli("export", "alarmed", "--format", "raw", "--out", str(out), "--db", str(db_path), "--quiet", *extra)
        assert r.returncode == 2 and "field_mismatch" in r.stderr and "--allow-open-alarms" in r.stderr, (extra, r)
        assert not out.exists()
    r = run_cli("export", "alarmed", "--format", "raw", "--out", str(out), "--db", str(db_path), "--quiet",
                "--no-default-exclusions", "--exclude-check", "field_mismatch")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "warning: exporting with open alarms" not in r.stderr
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["confirmed_with_open_alarms"] is False and manifest["confirmed_by"] is None
    assert manifest["counts"]["excluded"].get("check:field_mismatch") == n_fail
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert not [row["id"] for row in rows if int(row["check_flags"] or 0) & BIT["field_mismatch"]]
    # the dashboard's API holds the same rule
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        kept = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw", "exclude_checks": ["repetition"]})
        assert kept.status_code == 409 and kept.json()["confirm"] == "allow_open_alarms"
        left = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw", "exclude_checks": ["field_mismatch"]})
        assert left.status_code == 202, left.text
