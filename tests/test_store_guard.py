"""One way into the store (#34): the attacks of the issue replayed against a real worker, a real judge server, a real
SQLite file and a real PostgreSQL server. Each failed before store/rows.py:

- one NUL in a judge's reply on PostgreSQL stopped the judge for the whole run (0 verdicts, exit 0);
- a NUL or a lone surrogate in a user check's reason lost the whole verdict batch, and those records stayed pending;
- a verdict's label was never redacted: a judge echoing the API key showed it on the record page;
- a key echoed base64- or hex-encoded in an error body was stored whole;
- an answer of 150,000 distinct numbers (1 MB) was refused by PostgreSQL's full-text index (store_refused).
"""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S, cli_env, run_cli
from hostileserver import HostileServer, head
from sqlalchemy import text
from test_checks_kit import run_checked
from workerkit import make_config

from synthwatch.quality import verdicts as vd
from synthwatch.store.db import open_engine

pytestmark = pytest.mark.slow

JUDGE_KEY = "sk-judge-abcdefghijklmnop0123"  # lower case: the judge's label is stored lower-cased


def prompts(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {i + 1}?"}) + "\n")
    return path


def judge_reply(verdict: dict[str, Any]):  # type: ignore[no-untyped-def]
    """A judge server's reply: a chat completion whose content is ``verdict`` as JSON (NUL written as \\u0000)."""
    content = json.dumps(verdict)
    body = json.dumps({"id": "j1", "object": "chat.completion", "created": 1, "model": "sim-judge",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}).encode()

    async def reply(r: Any, w: Any) -> bool:
        w.write(head(ctype="application/json", length=len(body)) + body)
        await w.drain()
        return True

    return reply


def judged_run(tmp_path: Path, db: str, sim_url: str, judge_url: str, n: int) -> tuple[Any, int]:
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
name = "judged"
model = "sim-reasoner"
concurrency = 4
[dataset]
path = "{prompts(tmp_path / 'p.jsonl', n)}"
[[endpoints]]
base_url = "{sim_url}"
[judge]
model = "sim-judge"
sample_fraction = 1.0
concurrency = 2
guided = "none"
max_attempts = 1
prompt_template = "HOSTILE judge this: {{answer}}"
[judge.endpoint]
base_url = "{judge_url}"
api_key_env = "SWTEST_JUDGE_KEY"
""")
    res = run_cli("run", "--config", str(cfg), "--db", db, "--quiet", timeout=300,
                  env=cli_env(SWTEST_JUDGE_KEY=JUDGE_KEY))
    assert res.returncode == 0, res.stdout + res.stderr
    assert JUDGE_KEY not in res.stdout + res.stderr
    engine = open_engine(db)
    with engine.connect() as conn:
        run_id = conn.execute(text("SELECT id FROM run WHERE name = 'judged'")).scalar_one()
    return engine, int(run_id)


def judge_rows(engine: Any, run_id: int) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT record_id, state, label, reason FROM check_verdict WHERE run_id = :r AND"
                                 " check_name = 'judge' ORDER BY id"), {"r": run_id}).all()


def test_a_nul_in_a_judge_reply_costs_no_verdict_and_does_not_stop_the_judge(any_db, sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL this run used to write 0 verdicts and exit 0: the judge's thread died on the first batch."""
    reply = judge_reply({"score": 0.2, "label": "bad\u0000one", "reason": "the answer\u0000 is wrong"})
    with HostileServer(reply, models=("sim-judge",)) as judge:
        engine, run_id = judged_run(tmp_path, any_db, sim(seed=3), judge.url, 12)
    rows = judge_rows(engine, run_id)
    assert len(rows) == 12 and {r.state for r in rows} == {"pass"}, rows
    for r in rows:
        assert r.label == "bad\u2400one" and r.reason == "the answer\u2400 is wrong"
    engine.dispose()


def test_a_judge_echoing_the_key_shows_it_nowhere(any_db, sim, tmp_path, live_app) -> None:  # type: ignore[no-untyped-def]
    """The label is redacted like the reason; so are the key's base64 and hex forms."""
    b64 = base64.b64encode(b"Authorization: Bearer " + JUDGE_KEY.encode()).decode()
    reply = judge_reply({"score": 0.9, "label": JUDGE_KEY,
                         "reason": f"your header was {b64}; hex {JUDGE_KEY.encode().hex().upper()}"})
    with HostileServer(reply, models=("sim-judge",)) as judge:
        engine, run_id = judged_run(tmp_path, any_db, sim(seed=4), judge.url, 6)
    rows = judge_rows(engine, run_id)
    assert len(rows) == 6
    for r in rows:
        assert r.label == "[redacted]", r
        assert JUDGE_KEY not in r.reason and b64 not in r.reason and JUDGE_KEY.encode().hex().upper() not in r.reason
        assert "[redacted]" in r.reason
    if any_db.endswith(".db"):  # the record page, over real HTTP
        srv = live_app()
        page = httpx.get(f"{srv.url}/runs/{run_id}/records/{rows[0].record_id}", timeout=HTTP_TIMEOUT_S).text
        assert "judge" in page and JUDGE_KEY not in page and b64 not in page
    engine.dispose()


def nasty_checks(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "swtest_nasty.py").write_text(textwrap.dedent('''
        def nasty(record, row):
            kind = record.idx % 3
            if kind == 0:
                return {"passed": False, "label": "nul\\x00label", "reason": "a NUL\\x00 here"}
            if kind == 1:
                return {"passed": False, "label": "lone\\ud800", "reason": "a lone surrogate \\udc80 here"}
            return {"passed": True, "reason": "fine"}
    '''))
    return root


def test_a_nul_or_lone_surrogate_in_a_user_checks_reason_loses_no_verdict(any_engine, sim, tmp_path,  # type: ignore[no-untyped-def]
                                                                        monkeypatch) -> None:
    """The whole verdict batch used to be lost, and its records stayed pending on every retry."""
    monkeypatch.syspath_prepend(str(nasty_checks(tmp_path / "pkg")))
    config = make_config(sim(seed=8), prompts(tmp_path / "p.jsonl", 15), concurrency=4,
                         checks={"user": [{"name": "nasty", "function": "swtest_nasty:nasty", "timeout_s": 5}]})
    run_id, status = run_checked(any_engine, config, timeout_s=120)
    assert status == "completed"
    with any_engine.connect() as conn:
        got = vd.latest(conn, run_id, "user:nasty")
        assert vd.pending_count(conn, run_id) == 0
        idx = dict(conn.execute(text("SELECT id, idx FROM record WHERE run_id = :r"), {"r": run_id}).all())
    assert len(got) == 15
    for rid, per in got.items():
        v = per["user:nasty"].verdict
        kind = idx[rid] % 3
        if kind == 0:
            assert (v.state, v.label, v.reason) == ("fail", "nul\u2400label", "a NUL\u2400 here")
        elif kind == 1:
            assert (v.state, v.label, v.reason) == ("fail", "lone\ufffd", "a lone surrogate \ufffd here")
        else:
            assert v.state == "pass"


def test_a_key_echoed_base64_or_hex_in_an_error_body_is_not_stored(any_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = "sk-live-0123456789abcdefXYZ"
    echoed = [base64.b64encode(b"x" * k + key.encode() + b"!").decode() for k in range(3)]
    echoed += [base64.urlsafe_b64encode(b"key=" + key.encode()).decode().rstrip("="), key.encode().hex(),
               key.encode().hex().upper()]
    body = json.dumps({"error": {"message": "bad request, you sent: " + " ".join(echoed)}}).encode()

    async def reply(r: Any, w: Any) -> bool:
        w.write(head("400 Bad Request", "application/json", length=len(body)) + body)
        await w.drain()
        return True

    cfg = tmp_path / "run.toml"
    with HostileServer(reply) as srv:
        cfg.write_text(f"""
name = "echo"
model = "sim-reasoner"
concurrency = 2
[dataset]
path = "{tmp_path / 'p.jsonl'}"
[[endpoints]]
base_url = "{srv.url}"
api_key_env = "SWTEST_KEY"
""")
        (tmp_path / "p.jsonl").write_text(json.dumps({"id": "h", "prompt": "HOSTILE"}) + "\n")
        res = run_cli("run", "--config", str(cfg), "--db", any_db, "--quiet", timeout=120,
                      env=cli_env(SWTEST_KEY=key))
    assert srv.hostile_seen.is_set(), res.stderr
    engine = open_engine(any_db)
    with engine.connect() as conn:
        stored = [str(v) for row in conn.execute(text(
            "SELECT error FROM record UNION ALL SELECT message FROM error_event")).all() for v in row if v]
    engine.dispose()
    assert stored and any("[redacted]" in s for s in stored), stored
    for s in stored + [res.stdout, res.stderr]:
        for form in [key, *echoed]:
            assert form not in s


def test_an_answer_of_150000_distinct_numbers_is_stored_and_searchable(any_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL's tsvector holds 1 MiB: the whole answer's index entry was refused, the record store_refused."""
    answer = " ".join(str(1_000_000 + i) for i in range(150_000))
    body = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "sim-reasoner",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 150000}}).encode()

    async def reply(r: Any, w: Any) -> bool:
        w.write(head(ctype="application/json", length=len(body)) + body)
        await w.drain()
        return True

    cfg = tmp_path / "run.toml"
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "h", "prompt": "HOSTILE"}) + "\n")
    with HostileServer(reply) as srv:
        cfg.write_text(f"""
name = "big"
model = "sim-reasoner"
stream = false
[dataset]
path = "{tmp_path / 'p.jsonl'}"
[[endpoints]]
base_url = "{srv.url}"
""")
        res = run_cli("run", "--config", str(cfg), "--db", any_db, "--quiet", timeout=300)
    assert res.returncode == 0, res.stderr
    engine = open_engine(any_db)
    with engine.connect() as conn:
        status, kind, content = conn.execute(text("SELECT status, error_kind, content FROM record")).one()
        assert (status, kind) == ("ok", None)
        assert content == answer
        if engine.dialect.name == "postgresql":  # searchable through the index's own expression (a bounded prefix)
            from synthwatch.review.filters import PG_TSVECTOR

            def found(word: str) -> int:
                return len(conn.execute(text(f"SELECT id FROM record WHERE {PG_TSVECTOR} @@"
                                             " plainto_tsquery('simple'::regconfig, :w)"), {"w": word}).all())

            assert found("1000005") == 1
            assert found("1149999") == 0  # past the indexed prefix (docs/limits.md)
    engine.dispose()
