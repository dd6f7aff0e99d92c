"""k samples per prompt (#30): each sample its own record and request with a distinct seed, resumed exactly.

Real simulator on a real port, a real SQLite file, the real `synthwatch run` process for the kill -9 test."""

from __future__ import annotations

import os
from collections import Counter

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S, cli_env, kill_9_repeatedly, popen_cli, run_cli, write_prompts
from sqlalchemy import text
from workerkit import make_config, records, run_row, run_to_end

from synthwatch.config import RunConfig
from synthwatch.store.db import open_engine


def _requests_seen(url: str) -> int:
    return int(httpx.get(url.removesuffix("/v1") + "/sim/stats", timeout=HTTP_TIMEOUT_S).json()["chat_requests"])


def test_each_sample_is_a_record_with_its_prompt_and_its_own_seed(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=4, reasoning_tokens="10-40", content_tokens="4-12")
    data = write_prompts(tmp_path / "p.jsonl", 6)
    config = make_config(url, data, samples_per_prompt=3)
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    recs = records(engine, run_id)
    run = run_row(engine, run_id)
    assert run["total"] == run["n_ok"] == 18
    assert [(r["prompt_idx"], r["sample_index"]) for r in recs] == [(p, s) for p in range(6) for s in range(3)]
    assert [r["idx"] for r in recs] == list(range(18))  # prompt * k + sample: unique per run
    for p in range(6):
        mine = [r for r in recs if r["prompt_idx"] == p]
        assert {r["source_id"] for r in mine} == {f"p{p}"}
        assert len({r["prompt_json"] for r in mine}) == 1
        # the simulator's text follows the request's seed: three seeds, three different answers
        assert len({(r["reasoning"], r["content"]) for r in mine}) == 3, p


def test_the_seed_is_the_base_seed_plus_the_sample_index() -> None:
    base = {"dataset": {"path": "x.jsonl"}, "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}], "model": "m"}
    one = RunConfig.model_validate(base)
    assert one.sample_seed(0) is None  # k = 1: the request is what it always was
    k4 = RunConfig.model_validate({**base, "samples_per_prompt": 4, "sampling": {"seed": 100}})
    assert [k4.sample_seed(s) for s in range(4)] == [100, 101, 102, 103]
    assert RunConfig.model_validate({**base, "samples_per_prompt": 2}).sample_seed(1) == 1


def test_a_cap_counts_samples_and_the_run_page_counts_prompts(engine, tmp_path, sim, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=5, reasoning_tokens="5-10", content_tokens="3-5")
    data = write_prompts(tmp_path / "p.jsonl", 10)
    config = make_config(url, data, samples_per_prompt=4, cap=6, concurrency=2)
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    ok = records(engine, run_id, "status = 'ok'")
    assert len(ok) == 6
    # a prompt's samples are claimed together (inserted side by side)
    assert [(r["prompt_idx"], r["sample_index"]) for r in ok] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        st = c.get(f"/api/runs/{run_id}/stats").json()
        # prompt 0 has all 4 samples, prompt 1 two of them: 1 complete, 2 started, of 10
        assert st["samples"] == {"k": 4, "prompts": 10, "complete": 1, "started": 2, "pass": None, "stale": None}
        page = c.get(f"/runs/{run_id}").text
        assert 'data-testid="prompts-complete">1</span> <small>/ 10 complete' in page
        assert "Prompts (4 samples each)" in page


def test_resume_with_another_k_is_refused(tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=2, reasoning_tokens="5-10", content_tokens="3-5")
    data = write_prompts(tmp_path / "p.jsonl", 3)
    db = str(tmp_path / "s.db")
    base = ["run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", db,
            "--name", "k", "--quiet"]
    first = run_cli(*base, "--samples-per-prompt", "2", check=True)
    assert "3 prompts" in first.stderr and "2 samples each: 6 records" in first.stderr
    again = run_cli(*base, "--samples-per-prompt", "3", "--new-config-version")
    assert again.returncode != 0
    assert "samples_per_prompt" in again.stderr and "new run" in again.stderr
    bad = run_cli(*base[:-3], "--name", "k0", "--samples-per-prompt", "0")
    assert bad.returncode == 2 and "samples_per_prompt in a TOML file" in bad.stderr


@pytest.mark.slow
def test_kill_9_during_k_sampling_then_resume_exact_counts(tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    """`synthwatch run --samples-per-prompt 4` SIGKILLed again and again, then run to the end: every (prompt, sample)
    is one ok record, none twice, none lost; a sample stored before a kill is never changed by a later process."""
    url = sim(seed=9, tokens_per_s=80, reasoning_tokens="10-30", content_tokens="5-10")
    n_prompts, k = 40, 4
    data = write_prompts(tmp_path / "p.jsonl", n_prompts)
    db = str(tmp_path / "kill.db")
    args = ["run", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner", "--db", db,
            "--name", "k-crashy", "--samples-per-prompt", str(k), "--concurrency", "6", "--quiet"]
    engine = open_engine(db)
    seen = [0]
    stored: dict[tuple[int, int], str] = {}
    partial = [0]  # kills that left a prompt with some samples done and some not

    def started() -> bool:
        return _requests_seen(url) > seen[0]

    def done_now() -> dict[tuple[int, int], str]:
        with engine.connect() as conn:
            return {(int(p), int(s)): c for p, s, c in conn.execute(text(
                "SELECT prompt_idx, sample_index, content FROM record WHERE status = 'ok'"))}

    def after_kill() -> None:
        seen[0] = _requests_seen(url)
        now = done_now()
        for key, content in stored.items():
            assert now[key] == content, key
        stored.update(now)
        per = Counter(p for p, _s in now)
        partial[0] += any(0 < n < k for n in per.values())

    kills = kill_9_repeatedly(args, rounds=6, wait_s=(0.3, 1.2), seed=int(os.environ.get("SW_KILL_SEED", "30")),
                              env=cli_env(), started=started, after_kill=after_kill)
    final = popen_cli(*args, env=cli_env())
    _out, err = final.communicate(timeout=180)
    assert final.returncode == 0, err
    assert kills >= 2 and partial[0] >= 1, (kills, partial)
    run = run_row(engine, "k-crashy")
    assert run["total"] == run["n_ok"] == n_prompts * k
    assert run["n_pending"] == run["n_in_flight"] == run["n_error"] == 0
    recs = records(engine, run["id"])
    keys = [(r["prompt_idx"], r["sample_index"]) for r in recs]
    assert sorted(keys) == [(p, s) for p in range(n_prompts) for s in range(k)]  # each once
    now = done_now()
    for key, content in stored.items():
        assert now[key] == content, key
    for r in recs:
        assert r["idx"] == r["prompt_idx"] * k + r["sample_index"]
        assert orjson.loads(r["prompt_json"])[-1]["content"]
    print(f"kills {kills}, stored before the last kill {len(stored)}, records {len(recs)}")


def test_the_start_form_sets_samples_per_prompt(live_app) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.app import launch
    from synthwatch.app.form_errors import FormErrors

    errors = FormErrors()
    data = launch.form_to_data({"dataset": "x.jsonl", "endpoints": "http://127.0.0.1:1/v1", "model": "m",
                                "samples_per_prompt": "4"}, errors)
    assert not errors.problems and data["samples_per_prompt"] == 4
    assert RunConfig.model_validate(data).samples_per_prompt == 4
    assert launch.config_to_form(RunConfig.model_validate(data).snapshot())["samples_per_prompt"] == "4"
    bad = FormErrors()
    launch.form_to_data({"samples_per_prompt": "four"}, bad)
    assert bad.has("samples_per_prompt")
    srv = live_app()
    page = httpx.get(srv.url + "/runs/new", timeout=HTTP_TIMEOUT_S).text
    assert 'name="samples_per_prompt"' in page and "Samples per prompt" in page


@pytest.mark.slow
def test_per_prompt_numbers_give_way_to_the_dashboards_query_limit(engine) -> None:  # type: ignore[no-untyped-def]
    """On a big run counting per prompt can exceed stats_time_limit_ms: the tile says so (and the run page keeps the
    rest), instead of the whole page going stale; the next poll within a minute does not ask again."""
    from dataclasses import dataclass

    from synthwatch.app import stats
    from synthwatch.quality import passk
    from synthwatch.store.queue import create_run, insert_prompts, write_begin

    @dataclass
    class P:
        index: int
        line: int
        source_id: str
        messages: list[dict[str, str]]

    cfg = RunConfig.model_validate({"dataset": {"path": "x"}, "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
                                    "model": "m", "samples_per_prompt": 4,
                                    "checks": {"verifiers": [{"kind": "exact"}]}})
    with engine.connect() as conn, write_begin(conn):
        rid = create_run(conn, "big", cfg)
        insert_prompts(conn, rid, (P(i, i + 1, f"p{i}", [{"role": "user", "content": "q"}]) for i in range(60_000)),
                       samples=4)
        conn.execute(text("UPDATE record SET status = 'ok' WHERE run_id = :r"), {"r": rid})
        conn.execute(text("INSERT INTO check_verdict (run_id, record_id, check_name, state, created_at) SELECT run_id,"
                          " id, 'verify_exact', 'pass', 0 FROM record WHERE run_id = :r"), {"r": rid})
    with engine.connect() as conn:
        run = dict(conn.execute(text("SELECT * FROM run WHERE id = :r"), {"r": rid}).mappings().one())
        with stats.time_limit(conn, 10):
            view = passk.samples_view(conn, run)
            assert conn.execute(text("SELECT COUNT(*) FROM run")).scalar() == 1  # the connection goes on
        assert view is not None and view["stale"] and view["prompts"] is None
        assert passk.samples_view(conn, run) is view  # not asked again at once
        passk.forget()  # the next poll afresh
        fresh = passk.samples_view(conn, run)  # without the limit: the numbers
    assert fresh is not None and fresh["complete"] == 60_000 and fresh["pass"]["pass_at_k"] == 1.0
