"""Detection owns its evidence (#35): windows and alarms rebuilt from the database when a worker starts, so a run
made by many short worker processes alarms as one long one; acknowledgements counted at claim time; hysteresis.

Real workers against the simulator over a real SQLite file."""

from __future__ import annotations

from typing import Any

from test_checks_kit import alarms, writer_hooks
from workerkit import Background, create, make_config, records, run_row

from synthwatch.quality.detection.open_items import items


def _short_workers(engine: Any, config: Any, run_id: int, n_workers: int, per_worker: int) -> None:
    """n_workers workers one after another, each ending at a cap raised by per_worker records (a cap raised step
    by step; a crash loop or preemptible nodes look the same to detection: each worker starts from nothing)."""
    for i in range(1, n_workers + 1):
        cfg = config.model_copy(update={"cap": per_worker * i})
        bg = Background(engine, cfg, run_id=run_id, hooks=lambda rid, c=cfg: writer_hooks(engine, rid, c)).start()
        bg.join(120)


def test_six_short_workers_alarm_as_one_long_run(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(rate_empty_reasoning=0.3, seed=7)
    config = make_config(url, prompts(90), name="six-short", cap=15, concurrency=4)
    run_id = create(engine, config)
    _short_workers(engine, config, run_id, 6, 15)
    ok = records(engine, run_id, "status = 'ok'")
    assert len(ok) == 90
    empty = sum(1 for r in ok if not (r["reasoning"] or "").strip())
    assert 0.2 <= empty / 90 <= 0.45, empty  # the premise: far above the 5% threshold, below the 50% pause
    raised = [a for a in alarms(engine, run_id) if a["rule"] == "empty_reasoning"]
    assert raised, "six short workers at ~40% empty reasoning raised no empty_reasoning alarm"
    with engine.connect() as conn:
        open_ = [i for i in items(conn, run_id) if i["check_name"] == "empty_reasoning"]
    assert open_ and open_[0]["n_records"] == empty, open_
    assert "empty_reasoning" in (run_row(engine, run_id)["status_message"] or ""), run_row(engine, run_id)


def _oscillate(engine: Any, run_id: int, seed: int, minutes: float = 4.0, per_s: float = 10.0,
               share: float = 0.05, settings: Any = None) -> list[dict[str, Any]]:
    """A stream of empty_reasoning verdicts whose true share sits at the rule's 5% line, evaluated flush by flush
    (every 200 ms, as the writer does) with the run's clock advancing; returns the alarm rows it left."""
    import random
    from collections import deque

    from sqlalchemy import text

    from synthwatch.quality.detection.alarms import AlarmKeeper, effective_rules

    rng = random.Random(seed)
    rules = {"empty_reasoning": effective_rules({})["empty_reasoning"]}
    keeper = AlarmKeeper(run_id, "osc")
    if settings is not None:
        from synthwatch.quality.detection import Hysteresis

        keeper.hysteresis = Hysteresis.of(settings)
    window: deque[bool] = deque(maxlen=rules["empty_reasoning"].window)
    n_fail = n_total = 0
    t0 = 1_000_000.0
    flushes = int(minutes * 60 / 0.2)
    carry = 0.0
    for i in range(flushes):
        carry += per_s * 0.2
        k, carry = int(carry), carry - int(carry)
        new = [rng.random() < share for _ in range(k)]
        window.extend(new)
        n_fail += sum(new)
        n_total += len(new)
        t = t0 + i * 0.2
        with engine.connect() as conn, conn.begin():
            conn.execute(text(
                "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, updated_at)"
                " VALUES (:r, 'empty_reasoning', :f, :n, :wf, :wn, :t) ON CONFLICT (run_id, check_name) DO UPDATE"
                " SET n_fail = excluded.n_fail, n_total = excluded.n_total, win_fail = excluded.win_fail,"
                " win_total = excluded.win_total"),
                {"r": run_id, "f": n_fail, "n": n_total, "wf": sum(window), "wn": len(window), "t": t})
            keeper.evaluate(conn, t, rules, {"empty_reasoning": (sum(window), len(window))},
                            {"empty_reasoning": (n_fail, n_total, None)}, {}, allow_pause=False,
                            new_fail={"empty_reasoning": t} if any(new) else None)
    return alarms(engine, run_id)


def test_a_rate_at_the_threshold_for_4_minutes_opens_at_most_3_episodes(engine, prompts) -> None:  # type: ignore[no-untyped-def]
    """#35: a rate sitting at the 5% line opened 46 alarm episodes in 4 minutes (most lasting seconds)."""
    config = make_config("http://127.0.0.1:9/v1", prompts(5), name="osc")  # the keeper's default hysteresis
    for seed in range(6):
        run_id = create(engine, config.model_copy(update={"name": f"osc{seed}"}))
        rows = _oscillate(engine, run_id, seed)
        assert rows, "the premise: the rate crosses the threshold"
        assert len(rows) <= 3, f"seed {seed}: {len(rows)} episodes in 4 minutes"


def test_the_keepers_default_hysteresis_is_the_settings_default() -> None:
    from synthwatch.check_catalog import CheckSettings
    from synthwatch.quality.detection import Hysteresis
    from synthwatch.quality.detection.alarms import AlarmKeeper

    assert AlarmKeeper(1, "x").hysteresis == Hysteresis.of(CheckSettings()) == Hysteresis()


def _completed_with_empty_reasoning(engine: Any, sim: Any, prompts: Any, name: str) -> int:
    url = sim(rate_empty_reasoning=0.3, seed=7)
    config = make_config(url, prompts(60), name=name, concurrency=4,
                         checks={"rules": {"empty_reasoning": {"auto_pause": False}}})
    run_id = create(engine, config)
    bg = Background(engine, config, run_id=run_id, hooks=lambda rid: writer_hooks(engine, rid, config)).start()
    assert bg.join(120) == "completed"
    return run_id


def test_weakening_without_a_reason_is_refused(engine, db_path, sim, prompts, tmp_path, live_app) -> None:  # type: ignore[no-untyped-def]
    """#35: `checks RUN --config` with `disabled = [...]` closed the open item as "repaired" with 0 records
    repaired and rewrote "completed with N records failing" to "completed"; `enabled = false`, a huge min_records
    and `fix --no-reasoning-expect` needed no reason either. Each is refused without one (exit 2, naming it); with a
    reason the override is kept with who and when, and the item closes as accepted with that reason."""
    from conftest import run_cli
    from sqlalchemy import text

    from synthwatch.quality.detection.open_items import sync_run

    run_id = _completed_with_empty_reasoning(engine, sim, prompts, "weaken")
    before = run_row(engine, run_id)["status_message"] or ""
    assert "failing empty_reasoning" in before, before
    for body in ('disabled = ["empty_reasoning"]\n', '[rules.empty_reasoning]\nenabled = false\n',
                 '[rules.empty_reasoning]\nmin_records = 100000\n'):
        cfg = tmp_path / "weak.toml"
        cfg.write_text("[checks]\n" + body.replace("[rules.", "[checks.rules."))
        proc = run_cli("checks", str(run_id), "--db", str(db_path), "--config", str(cfg), "--recompute")
        assert proc.returncode == 2, (body, proc.stderr)
        assert "empty_reasoning" in proc.stderr and "reason" in proc.stderr, proc.stderr
    proc = run_cli("fix", str(run_id), "--db", str(db_path), "--no-reasoning-expect")
    assert proc.returncode == 2 and "reasoning.expect" in proc.stderr, proc.stderr
    sync_run(engine, run_id)
    with engine.connect() as conn:
        [item] = [i for i in items(conn, run_id) if i["check_name"] == "empty_reasoning"]
    assert item["state"] == "open" and item["n_records"] > 0
    assert run_row(engine, run_id)["status_message"] == before
    # with a reason: recorded, and the item accepted with it (never "repaired" by a check that stopped running)
    cfg = tmp_path / "weak.toml"
    cfg.write_text('[checks]\ndisabled = ["empty_reasoning"]\n')
    proc = run_cli("checks", str(run_id), "--db", str(db_path), "--config", str(cfg), "--recompute",
                   "--reason", "this model skips thinking on short prompts")
    assert proc.returncode == 0, proc.stderr
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(text("SELECT * FROM check_override WHERE run_id = :r"),
                                              {"r": run_id}).mappings()]
        closed = [i for i in items(conn, run_id, include_closed=True) if i["check_name"] == "empty_reasoning"]
    assert [(r["kind"], r["check_name"], r["actor"]) for r in rows] == [("disabled", "empty_reasoning", "cli")]
    assert rows[0]["reason"] == "this model skips thinking on short prompts" and rows[0]["created_at"] > 0
    assert [i["state"] for i in closed] == ["accepted"] and "override" in closed[0]["reason"]
    # shown on the run (its banner), the export page and the export manifest
    import json

    import httpx
    from conftest import HTTP_TIMEOUT_S

    c = httpx.Client(base_url=live_app().url, timeout=HTTP_TIMEOUT_S)
    for page in (f"/runs/{run_id}/alarms/banner", f"/runs/{run_id}/export"):
        html = c.get(page).text
        assert "this model skips thinking on short prompts" in html and "empty_reasoning disabled" in html, page
    out = tmp_path / "out.jsonl"
    proc = run_cli("export", str(run_id), "--db", str(db_path), "--format", "messages", "--out", str(out),
                   "--allow-open-alarms")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert [(o["check"], o["reason"], o["by"]) for o in manifest["overrides"]] == [
        ("empty_reasoning", "this model skips thinking on short prompts", "cli")]


def test_one_count_on_the_runs_list_the_strip_the_banner_and_the_api(engine, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    """#35: the runs list, the alarm strip and the tab title gave three different counts within a minute (the
    strip and the title counted unacknowledged alarms, the list every open one). All read problem_counts now."""
    import re
    import time

    import httpx
    from conftest import HTTP_TIMEOUT_S
    from sqlalchemy import text

    run_id = create(engine, make_config("http://127.0.0.1:9/v1", prompts(5), name="counts"))
    with engine.begin() as conn:
        for rule, acked in (("empty_reasoning", None), ("truncated", time.time()), ("repetition", None)):
            conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
                " auto_paused, acked_at) VALUES (:r, :rule, 'warning', :rule, 'm', 1, :t, :t, :active, false, :a)"),
                {"r": run_id, "rule": rule, "t": time.time(), "active": rule != "repetition", "a": acked})
    c = httpx.Client(base_url=live_app().url, timeout=HTTP_TIMEOUT_S)
    runs_page = c.get("/runs").text
    strip = c.get(f"/runs/{run_id}/alarms/strip").text
    banner = c.get(f"/runs/{run_id}/alarms/banner").text
    api = c.get(f"/api/runs/{run_id}/alarms").json()
    assert "2 alarms" in runs_page, runs_page[:2000]
    for html in (strip, banner):  # what alarms.js puts in the tab title
        assert re.search(r'data-alarm-count="(\d+)"', html).group(1) == "2", html[:500]  # type: ignore[union-attr]
    assert api["problems"]["alarms"] == 2 and api["problems"]["episodes"] == 3


def test_a_judge_answering_prose_raises_its_own_alarm(tmp_path, sim, db_path) -> None:  # type: ignore[no-untyped-def]
    """#35: a judge that answers in prose gives `error` verdicts, and the run ended "completed" with no alarm. Past
    the run's error_share_threshold the judge's errors raise an alarm of their own, naming the error, and the
    completed run's message names the open problem."""
    from conftest import run_cli
    from test_judge import judge_toml, write_prompts

    from synthwatch.quality.detection.open_items import sync_run
    from synthwatch.store.db import open_engine

    gen = sim(seed=22, reasoning_tokens="5-10", content_tokens="8-12")
    prose = sim(seed=3, model="sim-judge", reasoning_tokens="5-10", content_tokens="8-12")  # not a judge: prose
    data = write_prompts(tmp_path / "p.jsonl", 25)
    run_cli("run", "--dataset", str(data), "--base-url", gen, "--model", "sim-reasoner", "--db", str(db_path),
            "--name", "prose", "--quiet", check=True)
    cfg = judge_toml(tmp_path / "j.toml", gen, prose, data, fraction=1.0)
    run_cli("judge", "prose", "--db", str(db_path), "--config", str(cfg), check=True)
    engine = open_engine(str(db_path))
    try:
        run_id = run_row(engine, 1)["id"]
        with engine.connect() as conn:
            from sqlalchemy import text

            states = [r[0] for r in conn.execute(text("SELECT state FROM check_verdict WHERE check_name = 'judge'"))]
        assert states and set(states) == {"error"}, states  # the premise: prose is no verdict
        raised = [a for a in alarms(engine, run_id) if a["rule"] == "judge:error"]
        assert raised and raised[0]["active"], alarms(engine, run_id)
        assert "errors" in raised[0]["message"] and "Latest error:" in raised[0]["message"]
        sync_run(engine, run_id)
        assert "judge:error" in (run_row(engine, run_id)["status_message"] or ""), run_row(engine, run_id)
    finally:
        engine.dispose()


def test_six_small_imports_alarm_as_one(tmp_path, db_path, engine, capsys) -> None:  # type: ignore[no-untyped-def]
    """#35: `import` of six small files, one after another into one run, each a process of its own with its windows
    empty at start, raised no alarm at a third of the records without reasoning."""
    from test_ingest import _write, cli

    for f in range(6):
        rows = [{"idx": f * 15 + i, "question": f"q{f}-{i}", "reasoning": "" if i % 3 == 0 else "thinking it over",
                 "content": f"answer {f}-{i}"} for i in range(15)]
        rc, err = cli(capsys, "import", str(_write(tmp_path / f"part{f}.jsonl", rows)), "--db", str(db_path),
                      "--run", "parts")
        assert rc == 0, err
    with engine.connect() as conn:
        from sqlalchemy import text

        run_id = conn.execute(text("SELECT id FROM run WHERE name = 'parts'")).scalar_one()
        assert conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r"), {"r": run_id}).scalar_one() == 90
    raised = [a for a in alarms(engine, run_id) if a["rule"] == "empty_reasoning"]
    assert raised, [a["rule"] for a in alarms(engine, run_id)]
    with engine.connect() as conn:
        assert [i for i in items(conn, run_id) if i["check_name"] == "empty_reasoning"]


def test_a_provisional_verdict_is_replaced_by_the_final_one_never_counted_twice() -> None:
    """The API for in-flight evidence (a streamed answer not finished yet): observe() counts a provisional verdict
    at once; another one for the same record replaces it; the final one (or the writer's settle) takes its place."""
    from synthwatch.quality.detection import Window, observe

    w = Window(4, [False, False])
    windows = {"empty_reasoning": w}
    observe(windows, 7, "empty_reasoning", "fail")
    assert w.counts() == (1, 3)
    observe(windows, 7, "empty_reasoning", "fail")  # the same record again: still one
    observe(windows, 8, "empty_reasoning", "pass")
    assert w.counts() == (1, 4)
    observe(windows, 7, "empty_reasoning", "pass", final=True)  # the final verdict replaces the provisional one
    assert w.counts() == (0, 4) and w.provisional == {8: False}
    w.extend([True])
    w.settle([8])  # the writer counted record 8's final verdict
    assert w.counts() == (1, 4) and not w.provisional
    observe(windows, 9, "empty_reasoning", "fail")
    observe(windows, 9, "empty_reasoning", "error")  # an error is neither: the provisional verdict goes
    assert w.counts() == (1, 4)
    for i in range(10, 20):  # never more than the window's size
        observe(windows, i, "empty_reasoning", "fail")
    assert w.counts() == (4, 4)


def test_two_workers_at_once_share_one_view(any_engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """#35: several workers of one run (SQLite, PostgreSQL) share one view: the alarm each would raise from its own
    records is one alarm row, and each worker's windows cover the others' records."""
    engine = any_engine
    url = sim(rate_empty_reasoning=0.3, seed=11, ttft_ms=5)
    config = make_config(url, prompts(120), name="two-at-once", concurrency=4,
                         checks={"rules": {"empty_reasoning": {"auto_pause": False}}})
    run_id = create(engine, config)
    bgs = [Background(engine, config, run_id=run_id, hooks=lambda rid: writer_hooks(engine, rid, config)).start()
           for _ in range(2)]
    for bg in bgs:
        bg.join(180)
    raised = [a for a in alarms(engine, run_id) if a["rule"] == "empty_reasoning"]
    assert len(raised) == 1, raised  # one episode, whichever worker saw it first
    from sqlalchemy import text

    with engine.connect() as conn:  # the premise: both workers claimed records
        busy = conn.execute(text("SELECT COUNT(*) FROM worker WHERE run_id = :r AND claimed > 0"), {"r": run_id}).scalar()
    assert busy == 2, busy


def test_the_store_keeps_only_the_queue_and_detection_writes_acknowledgements() -> None:
    """#35 Must have 8: one module owns detection state. store/queue.py claims and resumes by asking detection
    (quality.detection: claim_gate, resume_gate); it reads and writes no alarm, snooze or acknowledgement itself."""
    import inspect

    from synthwatch.quality import detection
    from synthwatch.store import queue

    src = inspect.getsource(queue)
    for word in ("UPDATE alarm", "FROM alarm", "acked_at", "snooze_until", "snooze_records", "MAX_ACK"):
        assert word not in src, f"store/queue.py still handles {word!r}: detection state belongs to quality.detection"
    assert "resume_gate" in detection.__all__ and "claim_gate" in detection.__all__
