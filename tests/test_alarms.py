"""Alarms end to end: a real worker against the simulator, a real SQLite file, real HTTP."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from html import escape as html_escape
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S
from test_checks_kit import CheckedBackground, alarms, events, run_checked, stats
from workerkit import make_config, records, run_row, wait_for

from synthwatch.quality.checks import parse_settings, with_canaries
from synthwatch.store import queue as store


def patch_sim(url: str, **changes: Any) -> None:
    req = urllib.request.Request(f"{url}/sim/config", data=json.dumps(changes).encode(), method="PATCH",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
        assert resp.status == 200


class Receiver:
    """A local webhook receiver on a free port; keeps every JSON body it gets."""

    def __init__(self) -> None:
        got: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                got.append({"body": json.loads(self.rfile.read(n)), "ctype": self.headers.get("Content-Type")})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.got = got
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Any:
    r = Receiver()
    yield r
    r.close()


def _paused(engine: Any, run_id: int) -> bool:
    return run_row(engine, run_id)["status"] == "paused"


def _finished(engine: Any, run_id: int) -> int:
    r = run_row(engine, run_id)
    return int(r["n_ok"] + r["n_error"] + r["n_timeout"])


@pytest.mark.parametrize(("sim_field", "mode", "names"), [
    ("reasoning", "reasoning_content", ["`reasoning`", "`reasoning_content`"]),
    ("inline", "reasoning", ["inline `<think>` tags", "`reasoning`"]),
    ("reasoning_content", "reasoning", ["`reasoning_content`", "`reasoning`"]),
], ids=["reasoning-vs-reasoning_content", "inline-vs-field", "reasoning_content-vs-reasoning"])
def test_field_mismatch_auto_pauses_and_names_both_fields(engine, sim, prompts, live_app, receiver, sim_field,
                                                          mode, names) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field=sim_field, seed=2, ttft_ms=20)
    config = make_config(url, prompts(400), concurrency=4, reasoning={"mode": mode}, name=f"mm-{sim_field}",
                         webhook_url=receiver.url)
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: _paused(engine, bg.run_id), timeout_s=30, what="auto-pause")
        assert _finished(engine, bg.run_id) < 100
        [alarm] = alarms(engine, bg.run_id)  # the cause only: its symptoms (empty reasoning...) raise nothing
        assert alarm["rule"] == "field_mismatch"
        assert alarm["active"] and alarm["auto_paused"] and alarm["severity"] == "error"
        for n in names:
            assert n in alarm["message"], alarm["message"]
        want = {"reasoning": "reasoning", "inline": "inline", "reasoning_content": "reasoning_content"}[sim_field]
        assert f'reasoning.mode = "{want}"' in alarm["fix"]
        ex = next(r for r in records(engine, bg.run_id) if r["id"] == alarm["example_record_id"])
        assert json.loads(ex["check_json"])["field_mismatch"]["fields"] == [want]
        pause = [e for e in events(engine, bg.run_id) if e["action"] == "pause"]
        assert pause and pause[0]["actor"] == "alarm" and "field_mismatch" in pause[0]["detail"]
        # the banner over real HTTP names both fields and links the example
        srv = live_app()
        html = httpx.get(f"{srv.url}/runs/{bg.run_id}/alarms/banner").text
        assert "Reasoning is in a field this run does not read" in html
        for n in names:  # `x` is shown as <code>x</code>, escaped
            assert re.sub(r"`([^`]*)`", lambda m: f"<code>{html_escape(m.group(1))}</code>", n) in html, n
        assert f'href="/runs/{bg.run_id}/records/{alarm["example_record_id"]}"' in html
        assert 'hx-trigger="every 2s"' in html  # live run: the banner keeps polling
        # the webhook got the alarm (and the pause)
        wait_for(lambda: len(receiver.got) >= 2, timeout_s=10, what="webhook calls")
        body = receiver.got[0]["body"]
        assert receiver.got[0]["ctype"] == "application/json"
        assert body["event"] == "alarm" and body["run"] == {"id": bg.run_id, "name": config.name}
        assert body["alarm"]["rule"] == "field_mismatch" and body["counts"]["window_fail"] >= 1
        assert body["link"].endswith(f"/runs/{bg.run_id}") and body["example_link"]
        assert receiver.got[1]["body"]["event"] == "auto_pause"
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)


def test_all_empty_reasoning_pauses_after_50(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", rate_empty_reasoning=1.0, seed=4)
    config = make_config(url, prompts(300), concurrency=4, reasoning={"mode": "auto"})
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: _paused(engine, bg.run_id), timeout_s=30, what="auto-pause")
        assert 50 <= _finished(engine, bg.run_id) < 100
        got = {a["rule"]: a for a in alarms(engine, bg.run_id)}
        assert got["empty_reasoning"]["auto_paused"] and got["empty_reasoning"]["active"]
        assert "have no reasoning although the run expects it" in got["empty_reasoning"]["message"]
        assert "reasoning_tokens_no_text" in got  # the server counted reasoning tokens it did not send
        assert "field_mismatch" not in got
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)


def test_healthy_run_of_1000_raises_nothing(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=11)
    config = make_config(url, prompts(1000), concurrency=16, reasoning={"mode": "reasoning"},
                         checks={"canary": {"every_n": 50}})
    t0 = time.monotonic()
    run_id, final = run_checked(engine, config, timeout_s=120)
    elapsed = time.monotonic() - t0
    assert final == "completed"
    assert alarms(engine, run_id) == []
    st = stats(engine, run_id)
    total = len(list(with_canaries(range(1000), parse_settings({"canary": {"every_n": 50}}))))
    assert total == 1020  # dataset prompts + a canary as every 50th queued prompt
    assert st["empty_reasoning"]["n_total"] == total and st["field_mismatch"]["n_total"] == total
    assert st["canary_failed"]["n_total"] == total - 1000 and st["canary_failed"]["n_fail"] == 0
    assert all(s["n_fail"] == 0 for s in st.values()), {k: s["n_fail"] for k, s in st.items() if s["n_fail"]}
    assert st["timeout"]["win_total"] == 200 and st["empty_reasoning"]["win_total"] == 100
    assert all(r["check_flags"] == 0 and r["check_json"] is None for r in records(engine, run_id))
    assert elapsed < 60


def test_server_drift_names_the_record(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=5, ttft_ms=30)
    config = make_config(url, prompts(200), concurrency=2)
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: _finished(engine, bg.run_id) >= 20, what="20 records")
        patch_sim(url, fingerprint="vllm-0.40.0-sim")
        wait_for(lambda: any(a["rule"] == "server_drift" for a in alarms(engine, bg.run_id)), what="drift alarm")
        [a] = [a for a in alarms(engine, bg.run_id) if a["rule"] == "server_drift"]
        assert a["severity"] == "warning" and not a["auto_paused"]
        assert "`vllm-0.32.0-sim` to `vllm-0.40.0-sim`" in a["message"]
        changed = next(r for r in records(engine, bg.run_id) if r["id"] == a["example_record_id"])
        assert changed["system_fingerprint"] == "vllm-0.40.0-sim"
        assert f"at record #{changed['id']}" in a["message"]
        assert run_row(engine, bg.run_id)["desired"] == "run"  # a warning does not pause
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)


def test_failed_canary_raises_an_alarm(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=6)
    canary = {"every_n": 5, "prompts": [{"prompt": "What is 2 + 2?", "answer": "5"}]}
    config = make_config(url, prompts(20), checks={"canary": canary})
    run_id, final = run_checked(engine, config)
    assert final == "completed"
    [a] = alarms(engine, run_id)
    assert a["rule"] == "canary_failed" and "does not contain '5'" in a["message"]
    canaries = [r for r in records(engine, run_id) if r["idx"] < 0]
    assert len(canaries) == 4 and all(r["source_id"].startswith("synthwatch-canary:") for r in canaries)


@pytest.mark.slow
def test_recompute_after_settings_change_cli(engine, db_path, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import run_cli

    url = sim(reasoning_field="reasoning", seed=8, rate_empty_reasoning=0.05)
    config = make_config(url, prompts(150), concurrency=8,
                         checks={"rules": {"empty_reasoning": {"threshold": 0.5},
                                           "reasoning_tokens_no_text": {"enabled": False}}})
    run_id, final = run_checked(engine, config)
    assert final == "completed"
    before = stats(engine, run_id)["empty_reasoning"]
    assert 0 < before["n_fail"] < 15 and alarms(engine, run_id) == []
    bad = tmp_path / "bad.toml"
    bad.write_text("[checks.rules.empty_reasoning]\nthreshhold = 0.01\n")
    proc = run_cli("checks", str(run_id), "--db", str(db_path), "--config", str(bad))
    assert proc.returncode == 2 and "checks.rules.empty_reasoning.threshhold: unknown key" in proc.stderr
    good = tmp_path / "good.toml"
    quiet = "[checks.rules.reasoning_tokens_no_text]\nenabled = false\n"
    good.write_text("[checks.rules.empty_reasoning]\nthreshold = 0.01\n" + quiet)
    proc = run_cli("checks", str(run_id), "--db", str(db_path), "--config", str(good), "--recompute", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["recompute"]["records"] == 150 and "empty_reasoning" in out["recompute"]["raised"]
    assert [a["rule"] for a in out["alarms"]] == ["empty_reasoning"]
    after = stats(engine, run_id)["empty_reasoning"]
    assert (after["n_fail"], after["n_total"]) == (before["n_fail"], before["n_total"])
    flagged = [r for r in records(engine, run_id) if r["check_flags"]]
    assert len(flagged) >= before["n_fail"]
    # a lenient threshold again weakens detection: refused without a reason (#35); with one, the recompute clears
    # the alarm
    good.write_text("[checks.rules.empty_reasoning]\nthreshold = 0.5\n" + quiet)
    proc = run_cli("checks", str(run_id), "--db", str(db_path), "--config", str(good), "--recompute")
    assert proc.returncode == 2 and "threshold raised from 0.01 to 0.5" in proc.stderr, proc.stderr
    proc = run_cli("checks", str(run_id), "--db", str(db_path), "--config", str(good), "--recompute",
                   "--reason", "back to the lenient threshold we agreed")
    assert proc.returncode == 0 and "no active alarms" in proc.stdout


def test_api_rates_ack_and_settings(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="inline", seed=9)
    config = make_config(url, prompts(30), reasoning={"mode": "reasoning_content"})
    bg = CheckedBackground(engine, config).start()
    wait_for(lambda: _paused(engine, bg.run_id), what="auto-pause")
    store.apply_control(engine, bg.run_id, "stop")
    bg.join(30)
    srv = live_app()
    c = httpx.Client(base_url=srv.url)
    checks = c.get(f"/api/runs/{bg.run_id}/checks").json()
    by = {x["check_name"]: x for x in checks["checks"]}
    assert by["field_mismatch"]["n_fail"] == by["field_mismatch"]["n_total"] > 0
    assert by["think_tags_in_content"]["win_rate"] == 1.0
    assert checks["rules"]["empty_reasoning"]["threshold"] == 0.05
    body = c.get(f"/api/runs/{bg.run_id}/alarms").json()
    [a] = body["banner"]
    assert a["rule"] == "field_mismatch"
    # the run has ended: the banner no longer polls
    html = c.get(f"/runs/{bg.run_id}/alarms/banner").text
    assert "hx-trigger" not in html and "Acknowledge" in html
    r = c.post(f"/runs/{bg.run_id}/alarms/{a['id']}/ack", headers={"HX-Request": "true"})
    assert r.status_code == 200 and "Acknowledge" not in r.text
    assert c.get(f"/api/runs/{bg.run_id}/alarms").json()["banner"] == []
    assert c.post(f"/api/runs/{bg.run_id}/alarms/99999/ack").status_code == 404
    # settings: bad input names the key; good input is stored and shown
    r = c.post(f"/api/runs/{bg.run_id}/checks/settings", json={"rules": {"timeout": {"window": 0}}})
    assert r.status_code == 400 and "checks.rules.timeout.window" in r.json()["detail"]
    r = c.post(f"/api/runs/{bg.run_id}/checks/settings", json={"rules": {"timeout": {"window": 500}}})
    assert r.status_code == 200
    assert c.get(f"/api/runs/{bg.run_id}/checks").json()["rules"]["timeout"]["window"] == 500
    # the form on the checks page: a bad number is a 400 page naming the field, a good one saves
    form = {f"computed__{n}": "on" for n in by} | {"threshold__empty_reasoning": "abc"}
    r = c.post(f"/runs/{bg.run_id}/checks/settings", data=form)
    assert r.status_code == 400 and "empty_reasoning threshold" in r.text
    form["threshold__empty_reasoning"] = "10%"
    r = c.post(f"/runs/{bg.run_id}/checks/settings", data=form)  # a raised threshold weakens detection (#35)
    assert r.status_code == 400 and "weakens detection" in r.text and "reason" in r.text
    form["reason"] = "a tenth is what this model does on trivial prompts"
    r = c.post(f"/runs/{bg.run_id}/checks/settings", data=form)
    assert r.status_code == 303
    assert c.get(f"/api/runs/{bg.run_id}/checks").json()["rules"]["empty_reasoning"]["threshold"] == 0.1
    page = c.get(f"/runs/{bg.run_id}/checks")
    assert page.status_code == 200 and "Alarm history" in page.text and "acknowledged" in page.text
    r = c.post(f"/api/runs/{bg.run_id}/checks/recompute")
    assert r.status_code == 202
    wait_for(lambda: c.get(f"/api/runs/{bg.run_id}/checks").json()["last_recompute"], what="recompute")
    assert c.get("/api/runs/424242/alarms").status_code == 404


def test_timeouts_raise_an_alarm(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=12, rate_stall=0.3, stall_s=3.0)
    config = make_config(url, prompts(40), concurrency=8, timeouts={"connect_s": 5, "total_s": 30, "idle_s": 0.3},
                         retries={"max_attempts": 1})
    run_id, final = run_checked(engine, config)
    assert final == "completed"
    st = stats(engine, run_id)["timeout"]
    assert st["n_total"] == 40 and st["n_fail"] >= 5
    [a] = [a for a in alarms(engine, run_id) if a["rule"] == "timeout"]
    assert "finished as timeouts" in a["message"] and "concurrency" in a["fix"]
    assert not any(a["rule"] == "empty_reasoning" for a in alarms(engine, run_id))


@pytest.mark.slow
def test_cli_worker_prints_the_alarm_and_pauses(db_path, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import signal
    import subprocess

    from conftest import popen_cli, run_cli

    url = sim(reasoning_field="reasoning", seed=13, ttft_ms=20)
    data = prompts(300)
    bad = tmp_path / "bad.toml"
    bad.write_text("[checks.rules.field_mismatch]\nauto_paus = true\n")
    proc = run_cli("run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", str(db_path),
                   "--name", "bad", "--config", str(bad), "--quiet")
    assert proc.returncode == 2 and "checks.rules.field_mismatch.auto_paus: unknown key" in proc.stderr
    p = popen_cli("run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", str(db_path),
                  "--name", "cli-mm", "--reasoning-mode", "reasoning_content", "--concurrency", "4", "--quiet")
    lines: list[str] = []

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        wait_for(lambda: any("AUTO-PAUSED" in ln for ln in lines), timeout_s=60, what="terminal alarm line")
        alarm = next(ln for ln in lines if "ALARM run 'cli-mm'" in ln)
        assert "sends reasoning in `reasoning`; this run reads `reasoning_content`" in alarm
        assert "/runs/1/records/" in alarm
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
        t.join(5)


def test_settings_changed_via_api_apply_to_the_running_worker(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=15, rate_empty_reasoning=0.2, ttft_ms=40)
    config = make_config(url, prompts(400), concurrency=4,
                         checks={"rules": {"empty_reasoning": {"enabled": False},
                                           "reasoning_tokens_no_text": {"enabled": False}}})
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: _finished(engine, bg.run_id) >= 40, what="40 records")
        assert alarms(engine, bg.run_id) == []
        srv = live_app()
        r = httpx.post(f"{srv.url}/api/runs/{bg.run_id}/checks/settings",
                       json={"rules": {"reasoning_tokens_no_text": {"enabled": False}}})
        assert r.status_code == 200
        wait_for(lambda: any(a["rule"] == "empty_reasoning" for a in alarms(engine, bg.run_id)), timeout_s=15,
                 what="alarm after the settings change")
        assert run_row(engine, bg.run_id)["status"] == "running"  # 20 % is an alarm, not a pause
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)
