"""A page never contradicts itself (#37), over real HTTP against a run a real worker wrote from the simulator:

- a finished run speaks as finished: its throughput is the average over the run (the runs list's number), its
  headings say when it finished instead of "(last 57 s)", and it offers no resume when nothing is left to do;
- in flight never reads above the concurrency ("in flight 18 / 16");
- an open problem on a cause is not denied by its symptom's tile ("no open problem" above "1 open problem"), and
  open problems name checks by their labels, not ids.
"""

from __future__ import annotations

import re
import time
from html import escape as html_escape
from typing import Any

import httpx
from sqlalchemy import text
from workerkit import make_config, run_to_end

from synthwatch.app.words import check_label
from synthwatch.store import queue as store


def _finished_run(engine: Any, sim: Any, prompts: Any, n: int = 12) -> int:
    url = sim(ttft_ms=20)
    run_id, status = run_to_end(engine, make_config(url, prompts(n), concurrency=3, name="words"))
    assert status == "completed"
    with engine.connect() as conn, store.write_begin(conn):  # minutes ago, as someone reads it after lunch
        conn.execute(text("UPDATE run SET started_at = started_at - 600, finished_at = finished_at - 300"
                          " WHERE id = :r"), {"r": run_id})
    return run_id


def _tile(html: str, key: str) -> str:
    m = re.search(rf'data-tile="{key}".*?</div>\s*</div>', html, re.S)
    assert m, key
    return m.group(0)


def test_a_finished_run_uses_finished_wording(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    run_id = _finished_run(engine, sim, prompts)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        html = c.get(f"/runs/{run_id}").text
        runs = c.get("/runs").text
    throughput = _tile(html, "throughput")
    assert "average over the run" in throughput and "nothing runs" not in throughput
    shown = re.search(r'data-testid="req-s">([\d.,]+)<', throughput)
    assert shown and float(shown.group(1)) > 0  # not "0.00 ok req/s"
    avg = re.search(r"avg ([\d.,]+) req/s", runs)
    assert avg and avg.group(1) == shown.group(1)  # the runs list's number
    assert not re.search(r"\(last \d+ s", html), re.findall(r"\(last \d+ s[^)]*\)", html)
    assert "finished at" in html
    assert "resume it with" not in html  # completed, nothing pending: nothing to resume


def test_a_stopped_run_with_work_left_still_says_how_to_resume(engine: Any, sim: Any, prompts: Any,
                                                                live_app: Any) -> None:
    run_id = _finished_run(engine, sim, prompts)
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE run SET status = 'stopped', n_pending = 5 WHERE id = :r"), {"r": run_id})
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}", timeout=30).text
    assert "resume it with" in html


def test_in_flight_never_reads_above_the_concurrency(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    run_id = _finished_run(engine, sim, prompts)
    with engine.connect() as conn, store.write_begin(conn):  # 18 claims held at concurrency 16 (answers being written)
        conn.execute(text("UPDATE run SET status = 'running', desired = 'run', finished_at = NULL, n_in_flight = 18,"
                          " concurrency = 16 WHERE id = :r"), {"r": run_id})
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}", timeout=30).text
    value = re.search(r'data-testid="in-flight">([\d,]+) <small>/ ([\d,]+)</small>', html)
    assert value and value.groups() == ("16", "16"), value and value.groups()
    assert "2 more claims finishing" in html


def test_a_symptom_tile_does_not_deny_its_causes_open_problem(engine: Any, sim: Any, prompts: Any,
                                                               live_app: Any) -> None:
    """The demo's drift page: "no open problem (its records were repaired, excluded or accepted)" in the
    Empty-reasoning tile, above "1 open problem: 3 records failed field_mismatch"."""
    run_id = _finished_run(engine, sim, prompts)
    t = time.time()
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("DELETE FROM check_stat WHERE run_id = :r AND check_name = 'empty_reasoning'"), {"r": run_id})
        conn.execute(text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                          " updated_at) VALUES (:r, 'empty_reasoning', 3, 12, 3, 12, :t)"), {"r": run_id, "t": t})
        conn.execute(text("INSERT INTO open_item (run_id, check_name, state, opened_at, updated_at, n_records,"
                          " n_excluded, n_queued, n_peak, first_t, last_t) VALUES (:r, 'field_mismatch', 'open', :t,"
                          " :t, 3, 0, 0, 3, :t, :t)"), {"r": run_id, "t": t})
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}", timeout=30).text
    label = html_escape(check_label("field_mismatch"))
    tile = _tile(html, "empty_reasoning")
    assert "no open problem" not in tile, tile
    assert 'data-level="bad"' in tile and label in tile
    items = re.search(r'data-testid="open-items".*?</section>', html, re.S)
    assert items
    assert "1 open problem" in items.group(0)
    assert f"3 records failed {label}" in items.group(0)
    assert "failed field_mismatch" not in html


def test_compare_shows_the_settings_as_they_are_now(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    """#37: compare showed cap 5000 and concurrency 16 where the run had 3000 and 8, set from the dashboard."""
    url = sim(ttft_ms=20)
    ids = []
    for name in ("cmp-a", "cmp-b"):
        run_id, status = run_to_end(engine, make_config(url, prompts(4, name=f"{name}.jsonl"), concurrency=16,
                                                        cap=5000, name=name))
        assert status == "completed"
        ids.append(run_id)
    a, b = ids
    store.apply_control(engine, a, "cap", "3000")
    store.apply_control(engine, a, "concurrency", "8")
    srv = live_app()
    html = httpx.get(f"{srv.url}/compare", params=[("run", a), ("run", b)], timeout=30).text
    diff = re.search(r'data-testid="settings-diff">(.*?)</ul>', html, re.S)
    assert diff, html[-3000:]
    lines = re.findall(r"<code>(.*?)</code>", diff.group(1))
    assert any(line.startswith("cap: 3000 → 5000") for line in lines), lines
    assert any(line.startswith("concurrency: 8 → 16") for line in lines), lines


def test_the_one_acknowledge_control_takes_records_or_minutes(engine: Any, sim: Any, prompts: Any,
                                                               live_app: Any) -> None:
    """#37: one acknowledge control per card, with N records or M minutes in it (the old button had neither)."""
    run_id = _finished_run(engine, sim, prompts)
    t = time.time()
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE run SET status = 'running', desired = 'run', finished_at = NULL WHERE id = :r"),
                     {"r": run_id})
        ids = [conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, :rule, 'warning', 't', 'm', 'f', 3, :t, :t, true, false) RETURNING id"),
            {"r": run_id, "rule": rule, "t": t}).scalar_one() for rule in ("think_tags_in_content", "empty_content")]
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        html = c.get(f"/runs/{run_id}/alarms/banner").text
        assert html.count('data-testid="alarm-acknowledge"') == 2 and "Acknowledge (snooze)" not in html
        r = c.post(f"/runs/{run_id}/alarms/{ids[0]}/ack", data={"ack_amount": "30", "ack_unit": "minutes"},
                   headers={"HX-Request": "true"})
        assert r.status_code == 200 and f'data-alarm-id="{ids[0]}"' not in r.text
        r = c.post(f"/runs/{run_id}/alarms/{ids[1]}/ack", data={"ack_amount": "7", "ack_unit": "records"},
                   headers={"HX-Request": "true"})
        assert r.status_code == 200
        bad = c.post(f"/runs/{run_id}/alarms/{ids[1]}/ack", data={"ack_amount": "2.5", "ack_unit": "records"})
        assert bad.status_code == 400 and "whole number" in bad.text
    with engine.connect() as conn:
        rows = {int(r[0]): (r[1], r[2]) for r in conn.execute(
            text("SELECT id, snooze_until, snooze_records FROM alarm WHERE run_id = :r"), {"r": run_id})}
    until, _ = rows[ids[0]]
    assert until is not None and 29 * 60 < float(until) - t < 31 * 60
    assert rows[ids[1]][1] is not None
