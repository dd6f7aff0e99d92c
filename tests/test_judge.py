"""Judge models (#30): the simulator as a deterministic judge, a real `synthwatch run` with [judge] on a 10% sample,
real SQLite, the dashboard over real HTTP: verdicts, flags, rates, alarm, agreement, the judge's cost apart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S, run_cli
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from workerkit import records, run_row

from synthwatch.config import JudgeConfig
from synthwatch.store.db import open_engine
from synthwatch.workers.judge import parse_reply, render, sampled

ANSWER = re.compile(r"\*\*(-?\d+)\*\*")


def correct(rec: dict[str, Any]) -> bool:
    q = orjson.loads(rec["prompt_json"])[-1]["content"]
    a, b = (int(x) for x in re.findall(r"\d+", q)[:2])
    m = ANSWER.findall(rec["content"] or "")
    return bool(m) and int(m[-1]) == a + b


def write_prompts(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            a, b = 3 + i % 97, 5 + (i * 7) % 89
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {a} + {b}?"}) + "\n")
    return path


def judge_toml(path: Path, gen_url: str, judge_url: str, data: Path, *, fraction: float) -> Path:
    path.write_text(f"""
name = "judged"
model = "sim-reasoner"
concurrency = 8
[dataset]
path = "{data}"
[[endpoints]]
base_url = "{gen_url}"
[judge]
model = "sim-judge"
sample_fraction = {fraction}
concurrency = 3
alarm_threshold = 0.05
alarm_min_records = 3
[judge.endpoint]
base_url = "{judge_url}"
price_in_per_mtok = 1.0
price_out_per_mtok = 2.0
""")
    return path


def test_a_judge_on_a_10_percent_sample_flags_rates_alarm_and_agreement(tmp_path, sim, live_app, db_path) -> None:  # type: ignore[no-untyped-def]
    gen = sim(seed=21, rate_wrong_answer=0.3, reasoning_tokens="8-20", content_tokens="8-12")
    judge = sim(judge=True, model="sim-judge")
    data = write_prompts(tmp_path / "p.jsonl", 200)
    cfg = judge_toml(tmp_path / "run.toml", gen, judge, data, fraction=0.1)
    res = run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet", check=True, timeout=300)
    assert "judge: sim-judge" in res.stderr and "10% of the ok records" in res.stderr
    engine = open_engine(str(db_path))
    run = run_row(engine, "judged")
    recs = {r["id"]: r for r in records(engine, run["id"]) if r["status"] == "ok"}
    assert len(recs) == 200
    in_sample = {i for i in recs if sampled(run["id"], i, 0.1)}
    assert 8 <= len(in_sample) <= 35  # about a tenth: a stable draw per record, not every record
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT record_id, state, score, label, reason FROM check_verdict WHERE run_id = :r"
                                 " AND check_name = 'judge' ORDER BY id"), {"r": run["id"]}).all()
        usage = conn.execute(text("SELECT * FROM judge_usage WHERE run_id = :r"), {"r": run["id"]}).mappings().one()
        stat = conn.execute(text("SELECT n_fail, n_total FROM check_stat WHERE run_id = :r AND check_name = 'judge'"),
                            {"r": run["id"]}).one()
        alarm = conn.execute(text("SELECT title, message FROM alarm WHERE run_id = :r AND rule = 'judge'"),
                             {"r": run["id"]}).first()
        run_tokens = conn.execute(text("SELECT COALESCE(SUM(completion_tokens), 0) FROM series WHERE run_id = :r"),
                                  {"r": run["id"]}).scalar()
        rec_tokens = conn.execute(text("SELECT COALESCE(SUM(completion_tokens), 0) FROM record WHERE run_id = :r"),
                                  {"r": run["id"]}).scalar()
    # every sampled record judged once, no other record judged; the verdict is the simulator's, from the answer
    assert sorted(r[0] for r in rows) == sorted(in_sample)
    bad = {r[0] for r in rows if r[1] == "fail"}
    assert bad == {i for i in in_sample if not correct(recs[i])} and bad, "the sample must hold a wrong answer"
    for rid, state, score, label, reason in rows:
        assert (state, label, score) == (("pass", "good", 0.9) if correct(recs[rid]) else ("fail", "bad", 0.1))
        assert reason
    # the judge's rates, its alarm, and its own cost (the run's token counts do not include it)
    assert tuple(stat) == (len(bad), len(in_sample))
    assert alarm is not None and alarm[0] == "The judge says bad"
    assert usage["n_pass"] + usage["n_fail"] == len(in_sample) and usage["n_error"] == 0
    assert usage["requests"] == len(in_sample) and usage["guided"] == "json_schema"
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert run_tokens == rec_tokens  # the run's own series: generation only
    shown = run_cli("checks", "judged", "--db", str(db_path), "--json", check=True)
    judge_row = next(r for r in json.loads(shown.stdout)["checks"] if r["check_name"] == "judge")
    assert (judge_row["n_fail"], judge_row["n_total"]) == (len(bad), len(in_sample))

    # people flag some judged records: two as the judge did, one against it
    srv = live_app()
    judged = sorted(in_sample)
    good_one = next(i for i in judged if i not in bad)
    bad_one = next(iter(sorted(bad)))
    against = next(i for i in judged if i not in (good_one, bad_one))
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        for rid, verdict in ((good_one, "good"), (bad_one, "bad"), (against, "good" if against in bad else "bad")):
            r = c.post(f"/api/runs/{run['id']}/records/{rid}/flag", json={"verdict": verdict})
            assert r.status_code == 200, r.text
        j = c.get(f"/api/runs/{run['id']}/judge").json()["judge"]
        assert (j["agreement"]["both"], j["agreement"]["agree"]) == (3, 2)
        assert j["agreement"]["person_good_judge_bad"] + j["agreement"]["person_bad_judge_good"] == 1
        assert j["cost"] == pytest.approx((usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0) / 1e6)
        page = c.get(f"/runs/{run['id']}/checks").text
        rates = {r["check_name"]: r for r in c.get(f"/api/runs/{run['id']}/checks").json()["checks"]}
        assert (rates["judge"]["n_fail"], rates["judge"]["n_total"]) == (len(bad), len(in_sample))
        assert f"agree on <strong>{j['agreement']['agree']} of {j['agreement']['both']}</strong>" in page
        viewer = c.get(f"/runs/{run['id']}/records/{bad_one}").text
        why = next(r[4] for r in rows if r[0] == bad_one)
        assert "judge: bad — " + why in viewer
        assert 'id="verdict">bad' in viewer  # the person's verdict, beside it
        plain = c.get(f"/runs/{run['id']}/records/{next(i for i in recs if i not in in_sample)}").text
        assert 'data-testid="judge-verdict"' not in plain


def test_synthwatch_judge_catches_up_a_finished_run(tmp_path, sim, db_path) -> None:  # type: ignore[no-untyped-def]
    gen = sim(seed=22, rate_wrong_answer=0.5, reasoning_tokens="5-10", content_tokens="8-12")
    judge = sim(judge=True, model="sim-judge")
    data = write_prompts(tmp_path / "p.jsonl", 12)
    run_cli("run", "--dataset", str(data), "--base-url", gen, "--model", "sim-reasoner", "--db", str(db_path),
            "--name", "later", "--quiet", check=True)
    cfg = judge_toml(tmp_path / "j.toml", gen, judge, data, fraction=1.0)
    res = run_cli("judge", "later", "--db", str(db_path), "--config", str(cfg), check=True)
    assert "12 verdicts" in res.stdout and "config version 2" in res.stderr
    again = run_cli("judge", "later", "--db", str(db_path), check=True)  # the stored settings; nothing left
    assert "0 verdicts" in again.stdout
    # a re-run replaces one record's output: its verdict is older than the answer now, so it is judged again (by the
    # run's own judge: the run has [judge] since `synthwatch judge --config` made it a config version)
    run_cli("rerun", "later", "--db", str(db_path), "--ids", "3", "--yes", check=True)
    rerun = run_cli("run", "--db", str(db_path), "--name", "later", "--quiet", check=True)
    assert "judge: 1 verdicts written by this process" in rerun.stderr
    third = run_cli("judge", "later", "--db", str(db_path), check=True)
    assert "0 verdicts" in third.stdout
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT record_id FROM check_verdict WHERE check_name = 'judge' AND record_id = 3"
                                 " ORDER BY id")).all()
    assert len(rows) == 2  # history kept: the earlier verdict stays, the new one is in force


CFG = JudgeConfig.model_validate({"endpoint": {"base_url": "http://127.0.0.1:1/v1"}, "model": "j", "min_score": 0.5})


@pytest.mark.parametrize(("reply", "state"), [
    ('{"score": 0.9, "label": "good", "reason": "fine"}', "pass"),
    ('```json\n{"score": 0.8, "label": "GOOD", "reason": "fenced"}\n```', "pass"),
    ('{"score": 0.4, "label": "good", "reason": "below min_score"}', "fail"),
    ('{"score": 0.9, "label": "bad", "reason": "bad label"}', "fail"),
])
def test_a_verdict_is_validated(reply: str, state: str) -> None:
    assert parse_reply(reply, CFG).state == state


@pytest.mark.parametrize("reply", ["", "sure, it is good", "[1, 2]", '{"score": 2, "label": "good"}',
                                   '{"score": 0.5}', '{"score": "high", "label": "good", "reason": ""}',
                                   '{"score": 0.5, "label": "' + "x" * 100 + '", "reason": ""}'])
def test_a_reply_that_is_not_a_verdict_is_refused(reply: str) -> None:
    with pytest.raises(ValueError, match="judge's reply"):
        parse_reply(reply, CFG)


@given(st.text(max_size=300))
def test_any_reply_is_a_verdict_or_a_value_error(reply: str) -> None:
    try:
        v = parse_reply(reply, CFG)
    except ValueError:
        return
    assert v.state in ("pass", "fail") and 0 <= (v.score or 0) <= 1


def test_the_template_takes_only_its_placeholders() -> None:
    rec = {"prompt_json": orjson.dumps([{"role": "user", "content": "Q?"}]).decode(), "reasoning": "R",
           "content": "A", "row_json": '{"reference": "42"}'}
    out = render('{"x": 1} {prompt} | {reasoning} | {answer} | {reference} | {other}', rec)
    assert out == '{"x": 1} user: Q? | R | A | 42 | {other}'


def test_a_server_without_guided_decoding_is_asked_in_words(tmp_path, sim, db_path) -> None:  # type: ignore[no-untyped-def]
    """guided = auto: the first refusal (HTTP 400 naming response_format) turns the schema off for the rest of the
    run; the replies are validated the same way."""
    gen = sim(seed=23, reasoning_tokens="5-10", content_tokens="8-12")
    judge = sim(judge=True, model="sim-judge", refuse_response_format=True)
    data = write_prompts(tmp_path / "p.jsonl", 6)
    run_cli("run", "--dataset", str(data), "--base-url", gen, "--model", "sim-reasoner", "--db", str(db_path),
            "--name", "words", "--quiet", check=True)
    cfg = judge_toml(tmp_path / "j.toml", gen, judge, data, fraction=1.0)
    res = run_cli("judge", "words", "--db", str(db_path), "--config", str(cfg), check=True)
    assert "6 verdicts" in res.stdout and "6 good, 0 bad, 0 errors" in res.stdout
    engine = open_engine(str(db_path))
    with engine.connect() as conn:
        u = conn.execute(text("SELECT requests, failed_attempts, guided FROM judge_usage")).one()
    # the requests in flight when the first refusal came (at most the judge's concurrency, 3) were refused too
    assert 1 <= u[1] <= 3 and u[0] == 6 + u[1] and u[2] == "prompt"
    strict = tmp_path / "strict.toml"
    strict.write_text(cfg.read_text().replace("concurrency = 3", "concurrency = 3\nguided = \"json_schema\""))
    res = run_cli("judge", "words", "--db", str(db_path), "--config", str(strict), check=True)
    assert "0 verdicts" in res.stdout  # all judged already: nothing is asked again


def test_the_judges_alarm_auto_pauses_the_run(tmp_path, sim, db_path) -> None:  # type: ignore[no-untyped-def]
    gen = sim(seed=24, rate_wrong_answer=0.5, tokens_per_s=60, reasoning_tokens="10-20", content_tokens="8-12")
    judge = sim(judge=True, model="sim-judge")
    data = write_prompts(tmp_path / "p.jsonl", 80)
    cfg = judge_toml(tmp_path / "run.toml", gen, judge, data, fraction=1.0)
    cfg.write_text(cfg.read_text().replace("alarm_min_records = 3", "alarm_min_records = 3\nauto_pause = true")
                   .replace("concurrency = 8", "concurrency = 2"))
    res = run_cli("run", "--config", str(cfg), "--db", str(db_path), "--quiet", "--exit-on-pause", timeout=300)
    assert res.returncode == 4, res.stderr  # paused, the worker exited (--exit-on-pause)
    engine = open_engine(str(db_path))
    run = run_row(engine, "judged")
    assert run["status"] == "paused" and run["n_pending"] > 0
    with engine.connect() as conn:
        alarm = conn.execute(text("SELECT auto_paused, active FROM alarm WHERE run_id = :r AND rule = 'judge'"),
                             {"r": run["id"]}).one()
        event = conn.execute(text("SELECT detail FROM control_event WHERE run_id = :r AND action = 'pause'"
                                  " AND actor = 'alarm'"), {"r": run["id"]}).scalar()
    assert tuple(alarm) == (True, True) and event.startswith("judge: The judge says bad")
