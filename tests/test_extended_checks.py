"""Extended checks end to end (#30): a real worker against the simulator, a real SQLite file, check processes.

User checks (entry point, module path, TOML rule) raise alarms and auto-pause exactly like built-in checks; a
check that raises or overruns its budget is its own 'error' verdict and the run goes on; verifiers, language and
near-duplicates are judged on crafted records through the recompute path."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S
from sqlalchemy import text
from test_checks_kit import CheckedBackground, alarms, stats
from workerkit import make_config, run_row, wait_for

from synthwatch.quality import verdicts as vd
from synthwatch.quality.extended import recheck
from synthwatch.store import queue as store

pytestmark = pytest.mark.slow  # each starts check processes (spawned interpreters)


def dataset(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "rows.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            a, b = 3 + i % 97, 5 + (i * 7) % 89
            fh.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
                                 "answer": str(a + b)}) + "\n")
    return path


def user_package(root: Path) -> Path:
    """A package with a synthwatch.checks entry point, made importable by a dist-info folder (no pip install)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "swtest_checks.py").write_text(textwrap.dedent('''
        import time

        def boxed(record):
            return ("\\\\boxed{" in record.content, "the answer has no \\\\boxed{}")

        def moody(record, row):
            if record.idx % 5 == 1:
                raise RuntimeError("this check broke on purpose")
            if record.idx % 5 == 2:
                time.sleep(30)  # far over its budget
            if record.idx % 5 == 3:
                raise SystemExit(3)  # user code may even try to end the process
            return {"passed": True, "score": 1.0, "label": row.get("answer")}
    '''))
    dist = root / "swtest_checks-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: swtest-checks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[synthwatch.checks]\nboxed = swtest_checks:boxed\n")
    return root


def pauses(name: str) -> dict[str, Any]:
    return {name: {"auto_pause": True, "pause_threshold": 0.5, "pause_min_records": 20, "min_records": 10}}


def _verdicts(engine: Any, run_id: int, check: str) -> dict[int, vd.StoredVerdict]:
    with engine.connect() as conn:
        return {rid: v[check] for rid, v in vd.latest(conn, run_id, check).items()}


@pytest.mark.parametrize("how", ["entry_point", "toml_rule"])
def test_a_user_check_raises_an_alarm_and_auto_pauses(how: str, engine, sim, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The simulator never writes \\boxed{}: the user's check fails every record, alarms and pauses the run."""
    if how == "entry_point":
        monkeypatch.syspath_prepend(str(user_package(tmp_path / "pkg")))  # the check processes inherit sys.path
        name, checks = "user:boxed", {"user": [{"name": "boxed"}]}
    else:
        name, checks = "rule:has_boxed", {"rule": [{"name": "has_boxed", "regex": r"\\boxed\{"}]}
    url = sim(reasoning_field="reasoning", seed=5, ttft_ms=100)  # a pace at which the pause lands mid-run
    config = make_config(url, dataset(tmp_path, 1000), concurrency=4, checks={**checks, "rules": pauses(name)})
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused", timeout_s=90, what="auto-pause")
        got = {a["rule"]: a for a in alarms(engine, bg.run_id)}
        assert got[name]["auto_paused"] and got[name]["active"]
        assert f"failed the {name} check" in got[name]["message"]
        st = stats(engine, bg.run_id)[name]
        assert st["n_fail"] == st["n_total"] >= 20
        assert run_row(engine, bg.run_id)["n_ok"] < 1000  # paused before the end
        fails = _verdicts(engine, bg.run_id, name)
        assert fails and all(v.state == "fail" for v in fails.values())
        with engine.connect() as conn:  # the claim refuses while the alarm is open, whatever resumes the run
            blocked, _ = store.alarm_gate(conn, bg.run_id, 0, 0.0, reopen=False)
            conn.rollback()
        assert [a["rule"] for a in blocked] == [name]
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(60)


def test_a_check_that_raises_or_overruns_is_its_own_error_and_the_run_goes_on(engine, sim, tmp_path,  # type: ignore[no-untyped-def]
                                                                             monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(user_package(tmp_path / "pkg")))
    url = sim(reasoning_field="reasoning", seed=6)
    config = make_config(url, dataset(tmp_path, 20), concurrency=4, checks={
        "user": [{"name": "moody", "function": "swtest_checks:moody", "timeout_s": 0.5}],
        "rule": [{"name": "short", "max_chars": 100_000}],
        "extended": {"row_fields": ["answer"]},  # the dataset row's field the user check reads
    })
    bg = CheckedBackground(engine, config).start()
    assert bg.join(120) == "completed"
    run = run_row(engine, bg.run_id)
    assert run["n_ok"] == 20
    with engine.connect() as conn:
        idx = {r[0]: r[1] for r in conn.execute(text("SELECT id, idx FROM record WHERE run_id = :r"),
                                                {"r": bg.run_id})}
        assert vd.pending_count(conn, bg.run_id) == 0  # the worker drained its checks before it ended
    got = _verdicts(engine, bg.run_id, "user:moody")
    assert len(got) == 20
    for rid, v in got.items():
        kind = idx[rid] % 5
        if kind == 1:
            assert v.state == "error" and "RuntimeError: this check broke on purpose" in (v.verdict.reason or "")
        elif kind == 2:
            assert v.state == "error" and "time budget" in (v.verdict.reason or "")
        elif kind == 3:
            assert v.state == "error" and "SystemExit" in (v.verdict.reason or "")
        else:
            assert v.state == "pass" and v.verdict.label is not None  # it saw the dataset row's answer
    rules = _verdicts(engine, bg.run_id, "rule:short")
    assert len(rules) == 20 and all(v.state == "pass" for v in rules.values())  # the other check is unharmed
    # 12 of 20 verdicts are errors: the broken check raises an alarm of its own naming the error (#35), and the run
    # does not end a plain "completed"
    with engine.connect() as conn:
        broken = conn.execute(text("SELECT message, active FROM alarm WHERE run_id = :r AND rule = 'user:moody:error'"),
                              {"r": bg.run_id}).all()
    assert broken and broken[0][1] and "12 of the last 20 verdicts of user:moody are errors" in broken[0][0], broken
    assert "user:moody:error" in (run_row(engine, bg.run_id)["status_message"] or ""), run_row(engine, bg.run_id)


# ------------------------------------------------------------------------------------ crafted records


def crafted_run(engine: Any, checks: dict[str, Any], rows: list[tuple[str, str, dict[str, Any]]]) -> tuple[int, list[int]]:
    """A finished run whose ok records are (prompt, content, dataset row fields), as a worker would store them."""
    from synthwatch.config import RunConfig

    cfg = RunConfig.model_validate({"name": "crafted", "dataset": {"path": "x.jsonl"}, "model": "m",
                                    "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}], "checks": checks})
    ids = []
    with engine.connect() as conn, store.write_begin(conn):
        run_id = store.create_run(conn, "crafted", cfg)
        for i, (prompt, content, row) in enumerate(rows):
            ids.append(conn.execute(text(
                "INSERT INTO record (run_id, idx, rnd, prompt_json, status, content_null, attempts, check_flags,"
                " reasoning, content, finished_at, row_json) VALUES (:r, :i, 0.5, :p, 'ok', false, 1, 0, 'think',"
                " :c, :t, :row) RETURNING id"),
                {"r": run_id, "i": i, "p": orjson.dumps([{"role": "user", "content": prompt}]).decode(), "c": content,
                 "t": 1000.0 + i, "row": orjson.dumps(row).decode()}).scalar_one())
        conn.execute(text("UPDATE run SET status = 'completed', total = :n, n_ok = :n WHERE id = :r"),
                     {"n": len(rows), "r": run_id})
    return run_id, ids


EN = "Could you explain in a few sentences why the sky looks blue on a clear day?"


def test_language_and_near_duplicates_on_crafted_records(engine) -> None:  # type: ignore[no-untyped-def]
    base = ("The sky looks blue because air molecules scatter short blue wavelengths of sunlight far more "
            "strongly than the longer red wavelengths, so blue light reaches our eyes from every direction.")
    rows = [
        (EN, base, {}),
        (EN, base.replace("far more strongly", "much more strongly"), {}),  # a near-duplicate of the first
        (EN, "Der Himmel ist blau, weil die Luftmoleküle das kurzwellige blaue Licht der Sonne viel stärker "
             "streuen als das langwellige rote Licht.", {}),  # German answer to an English prompt
        ("Pourquoi le ciel est-il bleu pendant une belle journée sans nuages ?",
         "Le ciel est bleu parce que les molécules de l'air diffusent beaucoup plus la lumière bleue du soleil "
         "que la lumière rouge.", {}),  # French to French: fine
        (EN, "Rayleigh scattering: the intensity of scattered light grows with the inverse fourth power of the "
             "wavelength, which favours blue over red, and our eyes are more sensitive to blue than violet.", {}),
    ]
    run_id, ids = crafted_run(engine, {"language": {"enabled": True, "languages": ["en", "de", "fr"]},
                                       "near_duplicate": {"enabled": True, "threshold": 0.5}}, rows)
    with engine.connect() as conn:
        assert vd.pending_count(conn, run_id) == 5
    out = recheck(engine, run_id)
    assert out["records"] == 5
    lang = _verdicts(engine, run_id, "language")
    assert [lang[i].state for i in ids] == ["pass", "pass", "fail", "pass", "pass"]
    assert lang[ids[2]].verdict.label == "de" and "expected language is en" in (lang[ids[2]].verdict.reason or "")
    dup = _verdicts(engine, run_id, "near_duplicate")
    assert [dup[i].state for i in ids] == ["pass", "fail", "pass", "pass", "pass"]
    assert f"record {ids[0]}" in (dup[ids[1]].verdict.reason or "")
    st = stats(engine, run_id)
    assert (st["language"]["n_fail"], st["language"]["n_total"]) == (1, 5)
    assert (st["near_duplicate"]["n_fail"], st["near_duplicate"]["n_total"]) == (1, 5)
    with engine.connect() as conn:
        assert vd.pending_count(conn, run_id) == 0


def test_verifiers_on_crafted_records(engine) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "required": ["name", "age"], "properties": {"age": {"type": "integer"}}}
    rows = [
        ("q", "So the result is $\\boxed{\\frac{1}{2}}$.", {"answer": "0.5", "letter": "B", "schema": schema}),
        ("q", "The final answer is \\boxed{3}.", {"answer": "4", "letter": "C", "schema": schema}),
        ("q", "I pick (B).", {"answer": "x", "letter": "B", "schema": schema}),
        ("q", '```json\n{"name": "Ada", "age": 36}\n```', {"answer": "y", "letter": "A", "schema": schema}),
        ("q", '{"name": "Ada", "age": "old"}', {"letter": "A", "schema": schema}),  # no answer field
    ]
    run_id, ids = crafted_run(engine, {"verifiers": [
        {"kind": "math", "reference": "answer"},
        {"kind": "choice", "reference": "letter"},
        {"kind": "json_schema", "reference": "schema"},
        {"kind": "regex", "reference": "answer", "name": "answer_regex"},
    ]}, rows)
    recheck(engine, run_id)
    math = _verdicts(engine, run_id, "verify_math")
    assert [math[i].state for i in ids[:2]] == ["pass", "fail"]  # 1/2 == 0.5 symbolically; 3 != 4
    assert math[ids[4]].state == "error" and "no reference field 'answer'" in (math[ids[4]].verdict.reason or "")
    choice = _verdicts(engine, run_id, "verify_choice")
    assert choice[ids[2]].state == "pass" and choice[ids[2]].verdict.label == "B"
    assert choice[ids[3]].state == "fail"
    js = _verdicts(engine, run_id, "verify_json_schema")
    assert js[ids[3]].state == "pass" and js[ids[0]].state == "fail"
    assert js[ids[4]].state == "fail" and "age" in (js[ids[4]].verdict.reason or "")
    rx = _verdicts(engine, run_id, "answer_regex")
    assert rx[ids[2]].state == "fail" and rx[ids[0]].state == "fail"


def test_recompute_appends_history_and_recounts(engine) -> None:  # type: ignore[no-untyped-def]
    run_id, ids = crafted_run(engine, {"rule": [{"name": "long", "min_chars": 10}]},
                              [("q", "short", {}), ("q", "long enough answer", {})])
    recheck(engine, run_id)
    assert (stats(engine, run_id)["rule:long"]["n_fail"], stats(engine, run_id)["rule:long"]["n_total"]) == (1, 2)
    with engine.connect() as conn, store.write_begin(conn):  # the rule changes: every record is checked again
        cfg = orjson.loads(conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar())
        cfg["checks"]["rule"][0]["min_chars"] = 1
        conn.execute(text("UPDATE run SET config_json = :c WHERE id = :r"), {"c": orjson.dumps(cfg).decode(),
                                                                            "r": run_id})
    out = recheck(engine, run_id, all_records=True)
    assert out["records"] == 2
    st = stats(engine, run_id)["rule:long"]
    assert (st["n_fail"], st["n_total"]) == (0, 2)  # recounted from the verdicts in force, not added
    with engine.connect() as conn:
        n = conn.execute(text("SELECT COUNT(*) FROM check_verdict WHERE run_id = :r"), {"r": run_id}).scalar()
    assert n == 4  # the first verdicts are kept: history is appended


def test_the_check_catalogue_lists_user_checks(tmp_path, monkeypatch, live_app) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(user_package(tmp_path / "pkg")))
    from synthwatch.quality.user_checks import installed_entry_points

    assert installed_entry_points()["boxed"] == "swtest_checks:boxed"
    page = httpx.get(f"{live_app().url}/help/checks", timeout=HTTP_TIMEOUT_S).text  # the dashboard's catalogue
    assert 'id="check-verify_math"' in page and 'id="check-near_duplicate"' in page
    assert "<code>user:boxed</code> — <code>swtest_checks:boxed</code>" in page


def test_slow_checks_push_back_drain_on_shutdown_and_pending_stays_visible(engine, db_path, sim, tmp_path,  # type: ignore[no-untyped-def]
                                                                          monkeypatch, live_app) -> None:
    """A check slower than generation: the bounded queue makes the writer wait (counted), shutdown drains for its
    grace only, and the records left are pending on the run page, in the export's manifest and in
    `synthwatch checks`, until `synthwatch checks RUN --pending` checks them."""
    from conftest import cli_env, run_cli
    from workerkit import Background

    from synthwatch.quality.live import writer_hooks

    pkg = tmp_path / "slowpkg"
    pkg.mkdir()
    (pkg / "swtest_slow.py").write_text("import time\n\ndef slow(record):\n    time.sleep(0.05)\n    return True\n")
    monkeypatch.syspath_prepend(str(pkg))
    url = sim(reasoning_field="reasoning", seed=7)
    config = make_config(url, dataset(tmp_path, 300), concurrency=8, checks={
        "user": [{"name": "slow", "function": "swtest_slow:slow"}],
        "extended": {"queue_max": 10, "drain_grace_s": 0}})
    made: list[Any] = []

    def hooks(run_id: int) -> list[Any]:
        made.extend(writer_hooks(engine, run_id, config))
        return made

    bg = Background(engine, config, hooks=hooks).start()
    assert bg.join(120) == "completed"
    runner = made[1].runner
    assert runner.stats()["waits"] > 0 and runner.waited_s > 0  # the writer waited for room: backpressure
    with engine.connect() as conn:
        pending = vd.pending_count(conn, bg.run_id)
    assert 0 < pending < 300  # checked some, left the rest pending after a zero grace
    app = live_app()  # the run page and a pending record's page say so
    page = httpx.get(f"{app.url}/runs/{bg.run_id}/stats", timeout=HTTP_TIMEOUT_S).text
    assert f"{pending} records wait for their extended checks" in page
    with engine.connect() as conn:
        waiting = vd.pending_ids(conn, bg.run_id, limit=1)[0]
    rec_page = httpx.get(f"{app.url}/runs/{bg.run_id}/records/{waiting}", timeout=HTTP_TIMEOUT_S).text
    assert "<code>user:slow</code> pending check" in rec_page
    env = cli_env(PYTHONPATH=f"{pkg}")
    out = tmp_path / "out.jsonl"
    run_cli("export", "--db", str(db_path), str(bg.run_id), "--format", "messages", "--out", str(out),
            "--no-default-exclusions", env=env, check=True)
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert manifest["pending_checks"]["records"] == pending and manifest["pending_checks"]["checks"] == ["user:slow"]
    assert any("no verdict yet" in w for w in manifest["warnings"])
    shown = run_cli("checks", "--db", str(db_path), str(bg.run_id), env=env, check=True)
    assert f"{pending} records wait for their extended checks" in shown.stdout
    done = run_cli("checks", "--db", str(db_path), str(bg.run_id), "--pending", "--json", env=env, check=True,
                   timeout=300)
    body = json.loads(done.stdout)
    assert body["pending_checks"] == 0 and body["extended"]["records"] == pending
    row = next(c for c in body["checks"] if c["check_name"] == "user:slow")
    assert (row["n_fail"], row["n_total"]) == (0, 300)
    rec_page = httpx.get(f"{app.url}/runs/{bg.run_id}/records/{waiting}", timeout=HTTP_TIMEOUT_S).text
    assert "<code>user:slow</code> pass" in rec_page


def test_the_checks_page_and_api_treat_an_extended_check_like_a_built_in(engine, live_app) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.quality.detection.alarms import set_auto_pause

    run_id, ids = crafted_run(engine, {"rule": [{"name": "long", "min_chars": 10}]},
                              [("q", "short", {}), ("q", "long enough answer", {})] * 15)
    recheck(engine, run_id)
    c = httpx.Client(base_url=live_app().url, timeout=HTTP_TIMEOUT_S)
    body = c.get(f"/api/runs/{run_id}/checks").json()
    row = next(x for x in body["checks"] if x["check_name"] == "rule:long")
    assert (row["n_fail"], row["n_total"]) == (15, 30) and body["pending_checks"] == 0
    assert body["rules"]["rule:long"]["auto_pause"] is False
    assert body["descriptions"]["rule:long"] == "TOML rule: the content >= 10 characters"
    page = c.get(f"/runs/{run_id}/checks").text
    assert 'data-rule="rule:long"' in page and "15 / 30" in page
    # the page's form turns on its auto-pause and changes its threshold, as for a built-in rule
    form = {f"computed__{n}": "on" for n in ("empty_reasoning", "error", "timeout")}
    form |= {"auto_pause_shown__rule:long": "1", "auto_pause__rule:long": "on", "threshold__rule:long": "20%"}
    # a raised threshold weakens detection: refused without a reason (#35), saved with one
    assert c.post(f"/runs/{run_id}/checks/settings", data=form).status_code == 400
    form["reason"] = "short answers are fine below a fifth"
    assert c.post(f"/runs/{run_id}/checks/settings", data=form).status_code == 303
    rules = c.get(f"/api/runs/{run_id}/checks").json()["rules"]
    assert rules["rule:long"]["auto_pause"] is True and rules["rule:long"]["threshold"] == 0.2
    with engine.connect() as conn:  # the form kept the check itself
        assert vd.configured_checks(conn.execute(text("SELECT config_json FROM run WHERE id = :r"),
                                                 {"r": run_id}).scalar()) == ["rule:long"]
    # an auto-pause override names it like a built-in check; an unknown name is refused
    assert set_auto_pause(engine, run_id, "rule:long", False, reason="short answers are fine here")["changed"]
    with pytest.raises(ValueError, match="unknown check"):
        set_auto_pause(engine, run_id, "rule:nope", False, reason="no such check at all")


def test_turning_auto_pause_on_while_the_run_goes_pauses_it(engine, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A rule changed mid-run applies to the running worker's extended checks within seconds, like a built-in's."""
    from synthwatch.quality.recompute import save_settings

    url = sim(reasoning_field="reasoning", seed=8, ttft_ms=100)
    checks = {"rule": [{"name": "has_boxed", "regex": r"\\boxed\{"}]}
    config = make_config(url, dataset(tmp_path, 1000), concurrency=4, checks=checks)
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: any(a["rule"] == "rule:has_boxed" for a in alarms(engine, bg.run_id)), timeout_s=60,
                 what="the rule's (warning) alarm")
        assert run_row(engine, bg.run_id)["status"] == "running"  # its default rule does not pause
        save_settings(engine, bg.run_id, {**checks, "rules": pauses("rule:has_boxed")}, actor="test")
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "paused", timeout_s=60, what="auto-pause")
        assert next(a for a in alarms(engine, bg.run_id) if a["rule"] == "rule:has_boxed")["auto_paused"]
        assert run_row(engine, bg.run_id)["n_ok"] < 1000
    finally:
        store.apply_control(engine, bg.run_id, "stop")
        bg.join(60)


def test_verdicts_computed_elsewhere_feed_the_same_rates_and_alarms(engine) -> None:  # type: ignore[no-untyped-def]
    """ExtendedRunner.add_verdicts (a judge model's verdicts, computed with its own concurrency) is counted, windowed
    and alarmed like the check processes' verdicts."""
    from synthwatch.check_catalog import CheckSettings
    from synthwatch.quality.extended import ExtendedRunner

    checks = {"rule": [{"name": "long", "min_chars": 1}], "rules": {"rule:long": {"min_records": 3}}}
    run_id, ids = crafted_run(engine, checks, [("q", f"answer {i}", {}) for i in range(4)])
    runner = ExtendedRunner(engine, run_id, "crafted", CheckSettings.model_validate(checks)).start(backlog=False)
    try:
        runner.add_verdicts([vd.NewVerdict(run_id, i, "rule:long", vd.Verdict("fail", reason="judged elsewhere"))
                             for i in ids])
        wait_for(lambda: stats(engine, run_id).get("rule:long", {}).get("n_fail") == 4, timeout_s=30,
                 what="the added verdicts counted")
        wait_for(lambda: any(a["rule"] == "rule:long" for a in alarms(engine, run_id)), timeout_s=30,
                 what="the alarm")
    finally:
        runner.close(0)
    assert "judged elsewhere" in next(a for a in alarms(engine, run_id) if a["rule"] == "rule:long")["message"]
    assert _verdicts(engine, run_id, "rule:long")[ids[0]].verdict.reason == "judged elsewhere"
