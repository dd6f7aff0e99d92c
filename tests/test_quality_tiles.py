"""The quality tiles use the window and the rule of the alarm on their check (#19 item 3).

The issue: "When the banner first appeared, the Empty-reasoning tile was still green at 1.1%, because it uses
a different window." Here a real worker against a simulator that empties the reasoning of a share of its
answers raises the empty-reasoning alarm; the run page's data function, read in one snapshot with the alarm
table at every poll, shows the tile red exactly when the alarm is open, never before.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from workerkit import create, make_config

from synthwatch.app import run_stats as stats
from synthwatch.store import queue as store


def _tile(st: stats.RunStats, key: str) -> stats.Tile:
    return next(t for t in st.tiles if t.key == key)


def test_the_empty_reasoning_tile_turns_red_with_its_alarm(engine: Any, sim: Any, prompts: Any) -> None:
    url = sim(rate_empty_reasoning=0.25, seed=21, reasoning_tokens="4-8", content_tokens="4-8", ttft_ms=20)
    config = make_config(url, prompts(300), concurrency=2, name="tiles")
    bg = CheckedBackground(engine, config).start()
    seen: list[tuple[bool, str, str, tuple[int, int]]] = []
    try:
        deadline = time.monotonic() + 60
        while bg.thread.is_alive() and time.monotonic() < deadline:
            with engine.connect() as conn:  # one read transaction: the tile and the alarm from one snapshot
                run = stats.get_run(conn, bg.run_id)
                assert run is not None
                st = stats.run_stats(conn, run)
                alarm = conn.execute(text("SELECT COUNT(*) FROM alarm WHERE run_id = :r AND rule = 'empty_reasoning'"
                                          " AND active"), {"r": bg.run_id}).scalar_one()
                win = conn.execute(text("SELECT win_fail, win_total FROM check_stat WHERE run_id = :r"
                                        " AND check_name = 'empty_reasoning'"), {"r": bg.run_id}).first()
            tile = _tile(st, "empty_reasoning")
            seen.append((bool(alarm), tile.level, tile.value, tuple(win) if win else (0, 0)))
            if alarm and len([s for s in seen if s[0]]) >= 5:
                break
            time.sleep(0.02)
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
    assert any(s[0] for s in seen), seen[-5:]
    for alarm_open, level, value, (fail, total) in seen:
        assert (level == "bad") == alarm_open, (alarm_open, level, value, fail, total)
        if total:  # the number is the alarm's window
            assert value == f"{fail / total * 100:.1f}%"
    first = next(i for i, s in enumerate(seen) if s[0])
    assert all(s[1] != "bad" for s in seen[:first])  # never red before the alarm ...
    # ... and not green over the threshold while the alarm waits for its first records: amber
    assert all(s[1] == "warn" for s in seen[:first] if 0 < s[3][1] < 20 and s[3][0] >= 0.05 * s[3][1])
    assert float(seen[first][2].rstrip("%")) >= 5.0  # the alarm's threshold, over its window


@pytest.mark.parametrize("case", ["symptom", "warning", "clean", "young"])
def test_tile_rules(engine: Any, sim: Any, prompts: Any, case: str) -> None:
    run_id = create(engine, make_config(sim(), prompts(2), name=f"rules-{case}"))
    rows = {"empty_reasoning": (1, 40), "truncated": (6, 40)}  # 2.5 % (below 5 %), 15 % (above 10 %)
    if case == "clean":
        rows["truncated"] = (0, 40)
    if case == "young":
        rows["truncated"] = (3, 10)  # 30 %, but the alarm waits for 20 checked records
    with engine.begin() as conn:
        for name, (f, n) in rows.items():
            conn.execute(text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                              " updated_at) VALUES (:r, :c, :f, :n, :f, :n, 0)"), {"r": run_id, "c": name, "f": f, "n": n})
        if case == "symptom":
            conn.execute(text("INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at,"
                              " updated_at, active, auto_paused) VALUES (:r, 'field_mismatch', 'error', 't', 'm', 'f',"
                              " 1, 0, 0, true, false)"), {"r": run_id})
    with engine.connect() as conn:
        run = stats.get_run(conn, run_id)
        assert run is not None
        st = stats.run_stats(conn, run)
    er, length = _tile(st, "empty_reasoning"), _tile(st, "length")
    assert er.value == "2.5%" and "1 of the last 40 checked records" in er.detail
    # below its own rule: red only as the open field-mismatch alarm's symptom
    assert er.level == ("bad" if case == "symptom" else "ok")
    # "Cut at max_tokens" fires (10 % over its window) with severity warning: amber; too young to fire: amber too
    assert length.level == ("ok" if case == "clean" else "warn")
    if case == "young":
        assert length.value == "30.0%" and "once 20 are checked" in length.detail
    assert orjson.loads(orjson.dumps(st.as_json()))["tiles"]  # the API form still serialises


@pytest.mark.browser
def test_the_run_page_shows_the_tile_red_beside_the_banner(engine: Any, sim: Any, prompts: Any, live_app: Any,
                                                            page: Any) -> None:
    from workerkit import wait_for

    url = sim(rate_empty_reasoning=0.25, seed=22, reasoning_tokens="4-8", content_tokens="4-8", ttft_ms=20)
    bg = CheckedBackground(engine, make_config(url, prompts(400), concurrency=2, name="tiles-page")).start()
    try:
        def alarm_open() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(text("SELECT COUNT(*) FROM alarm WHERE run_id = :r AND active"
                                              " AND rule = 'empty_reasoning'"), {"r": bg.run_id}).scalar_one())
        wait_for(alarm_open, timeout_s=60, what="the empty-reasoning alarm")
        srv = live_app(poll_interval_ms=500)
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        # drawn (behind "N more" when another alarm is first: #28 item 1)
        page.locator('.alarm-banner[data-rule="empty_reasoning"]').wait_for(state="attached")
        tile = page.locator('[data-tile="empty_reasoning"]')
        assert tile.get_attribute("data-level") == "bad", tile.inner_text()
        assert "checked records" in tile.inner_text()
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
