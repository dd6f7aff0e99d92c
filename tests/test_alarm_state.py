"""An alarm is a state (#26): no resume path disarms an auto-pause, the snooze is read by the claim, the pause
thresholds hold for their failure modes, and the words on the banner and the CLI describe the run as it is.

A real worker against the simulator, a real SQLite file, the real CLI and HTTP."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from conftest import run_cli
from sqlalchemy import text
from test_checks_kit import CheckedBackground, alarms, events
from workerkit import make_config, run_row, wait_for

from synthwatch.store import queue as store


def _paused(engine: Any, run_id: int) -> bool:
    return run_row(engine, run_id)["status"] == "paused"


def _claimed_since(engine: Any, run_id: int, t: float) -> int:
    """Records claimed after t (claimed_at stays set on a record once it finished)."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND claimed_at > :t"),
                                {"r": run_id, "t": t}).scalar_one())


def _claimed(engine: Any, run_id: int) -> int:
    r = run_row(engine, run_id)
    return int(r["total"] - r["n_pending"])


def _idle(engine: Any, run_id: int) -> bool:
    r = run_row(engine, run_id)
    return r["status"] == "paused" and r["n_in_flight"] == 0


def _mismatch_run(engine: Any, sim: Any, prompts: Any, name: str, n: int = 400, conc: int = 4) -> Any:
    url = sim(reasoning_field="reasoning", seed=2, ttft_ms=20)
    config = make_config(url, prompts(n), concurrency=conc, reasoning={"mode": "reasoning_content"}, name=name)
    bg = CheckedBackground(engine, config).start()
    wait_for(lambda: _idle(engine, bg.run_id), timeout_s=60, what="auto-pause")
    return bg


def test_plain_resume_is_refused_everywhere_and_the_claim_holds(engine, db_path, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    """Resume without acknowledging: refused by the store, the CLI and the API; a resume that gets past them
    (an old client writing desired = 'run') claims nothing and pauses the run again, saying why."""
    bg = _mismatch_run(engine, sim, prompts, "hold")
    run_id = bg.run_id
    try:
        [alarm] = alarms(engine, run_id)
        assert alarm["auto_paused"] and alarm["acked_at"] is None
        with pytest.raises(store.AlarmOpen) as e:
            store.apply_control(engine, run_id, "resume")
        assert f"alarm #{alarm['id']} field_mismatch" in str(e.value) and "--for-records" in str(e.value)
        proc = run_cli("control", "hold", "resume", "--db", str(db_path))
        assert proc.returncode == 2, proc.stderr
        assert "not resumed" in proc.stderr and "synthwatch control hold resume --ack --for-records" in proc.stderr
        srv = live_app()
        r = httpx.post(f"{srv.url}/api/runs/{run_id}/control", json={"action": "resume"})
        assert r.status_code == 409 and r.json()["alarms"][0]["rule"] == "field_mismatch", r.text
        assert run_row(engine, run_id)["desired"] == "pause"
        # around every check above: the state itself
        t0 = time.time()
        before = _claimed(engine, run_id)
        with engine.begin() as conn:
            conn.execute(text("UPDATE run SET desired = 'run' WHERE id = :r"), {"r": run_id})
        wait_for(lambda: run_row(engine, run_id)["desired"] == "pause", timeout_s=10, what="paused again")
        wait_for(lambda: "paused by alarm" in (run_row(engine, run_id)["status_message"] or ""), timeout_s=10,
                 what="the reason in the status")
        assert _claimed(engine, run_id) == before and _claimed_since(engine, run_id, t0) == 0
        held = [ev for ev in events(engine, run_id) if ev["action"] == "pause" and ev["t"] > t0]
        assert held and held[0]["actor"] == "alarm" and "not acknowledged" in held[0]["detail"]
        # acknowledge and resume for 10 records (the CLI): exactly 10 more are claimed, then the run pauses
        # again because the check failed since; the alarm is back on the banner
        proc = run_cli("control", "hold", "resume", "--ack", "--for-records", "10", "--db", str(db_path))
        assert proc.returncode == 0, proc.stderr
        assert f"acknowledged alarm #{alarm['id']} field_mismatch for 10 more records" in proc.stderr
        wait_for(lambda: _idle(engine, run_id) and run_row(engine, run_id)["desired"] == "pause"
                 and _claimed(engine, run_id) > before, timeout_s=30, what="paused after the snooze")
        assert _claimed(engine, run_id) == before + 10
        again = alarms(engine, run_id)[-1]
        assert again["active"] and again["acked_at"] is None and again["snooze_records"] is None
        assert any(ev["action"] == "snooze_over" for ev in events(engine, run_id))
        html = httpx.get(f"{srv.url}/runs/{run_id}/alarms/banner").text
        assert f'data-alarm-id="{again["id"]}"' in html and "Acknowledge and resume" in html
        assert "pauses the run at the first failing record" in html
    finally:
        store.apply_control(engine, run_id, "stop")
        bg.join(30)


def test_restart_after_stop_holds_the_pause(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C (a graceful stop of this worker), then the run started again (`synthwatch run --name X`: the new
    worker sets the run going): the open alarm holds it; no record is claimed."""
    bg = _mismatch_run(engine, sim, prompts, "restart")
    run_id = bg.run_id
    bg.worker.local_stop = "stop"  # what the SIGINT handler sets
    bg.worker._wake.set()
    assert bg.join(30) == "stopped"
    before = _claimed(engine, run_id)
    t0 = time.time()
    from test_checks_kit import writer_hooks
    from workerkit import Background

    again = Background(engine, bg.config, run_id=run_id,
                       hooks=lambda rid: writer_hooks(engine, rid, bg.config)).start()
    try:
        wait_for(lambda: "paused by alarm" in (run_row(engine, run_id)["status_message"] or ""), timeout_s=20,
                 what="the restarted worker held by the alarm")
        assert _claimed(engine, run_id) == before and _claimed_since(engine, run_id, t0) == 0
        assert again.worker.pause_note.startswith("paused by alarm #")
    finally:
        store.apply_control(engine, run_id, "stop")
        again.join(30)


def test_ack_for_4_at_concurrency_16_lets_4_claims_through(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """#35: an open-ended acknowledgement no longer lets a plain resume go on (it let the run claim until a failure
    was written); acknowledge and resume for 4 records at concurrency 16 lets exactly 4 claims through, counted
    when claimed (it let 16 through: the 4 were counted as they finished), then the alarm holds the run again."""
    from synthwatch.quality.detection.alarms import acknowledge

    bg = _mismatch_run(engine, sim, prompts, "ack4c16", n=2000, conc=16)
    run_id = bg.run_id
    try:
        [alarm] = alarms(engine, run_id)
        acknowledge(engine, run_id, alarm["id"], actor="test")
        with pytest.raises(store.AlarmOpen):
            store.apply_control(engine, run_id, "resume")
        t_ack = time.time()
        store.apply_control(engine, run_id, "resume", ack_records=4)
        wait_for(lambda: _claimed_since(engine, run_id, t_ack) > 0, timeout_s=30, what="claims after the ack")
        wait_for(lambda: _idle(engine, run_id) and run_row(engine, run_id)["desired"] == "pause", timeout_s=30,
                 what="paused again")
        assert _claimed_since(engine, run_id, t_ack) == 4
        with pytest.raises(store.AlarmOpen):  # used up: a plain resume is refused again
            store.apply_control(engine, run_id, "resume")
    finally:
        store.apply_control(engine, run_id, "stop")
        bg.join(30)


@pytest.mark.slow
def test_empty_reasoning_at_58_percent_pauses(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", rate_empty_reasoning=0.58, seed=4)
    config = make_config(url, prompts(600), concurrency=4, reasoning={"mode": "auto"}, name="er58")
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: _idle(engine, bg.run_id), timeout_s=60, what="auto-pause at 58%")
        got = {a["rule"]: a for a in alarms(engine, bg.run_id)}
        assert got["empty_reasoning"]["auto_paused"], got
        r = run_row(engine, bg.run_id)
        assert r["n_ok"] < 200 and "paused by alarm" in r["status_message"]
        html = httpx.get(f"{live_app().url}/runs/{bg.run_id}/alarms/banner").text
        assert "This check pauses at ≥ 50% over the last 100 records (from 50 on)." in html
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)


# Over 30 s for the dead port (~35 s here): every connection attempt to a dead port is refused and retried with
# backoff until the errors' window (20 records) pauses the run; the retries are the time.
@pytest.mark.slow
@pytest.mark.parametrize("case", ["wrong-model", "dead-port"])
def test_every_request_failing_pauses_and_prints_the_server_error(db_path, sim, prompts, case) -> None:  # type: ignore[no-untyped-def]
    import socket

    url = sim(reasoning_field="reasoning", seed=3)
    model = "sim-reasoner"
    if case == "wrong-model":
        model = "no-such-model"
        said = "The model `no-such-model` does not exist."
    else:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        s.close()
        said = "Connect"
    # the preflight refuses both before anything is written (exit 2, tests/test_first_hour.py); a server that
    # starts failing after the run began is what this rule is for, hence --no-preflight here
    first = run_cli("run", "--dataset", str(prompts(3000)), "--base-url", url, "--model", model, "--db",
                    str(db_path), "--name", case, "--quiet", timeout=180)
    assert first.returncode == 2 and not db_path.exists(), first.stdout + first.stderr
    proc = run_cli("run", "--dataset", str(prompts(3000)), "--base-url", url, "--model", model, "--db", str(db_path),
                   "--name", case, "--concurrency", "8", "--quiet", "--no-preflight", timeout=180)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # paused, never 0
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert f"run '{case}' paused" in last and "paused by alarm" in last and "the server said:" in last, last
    assert said.lower() in last.lower(), last
    n = int(last.split(": ", 1)[1].split(" ok, ")[1].split(" errors")[0])
    assert n < 200, last  # not the 3000 prompts


def test_a_run_whose_every_request_failed_never_completes(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """Fewer records than any pause window: the run still ends 'failed', naming the server's words."""
    from workerkit import run_to_end

    url = sim(reasoning_field="reasoning", seed=3)
    config = make_config(url, prompts(6), concurrency=2, model="no-such-model", retries={"max_attempts": 1})
    run_id, final = run_to_end(engine, config)
    assert final == "failed"
    r = run_row(engine, run_id)
    assert r["status"] == "failed" and r["n_ok"] == 0 and r["n_error"] == 6
    assert "every request failed" in r["status_message"] and "does not exist" in r["status_message"]


def test_banner_mid_repair_never_proposes_the_current_value(engine, db_path, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    bg = _mismatch_run(engine, sim, prompts, "midrepair")
    run_id = bg.run_id
    srv = live_app()
    try:
        before = httpx.get(f"{srv.url}/api/runs/{run_id}/alarms").json()["banner"][0]
        assert 'Set reasoning.mode = "reasoning"' in before["fix"]
        proc = run_cli("fix", "midrepair", "--reasoning-mode", "reasoning", "--db", str(db_path))
        assert proc.returncode == 0, proc.stderr
        wait_for(lambda: run_row(engine, run_id)["config_version"] == 2, timeout_s=10, what="config version 2")
        time.sleep(0)  # the worker reloads its settings within 2 s; the banner must be right at any moment
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            [a] = httpx.get(f"{srv.url}/api/runs/{run_id}/alarms").json()["banner"]
            assert "auto (or" not in a["fix"] and 'Set reasoning.mode = "reasoning"' not in a["fix"], a["fix"]
            assert "reads `auto`" not in a["message"], a["message"]
            assert "it reads `reasoning` now" in a["message"] and "re-derive" in a["fix"], a
            time.sleep(0.5)
    finally:
        store.apply_control(engine, run_id, "stop")
        bg.join(30)


def test_checks_ack_says_what_it_snoozed_and_lists_it(engine, db_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    bg = _mismatch_run(engine, sim, prompts, "ackcli")
    run_id = bg.run_id
    try:
        [alarm] = alarms(engine, run_id)
        proc = run_cli("checks", "ackcli", "--ack", str(alarm["id"]), "--for-minutes", "30", "--db", str(db_path))
        assert proc.returncode == 0, proc.stderr
        assert f"acknowledged: alarm #{alarm['id']} field_mismatch" in proc.stderr
        assert "snoozed until 20" in proc.stderr and "UTC (30 min from now)" in proc.stderr
        assert "[snoozed] #" in proc.stdout and "no active alarms" not in proc.stdout
        assert "no unacknowledged alarms" in proc.stdout
        data = json.loads(run_cli("checks", "ackcli", "--json", "--db", str(db_path)).stdout)
        assert [a["id"] for a in data["snoozed"]] == [alarm["id"]] and data["alarms"] == []
        # the snooze lets a resume through: it is an acknowledgement for 30 minutes
        store.apply_control(engine, run_id, "resume")
    finally:
        store.apply_control(engine, run_id, "stop")
        bg.join(30)


def test_completed_message_counts_from_one_snapshot(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    from test_checks_kit import completed_mismatch_run

    url = sim(reasoning_field="reasoning", seed=2, ttft_ms=5)
    run_id = completed_mismatch_run(engine, url, prompts(120), "snap")
    r = run_row(engine, run_id)
    assert r["status"] == "completed" and r["n_ok"] == 120
    assert r["status_message"].startswith("completed with 120 records failing field_mismatch"), r["status_message"]
    assert "all prompts processed: 120 ok" in r["status_message"], r["status_message"]


def test_the_claim_gate_on_both_backends(any_engine, prompts) -> None:  # type: ignore[no-untyped-def]
    """The gate itself, on SQLite and PostgreSQL: an open pausing alarm refuses every claim and pauses the run; a
    snooze for N records lets exactly N through, read in the claim's own transaction; when it is over, the claim
    pauses again while the alarm is open, whether or not a record failed since: the N are counted as they are
    claimed, not as they finish (#35; it used to let claims go on until a failure was written)."""
    from workerkit import create

    from synthwatch.check_catalog import BIT

    engine = any_engine
    run_id = create(engine, make_config("http://127.0.0.1:9/v1", prompts(50)))
    with engine.begin() as conn:
        wid = store.register_worker(conn, run_id)
        aid = conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, 'field_mismatch', 'error', 'Reasoning is in a field this run does not read',"
            " 'm', 1, :t, :t, true, true) RETURNING id"), {"r": run_id, "t": time.time()}).scalar_one()

    def claim(n: int) -> tuple[int, str]:
        with engine.connect() as conn, store.write_begin(conn):
            store.lock_run(conn, run_id)
            got, why = store.claim(conn, run_id, wid, n, 60)
        return len(got), why

    assert claim(10) == (0, "alarm")
    assert run_row(engine, run_id)["desired"] == "pause"
    assert "not acknowledged" in [e for e in events(engine, run_id) if e["action"] == "pause"][-1]["detail"]
    with pytest.raises(store.AlarmOpen):
        store.apply_control(engine, run_id, "resume")
    out = store.apply_control(engine, run_id, "resume", ack_records=3)
    assert out["acknowledged"][0]["id"] == aid and out["acknowledged"][0]["snooze_records"] == 3
    assert claim(10) == (3, "snooze")
    # nothing finished since the acknowledgement: the 3 claims used it up all the same, the run pauses again
    assert claim(5) == (0, "alarm")
    assert run_row(engine, run_id)["desired"] == "pause"
    # an acknowledgement without a bound does not let a plain resume go on (#35)
    from synthwatch.quality.detection.alarms import acknowledge

    acknowledge(engine, run_id, aid, "test")
    with pytest.raises(store.AlarmOpen):
        store.apply_control(engine, run_id, "resume")
    # a failing record finished after a second bounded acknowledgement: over, the run pauses again
    store.apply_control(engine, run_id, "resume", ack_records=2)
    assert claim(10) == (2, "snooze")
    with engine.begin() as conn:
        conn.execute(text("UPDATE record SET status = 'ok', finished_at = :t, check_flags = :b WHERE id ="
                          " (SELECT MIN(id) FROM record WHERE run_id = :r AND status = 'in_flight')"),
                     {"t": time.time() + 1, "b": BIT["field_mismatch"], "r": run_id})
    assert claim(10) == (0, "alarm")
    a = alarms(engine, run_id)[0]
    assert a["acked_at"] is None and a["snooze_records"] is None and run_row(engine, run_id)["desired"] == "pause"


@pytest.mark.parametrize(("ctx", "says", "never"), [
    ({"fields": ["reasoning"], "mode": "reasoning_content"}, 'Set reasoning.mode = "reasoning" (or "auto")', None),
    # after `fix --reasoning-mode reasoning`, before the re-derive: the fix left is the re-derive
    ({"fields": ["reasoning"], "mode": "reasoning_content", "current_mode": "reasoning"},
     "The reading setting is fixed: re-derive", 'Set reasoning.mode = "reasoning"'),
    # a repair's reload lost what the run read when the records were made (after `repairs --undo`)
    ({"fields": ["reasoning"], "current_mode": "reasoning"}, "it reads `reasoning` now", "reads `auto`"),
    ({"fields": ["reasoning"], "current_mode": "auto"}, "The reading setting is fixed", 'Set reasoning.mode = "auto"'),
    ({"current_mode": "auto"}, "Open the example record", 'Set reasoning.mode = "auto"'),
])
def test_the_proposed_fix_is_never_the_current_value(ctx: dict[str, Any], says: str, never: str | None) -> None:
    from synthwatch.check_catalog import DEFAULT_RULES
    from synthwatch.quality.alarm_text import describe

    msg, fix = describe(DEFAULT_RULES["field_mismatch"], 3, 4, 3, 4, ctx)
    assert says in msg + " " + fix, (msg, fix)
    assert "auto (or" not in fix and '"auto" (or "auto")' not in fix
    if never:
        assert never not in msg + " " + fix, (msg, fix)
