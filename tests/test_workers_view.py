"""The workers of a run on the dashboard: JSON API and htmx fragment; dead workers are marked dead."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import popen_cli
from sqlalchemy import text
from workerkit import wait_for

from synthwatch.app.routes_workers import worker_state
from synthwatch.store import queue as store


def _add_worker(engine: Any, run_id: int, *, pid: int, status: str, age_s: float, done: int = 0,
                stats_json: str = "{}") -> int:
    t = time.time()
    with engine.connect() as conn, store.write_begin(conn):
        return int(conn.execute(text(
            "INSERT INTO worker (run_id, host, pid, started_at, heartbeat_at, status, claimed, done, stats_json)"
            " VALUES (:r, 'host-a', :p, :s, :h, :st, :c, :d, :j) RETURNING id"),
            {"r": run_id, "p": pid, "s": t - 100, "h": t - age_s, "st": status, "c": done + 3, "d": done,
             "j": stats_json}).scalar_one())


def test_worker_states_in_api_and_fragment(engine: Any, live_app: Any) -> None:
    with engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "shared", None)
        store.set_status(conn, rid, "running")
    ids = {
        "fresh": _add_worker(engine, rid, pid=101, status="running", age_s=0.5, done=50,
                             stats_json='{"in_flight": 7, "concurrency": 8, "state": "running"}'),
        "silent": _add_worker(engine, rid, pid=102, status="running", age_s=30, done=20),
        "marked": _add_worker(engine, rid, pid=103, status="dead", age_s=2, done=10),
        "exited": _add_worker(engine, rid, pid=104, status="exited", age_s=60, done=40),
    }
    app = live_app(dead_worker_after_s=10)
    body = httpx.get(f"{app.url}/api/runs/{rid}/workers").json()
    by_id = {w["id"]: w for w in body["workers"]}
    assert {k: by_id[v]["state"] for k, v in ids.items()} == {
        "fresh": "running", "silent": "dead", "marked": "dead", "exited": "exited"}
    assert body["summary"] == {"running": 1, "dead": 2, "exited": 1}
    fresh = by_id[ids["fresh"]]
    assert (fresh["host"], fresh["pid"], fresh["claimed"], fresh["done"]) == ("host-a", 101, 53, 50)
    assert (fresh["in_flight"], fresh["concurrency"]) == (7, 8)
    assert fresh["rate_s"] > 0 and fresh["heartbeat_age_s"] < 10
    assert by_id[ids["silent"]]["heartbeat_age_s"] >= 29

    html = httpx.get(f"{app.url}/runs/{rid}/workers").text
    rows = dict(re.findall(r'data-worker="(\d+)" data-state="(\w+)"', html))
    assert rows[str(ids["silent"])] == rows[str(ids["marked"])] == "dead"
    assert f'class="row-bad" data-worker="{ids["silent"]}"' in html
    assert "hx-trigger=\"every" in html  # live run: the fragment polls
    with engine.connect() as conn, store.write_begin(conn):
        store.set_status(conn, rid, "completed")
    assert "hx-trigger" not in httpx.get(f"{app.url}/runs/{rid}/workers").text  # ended: polling stops
    assert httpx.get(f"{app.url}/api/runs/999/workers").status_code == 404


def test_worker_state_rule() -> None:
    assert worker_state("running", 1, 15) == "running"
    assert worker_state("running", 16, 15) == "dead"
    assert worker_state("dead", 0, 15) == "dead"
    assert worker_state("exited", 100, 15) == "exited"


def test_a_killed_worker_shows_dead(db_path: Path, engine: Any, live_app: Any, sim: Any, prompts: Any) -> None:
    """A real worker process killed with SIGKILL: no more heartbeats, so the dashboard marks it dead."""
    url = sim(tokens_per_s=20, reasoning_tokens="40", content_tokens="5")
    proc = popen_cli("run", "--db", str(db_path), "--dataset", str(prompts(50)), "--base-url", url,
                     "--model", "sim-reasoner", "--name", "victim", "--concurrency", "4", "--quiet")
    try:
        app = live_app(dead_worker_after_s=1.5)

        def workers() -> list[dict[str, Any]]:
            runs = httpx.get(f"{app.url}/api/runs").json()["runs"]
            if not runs:
                return []
            return httpx.get(f"{app.url}/api/runs/{runs[0]['id']}/workers").json()["workers"]  # type: ignore[no-any-return]

        wait_for(lambda: [w for w in workers() if w["state"] == "running" and w["in_flight"]], timeout_s=30,
                 what="the worker running with requests in flight")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    [w] = wait_for(lambda: [w for w in workers() if w["state"] == "dead"], timeout_s=10,
                   what="the killed worker shown dead")
    assert w["pid"] == proc.pid and w["status"] == "running"  # nobody marked it: it is dead by silence


@pytest.mark.browser
def test_run_page_lists_workers_in_a_browser(engine: Any, live_app: Any, page: Any) -> None:
    """The run page loads the workers fragment (htmx) and marks the dead worker; no browser problems."""
    with engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "page", None)
        store.set_status(conn, rid, "running")
    _add_worker(engine, rid, pid=201, status="running", age_s=0.2, done=5)
    dead = _add_worker(engine, rid, pid=202, status="dead", age_s=3, done=2)
    app = live_app(dead_worker_after_s=10)
    page.goto(f"{app.url}/runs/{rid}")
    row = page.locator(f'#run-workers tr[data-worker="{dead}"]')
    row.wait_for(timeout=10_000)
    assert row.get_attribute("data-state") == "dead" and "dead" in row.inner_text()
    assert page.locator('#run-workers tr[data-state="running"]').count() == 1
