"""Export by any check and by an expression (#38), on records whose verdicts the real checks computed.

A finished run of k = 3 samples for 4 prompts, stored as a worker stores them; its verdicts come from the product's
own extended checks (the recompute path: the math verifier, lingua's language check, MinHash near-duplicates and a
user check in its own process). Then the real `synthwatch export` process: `--exclude-check` with any catalogue
name, `--where`, a repeated `--select-check`, `--select best --require-pass`, and the manifest's per-prompt counts."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S, run_cli
from sqlalchemy import text

from synthwatch.config import RunConfig
from synthwatch.quality import verdicts as vd
from synthwatch.quality.extended import recheck
from synthwatch.store import queue as store

pytestmark = pytest.mark.slow  # the checks run in spawned check processes

# distinct English sentences (no two near-duplicates of each other), one per record that needs English
EN = [
    "Adding both numbers step by step, starting from the larger one and counting upward, the total comes out as",
    "My careful arithmetic, done twice with pencil and paper to avoid any silly slip, settles on the value",
    "Grouping tens and units separately and then combining those partial sums yields a final result of",
    "Checking with a quick mental estimate first and precise column addition afterwards, I arrive at",
    "Whoever lines these quantities up vertically and carries correctly will certainly obtain exactly",
    "Breaking the problem into smaller friendly pieces makes everything simple; combining them produces",
    "Numbers like these are easy when rounded first, then adjusted back, which leaves us holding",
]
DE = [
    "Wenn man beide Zahlen sorgfältig addiert und das Ergebnis noch einmal überprüft, erhält man genau",
    "Zuerst runde ich grob, danach rechne ich schriftlich nach; am Ende steht als Summe eindeutig",
    "Die Zehner und die Einer werden getrennt zusammengezählt, woraus sich schließlich ergibt:",
]
Q = [(3, 5), (4, 11), (9, 20), (7, 7)]  # prompt p asks a + b


def answer(p: int) -> int:
    return sum(Q[p])


# (prompt, sample) -> content; what each should get, by construction:
#   math: the boxed (or last) number against the reference; language: en expected; near_duplicate: (1, 0)
#   repeats (0, 0)'s words; user:boxed: \boxed{} present
CONTENT = {
    (0, 0): f"{EN[0]} \\boxed{{{answer(0)}}}.",           # passes everything
    (0, 1): f"{EN[1]} \\boxed{{{answer(0) + 1}}}.",       # wrong answer
    (0, 2): f"{DE[0]} \\boxed{{{answer(0)}}}.",              # right answer, German
    (1, 0): f"{EN[0]} \\boxed{{{answer(1)}}}.",           # near-duplicate of (0, 0)
    (1, 1): f"{EN[2]} \\boxed{{{answer(1)}}}.",           # passes everything
    (1, 2): f"{EN[3]} {answer(1)}.",                      # right, but not boxed (user:boxed fails)
    (2, 0): f"{EN[4]} \\boxed{{{answer(2) + 2}}}.",       # wrong
    (2, 1): f"{DE[1]} \\boxed{{{answer(2) + 5}}}.",          # German, and wrong
    (2, 2): f"{EN[5]} \\boxed{{{answer(2) - 1}}}.",       # wrong
    (3, 0): f"{EN[6]} \\boxed{{{answer(3) + 3}}}.",       # wrong
    (3, 1): f"{DE[2]} \\boxed{{{answer(3)}}}.",              # German
    (3, 2): f"{EN[1].replace('pencil', 'a pen')} and finally \\boxed{{{answer(3)}}}.",  # language pending (below)
}
WANT = {  # the verdicts the real checks must give (asserted, so the export tests read known data)
    "verify_math": {k: "fail" if k in {(0, 1), (2, 0), (2, 1), (2, 2), (3, 0)} else "pass" for k in CONTENT},
    "language": {k: "fail" if k in {(0, 2), (2, 1), (3, 1)} else "pending" if k == (3, 2) else "pass"
                 for k in CONTENT},
    "near_duplicate": {k: "fail" if k == (1, 0) else "pass" for k in CONTENT if k != (3, 2)},
    "user:boxed": {k: "fail" if k == (1, 2) else "pass" for k in CONTENT},
}


def user_module(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "swtest_where.py").write_text(textwrap.dedent('''
        def boxed(record):
            return ("\\\\boxed{" in record.content, "the answer has no \\\\boxed{}")
    '''))
    return root


@pytest.fixture
def k3_run(engine, tmp_path, monkeypatch) -> tuple[int, dict[tuple[int, int], int]]:  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(user_module(tmp_path / "pkg")))  # the check processes inherit sys.path
    cfg = RunConfig.model_validate({
        "name": "k3", "dataset": {"path": "x.jsonl"}, "model": "m", "samples_per_prompt": 3,
        "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
        "checks": {"verifiers": [{"kind": "math", "reference": "answer"}],
                   "language": {"enabled": True, "expect": "en", "languages": ["en", "de", "fr"]},
                   "near_duplicate": {"enabled": True, "threshold": 0.5, "min_chars": 20},
                   "user": [{"name": "boxed", "function": "swtest_where:boxed"}]}})
    ids: dict[tuple[int, int], int] = {}
    with engine.connect() as conn, store.write_begin(conn):
        run_id = store.create_run(conn, "k3", cfg)
        for (p, s), content in CONTENT.items():
            a, b = Q[p]
            ids[(p, s)] = conn.execute(text(
                "INSERT INTO record (run_id, idx, prompt_idx, sample_index, source_id, rnd, prompt_json, status,"
                " content_null, attempts, check_flags, reasoning, content, finish_reason, finished_at, row_json)"
                " VALUES (:r, :i, :p, :s, :sid, 0.5, :q, 'ok', false, 1, 0, 'I add them.', :c, 'stop', :t, :row)"
                " RETURNING id"),
                {"r": run_id, "i": p * 3 + s, "p": p, "s": s, "sid": f"p{p}", "c": content, "t": 1000.0 + p * 3 + s,
                 "q": orjson.dumps([{"role": "user", "content": f"What is {a} + {b}?"}]).decode(),
                 "row": orjson.dumps({"answer": str(a + b)}).decode()}).scalar_one()
        conn.execute(text("UPDATE run SET status = 'completed', total = 12, n_ok = 12 WHERE id = :r"), {"r": run_id})
    # (3, 2) is written after the others were checked: its checks have not answered yet
    late = ids.pop((3, 2))
    with engine.begin() as conn:
        conn.execute(text("UPDATE record SET status = 'pending' WHERE id = :i"), {"i": late})
    recheck(engine, run_id)
    with engine.begin() as conn:
        conn.execute(text("UPDATE record SET status = 'ok' WHERE id = :i"), {"i": late})
        vd.append(conn, [vd.NewVerdict(run_id, late, "verify_math", vd.Verdict("pass")),
                         vd.NewVerdict(run_id, late, "user:boxed", vd.Verdict("pass")),
                         vd.NewVerdict(run_id, late, "language", vd.Verdict("pending"))])
    ids[(3, 2)] = late
    with engine.connect() as conn:
        got = vd.latest(conn, run_id)
    by_id = {rid: key for key, rid in ids.items()}
    for check, want in WANT.items():
        have = {by_id[rid]: v[check].state for rid, v in got.items() if check in v}
        assert have == want, (check, have)
    return run_id, ids


def export(db_path: Path, out: Path, *flags: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    proc = run_cli("export", "k3", "--db", str(db_path), "--format", "messages", "--out", str(out), "--quiet",
                   "--allow-open-alarms", *flags, check=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, json.loads(Path(str(out) + ".manifest.json").read_text()), proc.stdout


def row_id(p: int, s: int) -> str:
    return f"p{p}" + (f"#s{s}" if s else "")


def test_exclude_by_language_and_by_a_user_check(db_path, tmp_path, k3_run) -> None:  # type: ignore[no-untyped-def]
    rows, m, _ = export(db_path, tmp_path / "x.jsonl", "--exclude-check", "language", "--exclude-check", "user:boxed")
    german, unboxed = {(0, 2), (2, 1), (3, 1)}, {(1, 2)}
    assert sorted(r["id"] for r in rows) == sorted(row_id(*k) for k in CONTENT if k not in german | unboxed)
    assert m["counts"]["excluded"] == {"check:language": 3, "check:user:boxed": 1}
    applied = {c["name"]: c for c in m["selection"]["checks_applied"]}
    assert "verdict" in applied["language"] and "verdict" in applied["user:boxed"]
    assert m["selection"]["exclude_checks"] == ["empty_reasoning", "truncated", "language", "user:boxed"] or \
        m["selection"]["exclude_checks"] == ["language", "user:boxed"]
    # an unknown name: exit 2, one line, did you mean
    bad = run_cli("export", "k3", "--db", str(db_path), "--format", "messages", "--out", str(tmp_path / "y.jsonl"),
                  "--exclude-check", "langauge")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "unknown check 'langauge' (--exclude-check); did you mean 'language'?" in bad.stderr
    assert not (tmp_path / "y.jsonl").exists()


def test_a_combined_where_and_its_prompt_counts(db_path, tmp_path, k3_run) -> None:  # type: ignore[no-untyped-def]
    expr = "verify:math=pass and language=pass and not near_duplicate"
    rows, m, out = export(db_path, tmp_path / "w.jsonl", "--where", expr)
    want = [k for k in CONTENT if WANT["verify_math"][k] == "pass" and WANT["language"][k] == "pass"
            and WANT["near_duplicate"].get(k) != "fail"]
    assert sorted(want) == [(0, 0), (1, 1), (1, 2)]
    assert sorted(r["id"] for r in rows) == sorted(row_id(*k) for k in want)
    sel = m["selection"]
    assert sel["expression"] == "verify_math=pass and language=pass and not near_duplicate=fail"
    assert m["counts"]["excluded"] == {"where": 9}
    prompts = sel["prompts"]
    # p0 and p1 have a selected sample; p2 none and nothing waiting; p3 none, and (3, 2) still waits for language
    assert (prompts["prompts"], prompts["selected"], prompts["no_pass"], prompts["pending"]) == (4, 2, 1, 1)
    assert prompts["no_pass_prompts"] == ["p2"] and prompts["pending_prompts"] == ["p3"]
    assert "prompts: 2 selected, 1 with no pass, 1 pending, of 4" in out
    # a bad expression: exit 2, the column, did you mean
    bad = run_cli("export", "k3", "--db", str(db_path), "--format", "messages", "--out", str(tmp_path / "z.jsonl"),
                  "--where", "verify:math=pass and langauge=pass")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "--where: unknown check 'langauge' at column 22; did you mean 'language'?" in bad.stderr


def test_a_repeated_select_check_needs_every_check_to_pass(db_path, tmp_path, k3_run) -> None:  # type: ignore[no-untyped-def]
    rows, m, _ = export(db_path, tmp_path / "s.jsonl", "--select", "passing", "--select-check", "verify:math",
                        "--select-check", "language")
    both = [k for k in CONTENT if WANT["verify_math"][k] == "pass" and WANT["language"][k] == "pass"]
    assert sorted(r["id"] for r in rows) == sorted(row_id(*k) for k in both)
    # the wrong answers in English (only the last --select-check) and the German right answers (only the first)
    # are out
    assert not {row_id(*k) for k in ((0, 1), (0, 2), (2, 0), (2, 1))} & {r["id"] for r in rows}
    per = m["selection"]["per_prompt"]
    assert per["checks"] == ["verify_math", "language"] and per["records_lacking_verdict"] == 1  # (3, 2)
    assert m["counts"]["excluded"]["no_verdict"] == 1


def test_select_best_says_whether_the_best_passed_and_require_pass_leaves_them_out(  # type: ignore[no-untyped-def]
        db_path, tmp_path, k3_run) -> None:
    rows, m, out = export(db_path, tmp_path / "b.jsonl", "--select", "best", "--select-check", "verify:math")
    best = m["selection"]["per_prompt"]["best"]
    # p2's three samples are all wrong: its best did not pass, and is exported all the same (no --require-pass)
    assert len(rows) == 4 and row_id(2, 0) in {r["id"] for r in rows}
    assert (best["prompts_best_passed"], best["prompts_best_failed"], best["failed_prompts"]) == (3, 1, ["p2"])
    assert "best sample per prompt: passed in 3, did not pass in 1" in out
    rows, m, _ = export(db_path, tmp_path / "r.jsonl", "--select", "best", "--select-check", "verify:math",
                        "--require-pass")
    best = m["selection"]["per_prompt"]["best"]
    assert sorted(r["id"] for r in rows) == [row_id(0, 0), row_id(1, 0), row_id(3, 1)]
    assert best["require_pass"] and best["prompts_left_out"] == 1 and m["counts"]["excluded"]["no_pass"] == 1
    prompts = m["selection"]["prompts"]
    assert (prompts["selected"], prompts["no_pass"], prompts["pending"]) == (3, 1, 0)
    # best by two checks: among the samples passing the second, the first's verdict decides
    rows, m, _ = export(db_path, tmp_path / "b2.jsonl", "--select", "best", "--select-check", "verify:math",
                        "--select-check", "language", "--require-pass")
    assert sorted(r["id"] for r in rows) == [row_id(0, 0), row_id(1, 0)]
    bad = run_cli("export", "k3", "--db", str(db_path), "--format", "messages", "--out", str(tmp_path / "q.jsonl"),
                  "--select", "passing", "--require-pass")
    assert bad.returncode == 2 and "--require-pass goes with --select best" in bad.stderr


def test_the_export_api_takes_the_same_options(engine, k3_run, live_app) -> None:  # type: ignore[no-untyped-def]
    from workerkit import wait_for

    run_id, _ids = k3_run
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        bad = c.post(f"/api/runs/{run_id}/exports", json={"format": "messages", "where": "langauge=pass"})
        assert bad.status_code == 400 and "did you mean 'language'?" in bad.json()["detail"], bad.text
        bad = c.post(f"/api/runs/{run_id}/exports", json={"format": "messages", "exclude_checks": ["user:boxd"]})
        assert bad.status_code == 400 and "did you mean 'user:boxed'?" in bad.json()["detail"], bad.text
        r = c.post(f"/api/runs/{run_id}/exports", json={
            "format": "messages", "where": "verify:math=pass and language=pass and not near_duplicate",
            "allow_open_alarms": True})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        job = wait_for(lambda: (j := c.get(f"/api/runs/{run_id}/exports/{job_id}").json())["status"] != "running"
                       and j, timeout_s=60, what="the export to finish")
        assert job["status"] == "done", job
        assert job["manifest"]["counts"]["exported"] == 3
        assert job["manifest"]["selection"]["prompts"]["pending"] == 1
        r = c.post(f"/api/runs/{run_id}/exports", json={
            "format": "messages", "select": "passing", "select_checks": ["verify:math", "language"],
            "allow_open_alarms": True})
        assert r.status_code == 202, r.text
        page = c.get(f"/runs/{run_id}/export").text
        assert 'data-testid="export-where"' in page and 'value="user:boxed"' in page


# ------------------------------------------------------------------ the same names in rerun and rederive


def test_rerun_takes_any_check_and_rederive_refuses_the_ones_it_cannot_recompute(  # type: ignore[no-untyped-def]
        engine, db_path, k3_run) -> None:
    run_id, ids = k3_run

    def repair(*args: str) -> Any:
        return run_cli(*args, "--db", str(db_path))

    dry = repair("rerun", "k3", "--check", "user:boxed", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["selected"] == 1 and "records failing user:boxed" in dry.stdout
    dry = repair("rerun", "k3", "--check", "verify:math", "--dry-run", "--json")
    assert json.loads(dry.stdout)["selected"] == sum(v == "fail" for v in WANT["verify_math"].values()) == 5
    done = repair("rerun", "k3", "--check", "user:boxed", "--yes", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["queued"] == 1, done.stdout + done.stderr
    with engine.connect() as conn:
        status = dict(conn.execute(text("SELECT id, status FROM record WHERE run_id = :r"), {"r": run_id}).all())
    assert status[ids[(1, 2)]] == "pending" and sum(s == "pending" for s in status.values()) == 1
    # a re-derive does not recompute a user check's verdict: refused, saying what to do instead (a command that works)
    no = repair("rederive", "k3", "--check", "verify:math", "--dry-run")
    assert no.returncode == 2 and "a re-derive cannot choose records by verify_math" in no.stderr, no.stderr
    assert f"synthwatch rerun k3 --check verify_math --db {db_path}" in no.stderr
    assert repair("rederive", "k3", "--check", "truncated", "--dry-run").returncode == 0  # a built-in one: as before
    bad = repair("rerun", "k3", "--check", "usr:boxed", "--dry-run")
    assert bad.returncode == 2 and "unknown check 'usr:boxed' (--check); did you mean 'user:boxed'?" in bad.stderr
    # turning a check's auto-pause off names it the same way
    off = repair("autopause", "k3", "verify:math", "off", "--reason", "rejection sampling fails a third")
    assert off.returncode == 0 and "auto-pause for verify_math is off" in off.stdout, off.stderr
    bad = repair("autopause", "k3", "user:boxd", "off", "--reason", "a typo in the name")
    assert bad.returncode == 2 and "did you mean 'user:boxed'?" in bad.stderr, bad.stderr
