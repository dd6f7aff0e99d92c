"""The repair loop end to end: alarm -> snooze -> fix -> re-derive -> re-run -> export, on SQLite and PostgreSQL.

Real workers against the simulator over real HTTP, real databases; the only thing the tests drive is what a
person would: controls, acknowledgements and repairs through the library calls the CLI and the API use."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S
from test_checks_kit import CheckedBackground, alarms, completed_mismatch_run, events, stats
from workerkit import make_config, records, run_row, wait_for

from synthwatch.export.plan import ExportOptions
from synthwatch.export.stream import export_run
from synthwatch.quality.detection import alarms as alarms_mod
from synthwatch.repair import actions as repair
from synthwatch.repair import history as repair_history
from synthwatch.store import queue as store
from synthwatch.store import versions


def _sim_chat_requests(url: str) -> int:
    return int(httpx.get(f"{url.removesuffix('/v1')}/sim/stats", timeout=HTTP_TIMEOUT_S).json()["chat_requests"])


def _finished(engine: Any, run_id: int) -> int:
    r = run_row(engine, run_id)
    return int(r["n_ok"] + r["n_error"] + r["n_timeout"])


def _paused(engine: Any, run_id: int) -> bool:
    try:
        r = run_row(engine, run_id)
    except store.NotFound:  # a CLI worker that has not created its run yet
        return False
    return r["status"] == "paused" and r["n_in_flight"] == 0


def _banner(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return alarms_mod.banner_alarms(conn, run_id)


@pytest.mark.parametrize("tokens_per_s", [0, 400], ids=["full-speed", "realistic-pace"])
def test_mismatch_pauses_within_100_records_at_any_speed(engine, sim, prompts, tokens_per_s) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=21, tokens_per_s=tokens_per_s,
              reasoning_tokens="8-24", content_tokens="4-12")
    config = make_config(url, prompts(2000), concurrency=4, reasoning={"mode": "reasoning_content"},
                         name=f"fast-{tokens_per_s}", flush_interval_ms=200)
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: _paused(engine, bg.run_id), timeout_s=30, what="auto-pause")
        # the requests in flight at the pause end (and are stored) before the count
        wait_for(lambda: run_row(engine, bg.run_id)["n_in_flight"] == 0, timeout_s=30, what="in-flight to drain")
        n = _finished(engine, bg.run_id)
        assert 1 <= n < 100, f"{n} records stored before the auto-pause"
        assert run_row(engine, bg.run_id)["desired"] == "pause"
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(30)


def test_story_snooze_fix_rederive_rerun_export(any_engine, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = any_engine
    url = sim(reasoning_field="reasoning", seed=22, ttft_ms=5, reasoning_tokens="8-24", content_tokens="4-12")
    cap = 150
    config = make_config(url, prompts(300), concurrency=4, reasoning={"mode": "reasoning_content"}, name="story",
                         cap=cap)
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    try:
        # 1. the alarm pauses the run
        wait_for(lambda: _paused(engine, run_id), timeout_s=30, what="first auto-pause")
        [first] = _banner(engine, run_id)
        assert first["rule"] == "field_mismatch" and first["auto_paused"]
        n1 = _finished(engine, run_id)
        assert n1 < 100
        # 2. acknowledge + resume: a snooze, not an off switch. An open-ended acknowledgement does not let a plain
        # resume go on (#35); one for 10 records lets 10 claims through, then the alarm holds the run again
        alarms_mod.acknowledge(engine, run_id, first["id"], actor="tester")
        assert _banner(engine, run_id) == []
        with pytest.raises(store.AlarmOpen):
            store.apply_control(engine, run_id, "resume", actor="tester")
        store.apply_control(engine, run_id, "resume", actor="tester", ack_records=10)
        wait_for(lambda: _finished(engine, run_id) > n1 and _paused(engine, run_id)
                 and run_row(engine, run_id)["n_in_flight"] == 0, timeout_s=30, what="second auto-pause")
        [second] = _banner(engine, run_id)
        assert second["rule"] == "field_mismatch" and second["id"] == first["id"]  # the same episode, held again
        n2 = _finished(engine, run_id)
        assert n2 - n1 <= 10
        assert "snooze_over" in [e["action"] for e in events(engine, run_id)]
        # 3. fix the reading: a new config version; stored records keep their answers until re-derived
        res = versions.change_settings(engine, run_id, {"reasoning.mode": "reasoning"}, actor="tester",
                                       reason="the server sends `reasoning`")
        assert res["version"] == 2
        assert res["changes"] == [{"path": "reasoning.mode", "old": "reasoning_content", "new": "reasoning",
                                   "kind": "reading"}]
        with engine.connect() as conn:
            sel = repair.select(conn, run_id, alarm_id=second["id"])
        requests_before = _sim_chat_requests(url)
        preview = repair.preview_rederive(engine, run_id, sel)
        assert preview["selected"] == n2 and preview["changed"] == n2 and preview["cannot"] == 0
        ex = preview["examples"][0]
        assert ex["before"]["reasoning"] == "" and ex["after"]["reasoning"]
        assert "field_mismatch" in ex["before"]["failing"] and "field_mismatch" not in ex["after"]["failing"]
        assert records(engine, run_id, "status = 'ok' AND reasoning != ''") == []  # the preview changed nothing
        done = repair.rederive_records(engine, run_id, sel, actor="tester")
        assert done["changed"] == n2
        assert _sim_chat_requests(url) == requests_before  # no new request
        ok = records(engine, run_id, "status = 'ok'")
        assert len(ok) == n2 and all(r["reasoning"] and r["check_flags"] == 0 for r in ok)
        assert all(r["derive_version"] == 2 and r["gen_version"] == 1 and r["revision"] == 1 for r in ok)
        assert [a for a in alarms(engine, run_id) if a["active"]] == []  # the cause is gone: the alarm clears
        assert stats(engine, run_id)["field_mismatch"]["n_fail"] == 0
        with engine.connect() as conn:
            hist = repair_history.history(conn, ok[0]["id"])
        assert len(hist) == 1 and hist[0]["reasoning"] == "" and hist[0]["action"] == "rederive"
        # 4. resume to the cap: the running worker adopted version 2 (its checks read the new setting before the
        # resume: the held run claims nothing until then, so no record is read the old way)
        wait_for(lambda: bg.worker.writer.hooks[0].ctx.mode == "reasoning", timeout_s=30, what="version 2 adopted")
        store.apply_control(engine, run_id, "resume", actor="tester")
        assert bg.join(60) == "completed"
        run = run_row(engine, run_id)
        assert run["n_ok"] == cap and run["status_message"].startswith("cap of")
        new = records(engine, run_id, "status = 'ok' AND gen_version = 2")
        assert len(new) == cap - n2 and all(r["reasoning"] for r in new)
        # 5. export: no empty reasoning, and the manifest counts the re-derived ones
        out = tmp_path / "story.jsonl"
        manifest = export_run(engine, run_id, ExportOptions(format="sharegpt", out=out))
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == cap
        assert manifest["repairs"]["rederived"] == n2 and manifest["repairs"]["rerun"] == 0
        assert manifest["repairs"]["config_versions"] == {"generated": {"1": n2, "2": cap - n2},
                                                          "derived": {"2": cap}}
    finally:
        if bg.thread.is_alive():
            store.apply_control(engine, run_id, "stop")
            bg.join(30)


def test_rerun_truncated_keeps_history_and_the_cap(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    engine = any_engine
    url = sim(reasoning_field="reasoning", seed=23, reasoning_tokens="8-24", content_tokens="4-12")
    cap = 120
    config = make_config(url, prompts(400), concurrency=8, name="trunc", cap=cap,
                         sampling={"max_tokens": 12})
    bg = CheckedBackground(engine, config).start()
    assert bg.join(60) == "completed"
    run_id = bg.run_id
    truncated = records(engine, run_id, "status = 'ok' AND finish_reason = 'length'")
    assert len(truncated) >= 50
    ids = [r["id"] for r in truncated[:50]]
    versions.change_settings(engine, run_id, {"sampling.max_tokens": 4096}, actor="tester")
    with engine.connect() as conn:
        sel = repair.select(conn, run_id, ids=ids)
    assert repair.preview_rerun(engine, run_id, sel)["queued"] == 50
    res = repair.rerun_records(engine, run_id, sel, actor="tester")
    assert res["queued"] == 50
    run = run_row(engine, run_id)
    assert run["n_ok"] == cap - 50 and run["n_rerun"] == 50 and run["n_pending"] >= 50
    # queueing again is idempotent: they are already queued
    assert repair.rerun_records(engine, run_id, sel, actor="tester")["queued"] == 0
    final = _resume(engine, run_id, config)
    assert final == "completed"
    run = run_row(engine, run_id)
    assert run["n_ok"] == cap and run["n_rerun"] == 0
    ok = {r["id"]: r for r in records(engine, run_id, "status = 'ok'")}
    assert len(ok) == cap
    for i in ids:  # every re-run record: answered again under version 2, old answer in its history
        assert ok[i]["gen_version"] == 2 and ok[i]["finish_reason"] == "stop" and ok[i]["rerun"] == 0
        with engine.connect() as conn:
            [h] = repair_history.history(conn, i)
        assert h["finish_reason"] == "length" and h["action"] == "rerun" and h["gen_version"] == 1


def _resume(engine: Any, run_id: int, config: Any) -> str:
    from workerkit import Background

    from synthwatch.quality.live import writer_hooks

    bg = Background(engine, config, run_id, hooks=lambda r: writer_hooks(engine, r, None)).start()
    return bg.join(60)


def test_undo_rederive_restores_and_keeps_history(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    run_id = completed_mismatch_run(engine, sim(reasoning_field="reasoning", seed=24, reasoning_tokens="8-24",
                                                content_tokens="4-12"), prompts(40), "undo")
    assert run_row(engine, run_id)["status_message"].startswith("completed with 40 records failing field_mismatch")
    versions.change_settings(engine, run_id, {"reasoning": {"mode": "auto"}}, actor="t")
    with engine.connect() as conn:
        sel = repair.select(conn, run_id, check="field_mismatch")
    r = repair.rederive_records(engine, run_id, sel, actor="t")
    assert r["changed"] == 40
    u = repair_history.undo(engine, run_id, r["repair_id"], actor="t")
    assert u["restored"] == 40
    ok = records(engine, run_id, "status = 'ok'")
    assert all(x["reasoning"] == "" and x["revision"] == 2 for x in ok)
    assert stats(engine, run_id)["field_mismatch"]["n_fail"] == 40
    with engine.connect() as conn:
        h = repair_history.history(conn, ok[0]["id"])
        reps = repair_history.list_repairs(conn, run_id)
    assert [x["action"] for x in h] == ["undo", "rederive"] and h[0]["reasoning"]
    assert reps[0]["kind"] == "undo" and reps[1]["undone_at"] is not None
    with pytest.raises(repair.RepairError, match="already undone"):
        repair_history.undo(engine, run_id, r["repair_id"])


def test_autopause_off_is_recorded_and_completion_names_the_failures(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=25, reasoning_tokens="8-24", content_tokens="4-12")
    config = make_config(url, prompts(60), concurrency=4, reasoning={"mode": "reasoning_content"}, name="off")
    bg = CheckedBackground(engine, config).start()
    run_id = bg.run_id
    wait_for(lambda: _paused(engine, run_id), timeout_s=30, what="auto-pause")
    with pytest.raises(alarms_mod.OverrideError, match="needs a reason"):
        alarms_mod.set_auto_pause(engine, run_id, "field_mismatch", False, reason="", actor="t")
    alarms_mod.set_auto_pause(engine, run_id, "field_mismatch", False, reason="known: fixed by re-derive later",
                              actor="tester")
    with engine.connect() as conn:
        [ov] = alarms_mod.list_overrides(conn, run_id)
    assert ov["check_name"] == "field_mismatch" and ov["actor"] == "tester"
    ev = [e for e in events(engine, run_id) if e["action"] == "auto_pause_off"]
    assert ev and ev[0]["detail"] == "known: fixed by re-derive later"
    for a in _banner(engine, run_id):
        alarms_mod.acknowledge(engine, run_id, a["id"])
    store.apply_control(engine, run_id, "resume")
    assert bg.join(60) == "completed"
    run = run_row(engine, run_id)
    assert run["status"] == "completed"
    assert run["status_message"].startswith("completed with 60 records failing field_mismatch"), run["status_message"]


@pytest.mark.slow
def test_resume_with_changed_flags_is_refused_then_versioned(db_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    from conftest import run_cli

    from synthwatch.store.db import open_engine

    url = sim(reasoning_field="reasoning", seed=26, reasoning_tokens="4-8", content_tokens="4-8")
    data = prompts(30)
    base = ["run", "--db", str(db_path), "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner",
            "--name", "resumed", "--concurrency", "4", "--quiet"]
    first = run_cli(*base, "--max-tokens", "8192", "--cap", "10")
    assert first.returncode == 0, first.stderr
    refused = run_cli(*base, "--max-tokens", "16384", "--cap", "20")
    assert refused.returncode == 2
    assert "sampling.max_tokens: 8192 -> 16384" in refused.stderr and "--new-config-version" in refused.stderr
    engine = open_engine(str(db_path))
    assert run_row(engine, 1)["n_ok"] == 10  # nothing ran
    ok = run_cli(*base, "--max-tokens", "16384", "--cap", "20", "--new-config-version", "--reason", "longer")
    assert ok.returncode == 0, ok.stderr
    assert "config version 2" in ok.stderr
    rows = records(engine, 1, "status = 'ok'")
    assert sorted(r["gen_version"] for r in rows) == [1] * 10 + [2] * 10
    with engine.connect() as conn:
        vs = versions.list_versions(conn, 1)
    assert [(v["version"], v["generated"]) for v in vs] == [(1, 10), (2, 10)]
    assert vs[1]["reason"] == "longer" and vs[1]["changes"][0]["path"] == "sampling.max_tokens"
    assert orjson.loads(run_row(engine, 1)["config_json"])["sampling"]["max_tokens"] == 16384
    # a bare resume by name needs no flags at all, and changes nothing
    again = run_cli("run", "--db", str(db_path), "--name", "resumed", "--quiet")
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_cli_fix_rederive_rerun_over_ssh(db_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    from conftest import popen_cli, run_cli

    from synthwatch.store.db import open_engine

    url = sim(reasoning_field="reasoning", seed=27, reasoning_tokens="8-24", content_tokens="4-12")
    worker = popen_cli("run", "--db", str(db_path), "--dataset", str(prompts(40)), "--base-url", url, "--model",
                       "sim-reasoner", "--name", "cli", "--concurrency", "4", "--reasoning-mode", "reasoning_content",
                       "--quiet")
    try:
        engine = open_engine(str(db_path))
        wait_for(lambda: _paused(engine, 1), timeout_s=60, what="auto-pause")  # paused by the alarm
        stop = run_cli("control", "cli", "stop", "--db", str(db_path))
        assert stop.returncode == 0, stop.stderr
        _out, err = worker.communicate(timeout=60)
        assert worker.returncode == 3, err  # stopped
    finally:
        if worker.poll() is None:
            worker.kill()
    fix = run_cli("fix", "cli", "--db", str(db_path), "--reasoning-mode", "reasoning", "--reason", "field renamed")
    assert fix.returncode == 0, fix.stderr
    assert "config version 2" in fix.stdout and "reasoning.mode" in fix.stdout
    dry = run_cli("rederive", "cli", "--db", str(db_path), "--check", "field_mismatch", "--dry-run")
    assert dry.returncode == 0 and "change" in dry.stdout
    assert records(engine, 1, "status = 'ok' AND reasoning != ''") == []
    do = run_cli("rederive", "cli", "--db", str(db_path), "--check", "field_mismatch", "--json")
    assert do.returncode == 0, do.stderr
    res = json.loads(do.stdout)
    assert res["changed"] >= 1 and res["cannot"] == 0
    assert records(engine, 1, "status = 'ok' AND (reasoning IS NULL OR reasoning = '')") == []
    bad = run_cli("rerun", "cli", "--db", str(db_path), "--check", "nope")
    assert bad.returncode == 2 and "unknown check 'nope'" in bad.stderr
    n_ok = run_row(engine, 1)["n_ok"]
    rr = run_cli("rerun", "cli", "--db", str(db_path), "--filter", "status=ok&finish_reason=stop", "--json")
    assert rr.returncode == 0 and json.loads(rr.stdout)["queued"] == n_ok
    # the re-runs and the rest of the dataset are generated by a bare resume, under version 2
    resumed = run_cli("run", "--db", str(db_path), "--name", "cli", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    ok = records(engine, 1, "status = 'ok'")
    assert len(ok) == 40 and all(r["gen_version"] == 2 and r["reasoning"] for r in ok)
    assert run_row(engine, 1)["n_rerun"] == 0
    listed = run_cli("repairs", "cli", "--db", str(db_path))
    assert "rederive" in listed.stdout and "rerun" in listed.stdout
    vs = run_cli("versions", "cli", "--db", str(db_path))
    assert "v2 (current)" in vs.stdout and "field renamed" in vs.stdout
    ap = run_cli("autopause", "cli", "empty_reasoning", "off", "--db", str(db_path))
    assert ap.returncode == 2 and "needs a reason" in ap.stderr


@pytest.mark.slow
def test_kill_9_during_reruns_loses_or_doubles_nothing(db_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    from conftest import kill_9_repeatedly, run_cli

    from synthwatch.store.db import open_engine

    url = sim(reasoning_field="reasoning", seed=28, tokens_per_s=120, reasoning_tokens="8-24", content_tokens="4-12")
    cap = 100
    base = ["run", "--db", str(db_path), "--dataset", str(prompts(200)), "--base-url", url, "--model",
            "sim-reasoner", "--name", "k9", "--concurrency", "8", "--cap", str(cap), "--max-tokens", "10", "--quiet"]
    first = run_cli(*base, timeout=180)
    assert first.returncode == 0, first.stderr
    engine = open_engine(str(db_path))
    truncated = [r["id"] for r in records(engine, 1, "status = 'ok' AND finish_reason = 'length'")]
    assert len(truncated) >= 50
    fix = run_cli("fix", "k9", "--db", str(db_path), "--max-tokens", "4096")
    assert fix.returncode == 0, fix.stderr
    rr = run_cli("rerun", "k9", "--db", str(db_path), "--ids", ",".join(map(str, truncated[:50])), "--json")
    assert rr.returncode == 0 and json.loads(rr.stdout)["queued"] == 50
    resume = ["run", "--db", str(db_path), "--name", "k9", "--quiet"]
    kills = kill_9_repeatedly(resume, rounds=8, wait_s=(0.6, 1.5), seed=7)
    final = run_cli(*resume, timeout=180)
    assert final.returncode == 0, final.stderr
    assert kills >= 1
    run = run_row(engine, 1)
    ok = records(engine, 1, "status = 'ok'")
    assert run["n_ok"] == len(ok) == cap and run["n_rerun"] == 0
    assert records(engine, 1, "status IN ('in_flight', 'pending') AND rerun = 1") == []
    by_id = {r["id"]: r for r in ok}
    for i in truncated[:50]:
        assert by_id[i]["gen_version"] == 2 and by_id[i]["revision"] == 1
        with engine.connect() as conn:
            hist = repair_history.history(conn, i)
        assert len(hist) == 1 and hist[0]["finish_reason"] == "length"  # one re-run, recorded once
