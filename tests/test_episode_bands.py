"""The charts shade one band per alarm episode (#35 Must have 4): a re-fire within the clearing period is the same
episode and the same band; the run page's charts read their bands from /api/runs/{id}/timeseries ("alarms"), and
the runs list, strip and tab title count the same episodes (quality.detection.problem_counts).

The alarm keeper (quality.detection.alarms) over a real SQLite file, driven with the rule's window as the writer
drives it, flush by flush; the bands read over real HTTP from the dashboard."""

from __future__ import annotations

import time
from typing import Any

import httpx
from sqlalchemy import text
from test_checks_kit import alarms
from workerkit import create, make_config

from synthwatch.quality.detection import AlarmKeeper, Hysteresis, effective_rules, run_problems

HTTP_TIMEOUT_S = 30.0
PENDING, CLEAR = 5, 30  # records of the check before an alarm fires / clears
FIRING, QUIET = (8, 100), (0, 100)  # 8%: over the 5% line, under twice it (which fires at once)


def _drive(engine: Any, run_id: int, timeline: list[dict[str, bool]], t0: float, dt: float) -> None:
    """One flush per step: each check gets one more record, failing its rule's window or not."""
    checks = sorted({c for step in timeline for c in step})
    rules = {c: effective_rules({})[c] for c in checks}
    keeper = AlarmKeeper(run_id, "bands")
    keeper.hysteresis = Hysteresis(pending_records=PENDING, clear_records=CLEAR)
    n_fail = dict.fromkeys(checks, 0)
    for i, step in enumerate(timeline):
        t = t0 + i * dt
        windows = {c: FIRING if step[c] else QUIET for c in checks}
        with engine.connect() as conn, conn.begin():
            for c in checks:
                n_fail[c] += int(step[c])
                conn.execute(text(
                    "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, updated_at)"
                    " VALUES (:r, :c, :f, :n, :wf, :wn, :t) ON CONFLICT (run_id, check_name) DO UPDATE"
                    " SET n_fail = excluded.n_fail, n_total = excluded.n_total, win_fail = excluded.win_fail,"
                    " win_total = excluded.win_total"),
                    {"r": run_id, "c": c, "f": n_fail[c], "n": i + 1, "wf": windows[c][0], "wn": windows[c][1],
                     "t": t})
            keeper.evaluate(conn, t, rules, windows, {c: (n_fail[c], i + 1, None) for c in checks}, {},
                            allow_pause=False, new_fail={c: t for c in checks if step[c]} or None)


def _phases(*parts: tuple[bool, int]) -> list[bool]:
    return [on for on, n in parts for _ in range(n)]


def test_the_charts_shade_one_band_per_episode(engine: Any, prompts: Any, live_app: Any) -> None:
    run_id = create(engine, make_config("http://127.0.0.1:9/v1", prompts(5), name="bands"))
    # empty_reasoning: fires, stops for less than the clearing period and fires again (one episode), clears;
    # fires again later (a second episode) and clears. empty_content: one episode.
    a = _phases((True, 40), (False, CLEAR // 3), (True, 20), (False, CLEAR + 10), (True, 20), (False, CLEAR + 10))
    b = _phases((False, 30), (True, 30), (False, len(a) - 60))
    assert len(a) == len(b)
    dt = 0.2
    t0 = time.time() - len(a) * dt - 1
    _drive(engine, run_id, [{"empty_reasoning": x, "empty_content": y} for x, y in zip(a, b, strict=True)], t0, dt)

    rows = alarms(engine, run_id)
    assert [r["rule"] for r in rows].count("empty_reasoning") == 2, rows
    assert [r["rule"] for r in rows].count("empty_content") == 1, rows
    assert not any(r["active"] for r in rows), "the premise: every episode cleared"

    c = httpx.Client(base_url=live_app().url, timeout=HTTP_TIMEOUT_S)
    bands = c.get(f"/api/runs/{run_id}/timeseries", params={"window": "all"}).raise_for_status().json()["alarms"]
    assert sorted(b["id"] for b in bands) == sorted(r["id"] for r in rows), bands  # one band per episode
    er = sorted((b for b in bands if b["rule"] == "empty_reasoning"), key=lambda b: b["t0"])
    assert len(er) == 2 and len([b for b in bands if b["rule"] == "empty_content"]) == 1, bands
    # the re-fire within the clearing period is inside the first band, not a band of its own
    refire_t = t0 + (40 + CLEAR // 3) * dt
    assert er[0]["t0"] < refire_t < er[0]["t1"], (er, refire_t)
    assert er[0]["t1"] <= er[1]["t0"], er  # the two episodes are two bands, apart
    with engine.connect() as conn:
        assert run_problems(conn, run_id).episodes == len(bands) == 3
