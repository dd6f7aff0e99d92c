"""The dashboard's pages, fragments and JSON API over real HTTP against a real SQLite file."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
from conftest import run_cli
from sqlalchemy import text
from workerkit import make_config, run_row, run_to_end, wait_for

from bench.fill import series_row
from synthwatch.app import run_stats, stats, timeseries
from synthwatch.store import queue as store


@pytest.fixture
def finished_run(engine, sim, prompts) -> int:  # type: ignore[no-untyped-def]
    """A small completed run against a simulator with faults, so every panel has something to show."""
    url = sim(seed=5, rate_429=0.1, rate_500=0.05, rate_stall=0.05, stall_s=2.0)
    config = make_config(url, prompts(40), name="api-run", concurrency=8,
                         timeouts={"connect_s": 5, "total_s": 30, "idle_s": 0.5},
                         retries={"max_attempts": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05})
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    return run_id


def test_api_runs_stats_and_timeseries(live_app, engine, finished_run) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        runs = c.get("/api/runs").json()["runs"]
        assert [r["name"] for r in runs] == ["api-run"]
        r = runs[0]
        row = run_row(engine, finished_run)
        assert r["n_ok"] == row["n_ok"] and r["status"] == "completed" and r["target"] == 40
        assert r["n_ok"] + r["n_error"] + r["n_timeout"] == 40

        one = c.get(f"/api/runs/{finished_run}").json()
        assert one["config"]["model"] == "sim-reasoner"
        assert any(e["action"] == "worker_start" for e in one["control_events"])

        st = c.get(f"/api/runs/{finished_run}/stats").json()
        assert st["live"] is False
        assert st["progress"]["ok"] == row["n_ok"] and st["progress"]["target"] == 40
        # the failures the simulator injected are counted from the series, not guessed
        with engine.connect() as conn:
            failed = conn.execute(text("SELECT COUNT(*) FROM error_event WHERE run_id = :r"),
                                  {"r": finished_run}).scalar_one()
        by_kind = {f["kind"]: f["total"] for f in st["failures"]}
        assert failed > 0
        assert (by_kind["attempt_timeouts"] + by_kind["http_429"] + by_kind["http_5xx"] + by_kind["http_4xx"]
                + by_kind["dropped"] + by_kind["other_errors"]) == failed
        assert st["latency"]["latency_s"]["run_n"] == row["n_ok"]
        assert st["latency"]["latency_s"]["run_p50"] > 0
        assert dict(st["quality"]["sources"])["reasoning"] == row["n_ok"]
        assert st["quality"]["empty_reasoning_all"] == 0
        assert {t["key"] for t in st["tiles"]} >= {"timeouts", "errors", "empty_reasoning"}
        assert st["latest_errors"] and st["latest_errors"][0]["message"]

        for window in ("5m", "1h", "all"):
            ts = c.get(f"/api/runs/{finished_run}/timeseries", params={"window": window}).json()
            assert ts["window"] == window and ts["points"]
            assert sum(p["counts"]["ok"] for p in ts["points"]) == row["n_ok"]
            assert all(p["t"] % ts["bucket_s"] == 0 for p in ts["points"])

        bad = c.get(f"/api/runs/{finished_run}/timeseries", params={"window": "2h"})
        assert bad.status_code == 400 and "window" in bad.text
        missing = c.get("/api/runs/9999/stats")
        assert missing.status_code == 404 and "no run with id 9999" in missing.json()["detail"]
        errors = c.get(f"/api/runs/{finished_run}/errors", params={"limit": 3}).json()["errors"]
        assert len(errors) == 3

        schema = c.get("/openapi.json").json()
        for path in ("/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/stats", "/api/runs/{run_id}/timeseries",
                     "/api/runs/{run_id}/control", "/api/runs/{run_id}/events"):
            assert path in schema["paths"], path


def test_pages_and_fragments_render(live_app, finished_run) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        page = c.get("/runs")
        assert page.status_code == 200 and "api-run" in page.text and 'hx-get="/runs/table"' in page.text
        run_page = c.get(f"/runs/{finished_run}")
        assert run_page.status_code == 200
        body = run_page.text
        for needle in ('id="run-stats"', 'id="run-charts"', 'id="run-controls"', 'id="run-audit"',
                       "Review samples", f"/runs/{finished_run}/records", f"/runs/{finished_run}/export",
                       'data-tile="timeouts"', f'data-src="/api/runs/{finished_run}/timeseries"', 'id="lengths"',
                       "vendor/uPlot.iife.min.js"):
            assert needle in body, needle
        assert 'data-live="1"' not in body  # charts.js does not poll the charts or lengths of an ended run
        # the run has ended: nothing on the page polls any more
        assert 'hx-trigger="every' not in body
        for frag in ("stats", "charts?window=all", "audit"):
            r = c.get(f"/runs/{finished_run}/{frag}")
            assert r.status_code == 200 and 'hx-trigger="every' not in r.text
        assert c.get("/runs/9999").status_code == 404
        assert "no run with id 9999" in c.get("/runs/9999").text
        # the page stays small: HTML plus every stylesheet and script it loads
        weight = len(run_page.content)
        assets = re.findall(r'(?:href|src)="(?:https?://[^/"]+)?(/static/[^"]+)"', body)
        assert len(assets) >= 4 and any(a.endswith("htmx.min.js") for a in assets)
        for asset in assets:
            weight += len(c.get(asset).content)
        assert weight < 200_000, weight


def test_live_fragments_poll_only_while_live(live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    from workerkit import Background

    url = sim(tokens_per_s=200, seed=2)
    config = make_config(url, prompts(400), name="live", concurrency=2)
    bg = Background(engine, config).start()
    srv = live_app()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] > 0, what="first ok record")
            frag = c.get(f"/runs/{bg.run_id}/stats").text
            assert 'hx-trigger="every 2000ms"' in frag
            assert 'id="run-details"' not in frag  # the failure tables poll on their own, less often
            assert 'hx-trigger="every 10000ms"' in c.get(f"/runs/{bg.run_id}/details").text
            # the controls come along only when the run's state differs from the one the page shows
            assert 'id="run-controls"' in frag  # no shown_state: redrawn
            state = f"{run_row(engine, bg.run_id)['status']}:run"
            assert 'id="run-controls"' not in c.get(f"/runs/{bg.run_id}/stats", params={"shown_state": state}).text
            assert 'id="run-controls"' in c.get(f"/runs/{bg.run_id}/stats", params={"shown_state": "paused:pause"}).text
            assert 'data-poll-ms="10000"' in c.get(f"/runs/{bg.run_id}/charts").text  # charts.js polls the JSON
            listing = c.get("/api/runs").json()["runs"][0]
            assert listing["live"] and listing["req_s"] > 0
            r = c.post(f"/api/runs/{bg.run_id}/control", json={"action": "stop_now"})
            assert r.status_code == 200, r.text
            assert bg.join(30) == "stopped"
            frag = c.get(f"/runs/{bg.run_id}/stats").text
            assert 'hx-trigger="every' not in frag
            # the last render also switches the controls off (out-of-band)
            assert 'id="run-controls" class="controls control-bar" aria-label="Controls" data-swap-errors hx-swap-oob="outerHTML"' in frag
            assert 'data-testid="controls-ended"' in frag
    finally:
        if bg.thread.is_alive():
            store.apply_control(engine, bg.run_id, "stop_now")
            bg.join(30)


def test_control_api_validates_and_audits(live_app, engine, finished_run) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        ok = c.post(f"/api/runs/{finished_run}/control", json={"action": "cap", "value": 7})
        assert ok.status_code == 200 and ok.json()["applied"] == {"cap": 7}
        assert run_row(engine, finished_run)["cap"] == 7
        bad = c.post(f"/api/runs/{finished_run}/control", json={"action": "concurrency", "value": 0})
        assert bad.status_code == 400 and "concurrency must be between 1" in bad.json()["detail"]
        bad = c.post(f"/api/runs/{finished_run}/control", json={"action": "explode"})
        assert bad.status_code == 400 and "action" in bad.text
        # the htmx form: 400 with a readable fragment, and the audit log is re-rendered out of band
        frag = c.post(f"/runs/{finished_run}/control", data={"action": "cap", "value": "-3"},
                      headers={"HX-Request": "true"})
        assert frag.status_code == 400 and "cap must be between 1" in frag.text
        frag = c.post(f"/runs/{finished_run}/control", data={"action": "concurrency", "value": "3"},
                      headers={"HX-Request": "true"})
        assert frag.status_code == 200 and "Concurrency set: 3" in frag.text and 'id="run-audit"' in frag.text
        # without htmx the form posts and redirects back to the run
        plain = c.post(f"/runs/{finished_run}/control", data={"action": "pause"}, follow_redirects=False)
        assert plain.status_code == 303 and plain.headers["location"] == f"/runs/{finished_run}"
        events = c.get(f"/api/runs/{finished_run}/events").json()["events"]
        assert [(e["action"], e["value"], e["actor"]) for e in events[:3]] == [
            ("pause", None, "ui"), ("concurrency", "3", "ui"), ("cap", "7", "api")]
        # a cross-site form post is refused by the security middleware
        evil = c.post(f"/runs/{finished_run}/control", data={"action": "stop_now"},
                      headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
        assert evil.status_code == 403


def test_cli_control(db_path, engine, finished_run) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("control", "api-run", "concurrency", "5", "--db", str(db_path))
    assert r.returncode == 0, r.stderr
    assert run_row(engine, finished_run)["concurrency"] == 5
    r = run_cli("control", "api-run", "cap", "zero", "--db", str(db_path))
    assert r.returncode == 2 and "cap must be a positive whole number" in r.stderr
    with engine.connect() as conn:
        last = conn.execute(text("SELECT action, value, actor FROM control_event WHERE run_id = :r ORDER BY id DESC"),
                            {"r": finished_run}).first()
    assert tuple(last) == ("concurrency", "5", "cli")


@pytest.mark.slow
def test_start_run_form(live_app, engine, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    srv = live_app(launch_dataset_dirs=str(tmp_path))
    url = sim(seed=9)
    data = prompts(6)
    form: dict[str, Any] = {"name": "from-ui", "dataset": str(data), "endpoints": url, "model": "sim-reasoner",
                            "concurrency": "4", "stream": "on", "timeout_s": "30", "idle_timeout_s": "5",
                            "max_attempts": "2", "reasoning_mode": "auto", "price_in_per_mtok": "0.25",
                            "price_out_per_mtok": "1"}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.get("/runs/new").status_code == 200
        cases = [
            ({"dataset": ""}, "dataset path: required"),
            ({"dataset": str(tmp_path / "nope.jsonl")}, "does not exist"),
            ({"endpoints": "ftp://x"}, "not an http(s) URL"),
            ({"concurrency": "lots"}, "concurrency: expected a whole number"),
            ({"concurrency": "0"}, "concurrency"),
            ({"temperature": "9"}, "sampling.temperature"),
            ({"model": ""}, "model: required"),
            ({"price_in_per_mtok": "-1"}, "price_in_per_mtok"),
            ({"price_out_per_mtok": "cheap"}, "price_out_per_mtok: expected a number"),
        ]
        for change, needle in cases:
            r = c.post("/runs/new", data={**form, **change}, follow_redirects=False)
            assert r.status_code == 400, (change, r.status_code)
            assert needle in r.text, (change, r.text[-2000:])
            assert 'data-testid="form-error"' in r.text
        r = c.post("/runs/new", data=form, follow_redirects=False)
        assert r.status_code == 303, r.text[-2000:]
        run_id = int(r.headers["location"].rsplit("/", 1)[1])
        wait_for(lambda: run_row(engine, run_id)["status"] == "completed", timeout_s=60, what="UI-started run")
        assert run_row(engine, run_id)["n_ok"] == 6
        [ep] = json.loads(run_row(engine, run_id)["config_json"])["endpoints"]
        assert (ep["price_in_per_mtok"], ep["price_out_per_mtok"]) == (0.25, 1.0)  # the form's prices (#29)
        dup = c.post("/runs/new", data=form, follow_redirects=False)
        assert dup.status_code == 400 and "already exists" in dup.text
        # "Start a run like this": the run page links the form pre-filled from the run's configuration
        page = c.get(f"/runs/{run_id}").text
        assert f'href="/runs/new?like={run_id}"' in page and f"<code>{url}</code>" in page  # endpoint URLs shown
        like = c.get("/runs/new", params={"like": run_id}).text
        fields = dict(re.findall(r'<input name="(\w+)"[^>]*? value="([^"]*)"', like))
        assert fields["dataset"] == str(data) and fields["model"] == "sim-reasoner" and fields["name"] == ""
        assert fields["concurrency"] == "4" and fields["max_attempts"] == "2" and fields["timeout_s"] == "30.0"
        assert (fields["price_in_per_mtok"], fields["price_out_per_mtok"]) == ("0.25", "1.0")
        assert url in like and 'data-testid="like-run"' in like
        again = c.post("/runs/new", data={**fields, "endpoints": url, "reasoning_mode": "auto", "stream": "on",
                                           "name": "like-it"}, follow_redirects=False)
        assert again.status_code == 303, again.text[-2000:]
        api = c.post("/api/runs", json={"dataset": str(data), "endpoints": [url], "model": "sim-reasoner",
                                        "name": "from-api", "concurrency": 2})
        assert api.status_code == 201, api.text
        assert api.json()["run_id"] is not None
        wait_for(lambda: run_row(engine, api.json()["run_id"])["status"] == "completed", timeout_s=60)


def test_stats_time_limit_interrupts_slow_queries(engine) -> None:  # type: ignore[no-untyped-def]
    slow = text("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c")
    with engine.connect() as conn:
        t0 = time.monotonic()
        with pytest.raises(stats.StatsTimeout), stats.time_limit(conn, 50):
            conn.execute(slow).scalar()
        assert time.monotonic() - t0 < 2
        conn.rollback()
        # the handler is removed afterwards: later queries on the pooled connection run normally
        assert conn.execute(text("SELECT 1")).scalar() == 1


def test_long_runs_are_downsampled(engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with engine.connect() as conn, store.write_begin(conn):
        run_id = store.create_run(conn, "long", None)
        t0 = int(time.time()) // 5 * 5 - 10 * 3600
        rows = [series_row(run_id=run_id, endpoint="e", t=t0 + 5 * i, finished=4, ok=3, timeouts=1) for i in range(7200)]
        cols = list(rows[0])
        conn.execute(text(f"INSERT INTO series ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)})"), rows)
        conn.execute(text("UPDATE run SET status = 'running', started_at = :t WHERE id = :r"), {"t": t0, "r": run_id})
    with engine.connect() as conn:
        run = run_stats.get_run(conn, run_id)
        assert run is not None
        # a long history is folded into the process cache step by step (one 30-min step per request when
        # the time budget is spent at once), so no request hits the time limit
        monkeypatch.setattr(stats, "FOLD_BUDGET_S", 0.0)
        calls = 0
        while True:
            ts = timeseries.timeseries(conn, run, "all")
            calls += 1
            if ts["complete"] or calls > 50:
                break
        assert ts["complete"] and calls == 20  # 10 h of history, 30 min per request
        assert len(ts["points"]) <= stats.MAX_POINTS and ts["bucket_s"] >= 150
        assert sum(p["counts"]["ok"] for p in ts["points"]) == 3 * 7200
        assert all(abs(p["timeout_share"] - 0.25) < 1e-9 for p in ts["points"])
        hour = timeseries.timeseries(conn, run, "1h")
        assert len(hour["points"]) <= stats.MAX_POINTS
