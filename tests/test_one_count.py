"""One count on every page (#37): "Tiles, banners, open items, the runs list and tab titles read one count from one
function". A run a real worker wrote from the simulator, with open items and alarms; every place that shows its
open problems (the runs list, the alarm strip, the banner and the tab title's data attribute, the open-items card's
header, the quality tiles, the APIs) shows the numbers synthwatch.quality.detection.problem_counts gives. The
open-items card counted its own list, and the tiles their own query."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
from sqlalchemy import text
from workerkit import make_config, run_to_end

from synthwatch.quality.detection import run_problems
from synthwatch.store import queue as store


def _run_with_problems(engine: Any, sim: Any, prompts: Any) -> int:
    run_id, status = run_to_end(engine, make_config(sim(ttft_ms=20), prompts(12), concurrency=3, name="one-count"))
    assert status == "completed"
    t = time.time()
    with engine.connect() as conn, store.write_begin(conn):
        for check, n in (("empty_reasoning", 3), ("truncated", 2)):
            conn.execute(text("DELETE FROM check_stat WHERE run_id = :r AND check_name = :c"), {"r": run_id, "c": check})
            conn.execute(text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                              " updated_at) VALUES (:r, :c, :n, 12, :n, 12, :t)"), {"r": run_id, "c": check, "n": n,
                                                                                  "t": t})
            conn.execute(text("INSERT INTO open_item (run_id, check_name, state, opened_at, updated_at, n_records,"
                              " n_excluded, n_queued, n_peak, first_t, last_t) VALUES (:r, :c, 'open', :t, :t, :n,"
                              " 0, 0, :n, :t, :t)"), {"r": run_id, "c": check, "n": n, "t": t})
        # an accepted item is no open problem
        conn.execute(text("INSERT INTO open_item (run_id, check_name, state, opened_at, updated_at, n_records,"
                          " n_excluded, n_queued, n_peak, first_t, last_t) VALUES (:r, 'repetition', 'accepted', :t,"
                          " :t, 4, 0, 0, 4, :t, :t)"), {"r": run_id, "t": t})
        for rule, acked, active in (("empty_reasoning", None, True), ("truncated", t, True),
                                    ("repetition", None, False)):
            conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
                " auto_paused, acked_at) VALUES (:r, :rule, 'warning', :rule, 'm', 1, :t, :t, :active, false, :a)"),
                {"r": run_id, "rule": rule, "t": t, "active": active, "a": acked})
    return run_id


def _attr(html: str, name: str, where: str) -> int:
    m = re.search(rf'{name}="(\d+)"', html)
    assert m, (where, name, html[:800])
    return int(m.group(1))


def test_every_place_shows_the_one_count(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    run_id = _run_with_problems(engine, sim, prompts)
    with engine.connect() as conn:
        p = run_problems(conn, run_id)
    assert (p.alarms, p.items, p.failing) == (2, 2, 5), p  # the premise: 2 open alarms, 2 open items, 5 records
    c = httpx.Client(base_url=live_app().url, timeout=30)

    row = re.search(rf'<tr[^>]*data-run-id="{run_id}".*?</tr>', c.get("/runs").text, re.S)
    assert row, "no runs-list row"
    assert f"{p.alarms} alarms" in row.group(0) and f"{p.items} open problems ({p.failing} records)" in row.group(0)

    for part in ("strip", "banner"):  # data-alarm-count is what alarms.js puts in the tab title
        html = c.get(f"/runs/{run_id}/alarms/{part}").text
        assert _attr(html, "data-alarm-count", part) == p.alarms
        assert _attr(html, "data-open-items", part) == p.items

    page = c.get(f"/runs/{run_id}").text
    card = re.search(r'<section[^>]*data-testid="open-items".*?</h2>', page, re.S)
    assert card, "no open-items card"
    assert _attr(card.group(0), "data-open-items", "card") == p.items
    assert _attr(card.group(0), "data-records-failing", "card") == p.failing
    assert f"{p.items} open problems ({p.failing} records failing)" in card.group(0)

    tiles = 0
    for key in ("empty_reasoning", "length"):  # the finished run's tiles, each with its check's open problem
        tile = re.search(rf'data-tile="{key}".*?</div>\s*</div>', page, re.S)
        assert tile, key
        m = re.search(r"open problem: (\d+) records? still failing", tile.group(0))
        assert m, tile.group(0)
        tiles += int(m.group(1))
    assert tiles == p.failing

    api = c.get(f"/api/runs/{run_id}/alarms").json()["problems"]
    stats = c.get(f"/api/runs/{run_id}/stats").json()["problems"]
    for got in (api, stats):
        assert (got["alarms"], got["open_items"], got["records_failing"]) == (p.alarms, p.items, p.failing), got
