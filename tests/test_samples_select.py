"""k samples per prompt with verdicts (#30): pass@1 / pass@k live, and export --select per prompt.

Real simulator (rate_wrong_answer: some samples of a prompt answer one too high), a real SQLite file, the real
`synthwatch export` process and the dashboard's API over HTTP."""

from __future__ import annotations

import json
import re
from math import comb
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S, run_cli
from sqlalchemy import text
from workerkit import make_config, records, run_to_end, wait_for

from synthwatch.quality import verdicts as vd
from synthwatch.quality.passk import pass_at

ANSWER = re.compile(r"\*\*(-?\d+)\*\*|\\boxed\{(-?\d+)\}")


def write_refs(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            a, b = 3 + i % 97, 5 + (i * 7) % 89
            fh.write(json.dumps({"id": f"q{i}", "prompt": f"What is {a} + {b}?", "reference": str(a + b)}) + "\n")
    return path


def truth(rec: dict[str, Any]) -> bool:
    """What an exact verifier says, computed here from the stored answer and the question itself."""
    q = orjson.loads(rec["prompt_json"])[-1]["content"]
    a, b = (int(x) for x in re.findall(r"\d+", q)[:2])
    m = [x or y for x, y in ANSWER.findall(rec["content"] or "")]
    return bool(m) and int(m[-1]) == a + b


def judge_all(engine: Any, run_id: int, recs: list[dict[str, Any]], check: str, *, skip: set[int] = frozenset(),
              scores: bool = False) -> None:
    """Verdicts as the extended checks append them (latest row per record and check wins): a pending row first,
    then the final one."""
    with engine.begin() as conn:
        vd.mark_pending(conn, run_id, [r["id"] for r in recs], [check])
        vd.append(conn, [vd.NewVerdict(run_id, r["id"], check, vd.Verdict(
            "pass" if truth(r) else "fail", score=(len(r["reasoning"] or "") % 97) / 97 if scores else None))
            for r in recs if r["id"] not in skip])


def expected_pass(recs: list[dict[str, Any]], k: int, skip: set[int] = frozenset()) -> tuple[float, float]:
    per: dict[int, list[bool]] = {}
    for r in recs:
        if r["id"] not in skip:
            per.setdefault(r["prompt_idx"], []).append(truth(r))
    p1 = [sum(v) / len(v) for v in per.values()]
    pk = [1 - comb(len(v) - sum(v), k) / comb(len(v), k) for v in per.values() if len(v) >= k]
    return sum(p1) / len(p1), sum(pk) / len(pk)


def test_pass_at_estimator() -> None:
    assert pass_at(4, 0, 1) == 0.0 and pass_at(4, 4, 4) == 1.0
    assert pass_at(4, 1, 1) == 0.25
    assert pass_at(4, 1, 4) == 1.0  # one of four passed: some draw of 4 holds it
    assert pass_at(10, 3, 2) == pytest.approx(1 - comb(7, 2) / comb(10, 2))
    with pytest.raises(ValueError):
        pass_at(3, 1, 4)


def test_k4_with_the_math_verifier_pass_at_k_and_first_passing(engine, db_path, tmp_path, sim, live_app) -> None:  # type: ignore[no-untyped-def]
    """The must-show case end to end: k = 4, the math verifier (math-verify) against the dataset's reference,
    running live beside the run; pass@1 and pass@4 from its verdicts; `--select first-passing` exports one record per
    prompt that passed."""
    from workerkit import Background

    from synthwatch.quality.live import writer_hooks

    url = sim(seed=13, rate_wrong_answer=0.4, boxed_answers=True, reasoning_tokens="8-30", content_tokens="8-16")
    data = write_refs(tmp_path / "refs.jsonl", 15)
    config = make_config(url, data, samples_per_prompt=4, name="k4math",
                         checks={"verifiers": [{"kind": "math", "reference": "reference"}]})
    bg = Background(engine, config, hooks=lambda run_id: writer_hooks(engine, run_id, config)).start()
    assert bg.join(120) == "completed"
    run_id = bg.run_id
    recs = records(engine, run_id)
    assert len(recs) == 60
    with engine.connect() as conn:
        got = {rid: state for rid, state in conn.execute(text(
            "SELECT record_id, state FROM check_verdict v WHERE run_id = :r AND check_name = 'verify_math' AND id ="
            " (SELECT MAX(id) FROM check_verdict w WHERE w.record_id = v.record_id AND w.check_name = v.check_name)"),
            {"r": run_id})}
    # the verifier's verdicts are what the answers say (math-verify on the content, against the row's reference)
    assert got == {r["id"]: "pass" if truth(r) else "fail" for r in recs}
    mixed = [p for p in range(15) if 0 < sum(truth(r) for r in recs if r["prompt_idx"] == p) < 4]
    assert mixed, "some prompts must have passing and failing samples (else pass@1 = pass@4 per prompt)"
    want1, want4 = expected_pass(recs, 4)
    assert want4 > want1  # with mixed prompts pass@4 is above pass@1
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        sp = c.get(f"/api/runs/{run_id}/stats").json()["samples"]
        page = c.get(f"/runs/{run_id}").text
    assert sp["pass"]["check"] == "verify_math" and sp["pass"]["prompts_at_k"] == 15
    assert sp["pass"]["pass_at_1"] == pytest.approx(want1) and sp["pass"]["pass_at_k"] == pytest.approx(want4)
    assert f"pass@4 {want4 * 100:.1f}%" in page and f"pass@1 {want1 * 100:.1f}%" in page
    out = tmp_path / "first.jsonl"
    run_cli("export", "k4math", "--db", str(db_path), "--format", "messages", "--out", str(out),
            "--select", "first-passing", "--quiet", check=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    firsts = {}
    for r in recs:
        if truth(r) and r["prompt_idx"] not in firsts:
            firsts[r["prompt_idx"]] = r
    assert len(rows) == len(firsts) == sum(1 for p in range(15) if any(truth(r) for r in recs if r["prompt_idx"] == p))
    assert sorted(row["id"] for row in rows) == sorted(
        f"q{p}" + (f"#s{r['sample_index']}" if r["sample_index"] else "") for p, r in firsts.items())
    sel = json.loads(Path(str(out) + ".manifest.json").read_text())["selection"]["per_prompt"]
    assert sel["check"] == "verify_math" and sel["records_lacking_verdict"] == 0
    # the verifier's alarm holds an export of every sample (the failing ones are in it), not one that leaves them out
    held = run_cli("export", "k4math", "--db", str(db_path), "--format", "messages", "--out", str(tmp_path / "a.jsonl"))
    assert held.returncode == 2 and "failing verify_math" in held.stderr
    assert sel["pass_at_k"]["pass_at_k"] == pytest.approx(want4)


@pytest.fixture
def k4_run(engine, tmp_path, sim):  # type: ignore[no-untyped-def]
    url = sim(seed=11, rate_wrong_answer=0.5, reasoning_tokens="8-30", content_tokens="8-16")
    data = write_refs(tmp_path / "refs.jsonl", 12)
    config = make_config(url, data, samples_per_prompt=4, name="k4",
                         checks={"verifiers": [{"kind": "exact", "answer_regex": r"\*\*(-?\d+)\*\*"}]})
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    recs = records(engine, run_id)
    assert len(recs) == 48
    return run_id, recs


def test_pass_at_k_live_and_export_first_passing(engine, db_path, tmp_path, k4_run, live_app) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = k4_run
    mixed = [p for p in range(12) if 0 < sum(truth(r) for r in recs if r["prompt_idx"] == p) < 4]
    assert mixed, "the simulator's wrong answers must split some prompts (else pass@1 and pass@4 say the same)"
    lacking = {recs[5]["id"]}  # one sample's verdict is still pending
    judge_all(engine, run_id, recs, "verify_exact", skip=lacking)
    want1, want4 = expected_pass(recs, 4, lacking)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        sp = c.get(f"/api/runs/{run_id}/stats").json()["samples"]
    assert sp["pass"]["check"] == "verify_exact"
    assert sp["pass"]["pass_at_1"] == pytest.approx(want1)
    assert sp["pass"]["pass_at_k"] == pytest.approx(want4)
    assert sp["pass"]["prompts_at_k"] == 11 and sp["pass"]["samples_waiting"] == 1

    out = tmp_path / "first.jsonl"
    res = run_cli("export", "k4", "--db", str(db_path), "--format", "messages", "--out", str(out),
                  "--select", "first-passing", "--quiet", check=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {r["id"]: r for r in recs}
    ok_first = {}
    for r in sorted(recs, key=lambda r: (r["prompt_idx"], r["sample_index"])):
        if r["id"] not in lacking and truth(r) and r["prompt_idx"] not in ok_first:
            ok_first[r["prompt_idx"]] = r
    assert len(rows) == len(ok_first)  # one row per prompt that passed
    expect_ids = sorted(f"q{p}" + (f"#s{r['sample_index']}" if r["sample_index"] else "") for p, r in ok_first.items())
    assert sorted(row["id"] for row in rows) == expect_ids
    for row in rows:  # each is the passing answer itself
        assert any(row["messages"][-1]["content"] == by_id[i]["content"] for i in by_id if truth(by_id[i]))
    manifest = json.loads((tmp_path / "first.jsonl.manifest.json").read_text())
    sel = manifest["selection"]["per_prompt"]
    assert sel["mode"] == "first-passing" and sel["check"] == "verify_exact"
    assert sel["records_selected"] == sel["prompts_selected"] == len(ok_first)
    assert sel["records_lacking_verdict"] == 1 and sel["lacking_examples"] == sorted(lacking)
    assert sel["pass_at_k"]["pass_at_k"] == pytest.approx(want4)
    assert manifest["counts"]["excluded"]["no_verdict"] == 1
    assert manifest["counts"]["exported"] + sum(manifest["counts"]["excluded"].values()) == 48
    assert "no_verdict" in res.stdout and "selection first-passing" in res.stdout


def test_export_passing_best_and_all(engine, db_path, tmp_path, k4_run) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = k4_run
    judge_all(engine, run_id, recs, "verify_exact")
    judge_all(engine, run_id, recs, "judge", scores=True)

    def export(*flags: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        out = tmp_path / f"e{len(flags)}{flags[-1] if flags else ''}.jsonl"
        run_cli("export", "k4", "--db", str(db_path), "--format", "sharegpt", "--out", str(out), "--quiet", *flags,
                check=True)
        return ([json.loads(line) for line in out.read_text().splitlines()],
                json.loads(Path(str(out) + ".manifest.json").read_text()))

    rows, m = export("--select", "passing")
    assert len(rows) == sum(truth(r) for r in recs) and m["counts"]["excluded"].get("not_selected", 0) == 48 - len(rows)
    rows, m = export("--select", "best", "--select-check", "judge")
    best = {}
    for r in recs:
        s = (len(r["reasoning"] or "") % 97) / 97
        if r["prompt_idx"] not in best or s > best[r["prompt_idx"]][0]:
            best[r["prompt_idx"]] = (s, r)
    assert len(rows) == 12 and m["selection"]["per_prompt"]["check"] == "judge"
    assert sorted(row["id"] for row in rows) == sorted(
        f"q{p}" + (f"#s{r['sample_index']}" if r["sample_index"] else "") for p, (_s, r) in best.items())
    rows, m = export()
    assert len(rows) == 48 and m["selection"]["per_prompt"] == {"mode": "all"}
    assert len({row["id"] for row in rows}) == 48  # the samples of a prompt have distinct row ids
    bad = run_cli("export", "k4", "--db", str(db_path), "--format", "sharegpt", "--out", str(tmp_path / "x.jsonl"),
                  "--select", "best", "--select-check", "nosuch")
    # an unknown name is refused by the run's one catalogue (#38), with the names it knows
    assert bad.returncode == 2 and "unknown check 'nosuch' (--select-check)" in bad.stderr and "judge" in bad.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM check_verdict WHERE run_id = :r"), {"r": run_id}).scalar()


def test_the_export_page_and_api_select_per_prompt(engine, tmp_path, k4_run, live_app) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = k4_run
    judge_all(engine, run_id, recs, "verify_exact")
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as c:
        page = c.get(f"/runs/{run_id}/export").text
        assert 'data-testid="export-select"' in page and 'value="first-passing"' in page
        assert 'placeholder="verify_exact"' in page  # the run's verifier is the default check
        r = c.post(f"/api/runs/{run_id}/exports", json={"format": "messages", "select": "first-passing"})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        job = wait_for(lambda: (j := c.get(f"/api/runs/{run_id}/exports/{job_id}").json())["status"] != "running"
                       and j, timeout_s=60, what="the export to finish")
        assert job["status"] == "done", job
        sel = job["manifest"]["selection"]["per_prompt"]
        passed = {r["prompt_idx"] for r in recs if truth(r)}
        assert sel["mode"] == "first-passing" and sel["records_selected"] == len(passed)
        assert job["manifest"]["counts"]["exported"] == len(passed)
        bad = c.post(f"/api/runs/{run_id}/exports", json={"format": "messages", "select": "some"})
        assert bad.status_code == 400 and "select must be one of" in bad.json()["detail"]
