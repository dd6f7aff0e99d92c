"""Any check, and a selection expression, wherever the dashboard names records (#38 items 1 and 2): the records
table's filters (`?check=user:boxed`, `?where=EXPR`), search combined with them, bulk flags, the repair page's re-run
of a user check's alarm, the JSON API (and its OpenAPI description) and the Prometheus metrics. Real SQLite, a real
dashboard over real HTTP."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from test_review import add_record, add_run, ids_of

from synthwatch.check_catalog import BIT
from synthwatch.quality import verdicts as vd
from synthwatch.store import queue as store

SAME = {"Sec-Fetch-Site": "same-origin"}

CONFIG: dict[str, Any] = {
    "checks": {
        "verifiers": [{"kind": "math", "reference": "answer"}],
        "user": [{"name": "boxed", "function": "mychecks:boxed"}],
        "rule": [{"name": "has_boxed", "regex": "boxed"}],
        "language": {"enabled": True},
    },
    "judge": {"endpoint": {"base_url": "http://127.0.0.1:9/v1"}, "model": "judge-model"},
}
VERIFY = "verify_math"

# record index -> (content, built-in check flags, {check: verdict states appended in order: the last is in force})
RECORDS: list[tuple[str, int, dict[str, list[str]]]] = [
    ("all good \\boxed{4}", 0, {"user:boxed": ["pass"], "language": ["pass"], VERIFY: ["pass"], "judge": ["pass"]}),
    ("needle wrong box", 0, {"user:boxed": ["fail"], "language": ["pass"], VERIFY: ["pass"], "judge": ["fail"]}),
    ("auf Deutsch \\boxed{5}", 0, {"user:boxed": ["pass"], "language": ["fail"], VERIFY: ["fail"], "judge": ["pass"]}),
    ("cut short \\boxed{4}", BIT["truncated"], {"user:boxed": ["fail", "pass"], "language": ["pass"], VERIFY: ["error"]}),
    ("no box at all", 0, {"user:boxed": ["fail"], "language": ["fail"], VERIFY: ["pass"], "rule:has_boxed": ["fail"]}),
    ("needle still waiting", 0, {}),
]


def verdict_run(engine: Any, name: str = "where-run") -> tuple[int, list[int]]:
    """A run with every kind of check (built-in, verifier, rule, user, language, judge) and verdicts in force as the
    verdict writer leaves them (appended rows; the latest per record and check is in force)."""
    run_id = add_run(engine, name, CONFIG)
    ids = [add_record(engine, run_id, i, content=content, check_flags=flags)
           for i, (content, flags, _v) in enumerate(RECORDS)]
    with engine.connect() as conn, store.write_begin(conn):
        for rid, (_c, _f, states) in zip(ids, RECORDS, strict=True):
            for check, seq in states.items():
                for state in seq:
                    vd.append(conn, [vd.NewVerdict(run_id, rid, check, vd.Verdict(state, reason=f"{check} {state}"))])
        conn.execute(text("UPDATE run SET status = 'completed', total = :n, n_ok = :n WHERE id = :r"),
                     {"n": len(ids), "r": run_id})
    return run_id, ids


def pick(ids: list[int], *which: int) -> list[int]:
    return sorted(ids[i] for i in which)


def listed(c: httpx.Client, run_id: int, **params: str) -> list[int]:
    r = c.get(f"/api/runs/{run_id}/records", params={**params, "limit": "100"})
    assert r.status_code == 200, r.text
    return sorted(ids_of(r.json()["records"]))


def test_records_filter_by_any_check_over_the_api(engine: Any, live_app: Any) -> None:
    """`?check=user:boxed` answered "unknown check"; every kind of check now filters the records table."""
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert listed(c, run_id, check="user:boxed") == pick(ids, 1, 4)  # record 3 failed, then passed
        assert listed(c, run_id, check="language") == pick(ids, 2, 4)
        assert listed(c, run_id, check="judge") == pick(ids, 1)
        assert listed(c, run_id, check="rule:has_boxed") == pick(ids, 4)
        assert listed(c, run_id, check=VERIFY) == pick(ids, 2)
        assert listed(c, run_id, check="truncated") == pick(ids, 3)  # built-in: the record's bit
        count = c.get(f"/api/runs/{run_id}/records/count", params={"check": "user:boxed"}).json()
        assert count["count"] == 2
        r = c.get(f"/api/runs/{run_id}/records", params={"check": "user:boxd"})
        assert r.status_code == 400
        detail = r.json()["detail"]
        assert "user:boxd" in detail and "did you mean" in detail and "user:boxed" in detail


def test_records_filter_by_expression_over_the_api(engine: Any, live_app: Any) -> None:
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert listed(c, run_id, where="user:boxed=fail or language=fail") == pick(ids, 1, 2, 4)
        assert listed(c, run_id, where="user:boxed=pass and not judge=fail") == pick(ids, 0, 2, 3)
        assert listed(c, run_id, where=f"{VERIFY}=pass and language=pass") == pick(ids, 0, 1)
        # a built-in check in the same grammar, with other filters
        assert listed(c, run_id, where="truncated=fail or judge=fail") == pick(ids, 1, 3)
        assert listed(c, run_id, where="user:boxed=fail", check="language") == pick(ids, 4)
        got = c.get(f"/api/runs/{run_id}/records", params={"where": "user:boxed=fail"}).json()
        assert got["filters"]["where"] == "user:boxed=fail"  # the page's filter as given, for links that keep it
        assert c.get(f"/api/runs/{run_id}/records/count",
                     params={"where": "user:boxed=fail or language=fail"}).json()["count"] == 3
        # a mistyped check: 400 naming it, with the name meant
        r = c.get(f"/api/runs/{run_id}/records", params={"where": "user:boxd=fail and language=pass"})
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert detail.startswith("where:") and "user:boxd" in detail and "did you mean" in detail
        assert "user:boxed" in detail
        # a syntax error: 400 naming the column
        r = c.get(f"/api/runs/{run_id}/records", params={"where": "user:boxed=fail language=pass"})
        assert r.status_code == 400 and r.json()["detail"].startswith("where:") and "column 17" in r.json()["detail"]
        r = c.get(f"/api/runs/{run_id}/records", params={"where": "user:boxed=fail and ("})
        assert r.status_code == 400 and "ends too early" in r.json()["detail"]
        r = c.get(f"/api/runs/{run_id}/records/count", params={"where": "language=maybe"})
        assert r.status_code == 400 and "where:" in r.json()["detail"]


def test_search_combined_with_a_check_or_an_expression(engine: Any, live_app: Any) -> None:
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert listed(c, run_id, q="needle") == pick(ids, 1, 5)
        assert listed(c, run_id, q="needle", check="user:boxed") == pick(ids, 1)
        assert listed(c, run_id, q="needle", where="judge=fail or language=fail") == pick(ids, 1)
        assert listed(c, run_id, q="needle", where="not user:boxed=fail") == pick(ids, 5)
        assert c.get(f"/api/runs/{run_id}/records/count", params={"q": "needle", "check": "user:boxed"}
                     ).json()["count"] == 1


def test_records_page_filters_offer_every_check_and_show_an_error_not_a_500(engine: Any, live_app: Any) -> None:
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        page = c.get(f"/runs/{run_id}/records", params={"status": "finished"})
        assert page.status_code == 200
        for name in ("truncated", "empty_reasoning", "user:boxed", "rule:has_boxed", "language", VERIFY, "judge"):
            assert f'<option value="{name}"' in page.text, name
        assert 'name="where"' in page.text
        good = c.get(f"/runs/{run_id}/records", params={"status": "finished", "where": "user:boxed=fail"})
        assert good.status_code == 200
        assert f'data-record-id="{ids[1]}"' in good.text and f'data-record-id="{ids[0]}"' not in good.text
        # the htmx fragment answers from the same data function
        frag = c.get(f"/runs/{run_id}/records", params={"where": "user:boxed=fail"},
                     headers={"HX-Request": "true", "HX-Target": "records-table"})
        assert frag.status_code == 200 and "<html" not in frag.text and f'data-record-id="{ids[4]}"' in frag.text
        for where, words in [("user:boxd=fail", ("did you mean", "user:boxed")),
                             ("judge=fail and (", ("ends too early",)),
                             ("<script>alert(1)</script>", ("column 1",))]:
            for headers in ({}, {"HX-Request": "true", "HX-Target": "records-table"}):
                r = c.get(f"/runs/{run_id}/records", params={"where": where}, headers=headers)
                assert r.status_code == 400, (where, r.status_code)
                assert 'id="filter-error"' in r.text and all(w in r.text for w in words), (where, r.text[-2000:])
                assert "<script>alert(1)" not in r.text  # the expression is shown escaped
        # the whole page keeps the form with what was typed, so it can be corrected
        r = c.get(f"/runs/{run_id}/records", params={"where": "user:boxd=fail"})
        assert 'value="user:boxd=fail"' in r.text and 'id="record-filters"' in r.text


def test_bulk_flag_by_expression_and_by_any_check(engine: Any, live_app: Any) -> None:
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30, headers={**SAME, "Origin": srv.url}) as c:
        body: dict[str, Any] = {"filters": {"where": "user:boxed=fail OR  Language=fail"}, "verdict": "bad",
                                "reason": "other"}
        preview = c.post(f"/api/runs/{run_id}/flags/bulk", json=body).json()["preview"]
        assert preview["count"] == 3
        done = c.post(f"/api/runs/{run_id}/flags/bulk", json={**body, "ids": preview["ids"]}).json()
        assert done["flagged"] == 3
        assert listed(c, run_id, flag="bad") == pick(ids, 1, 2, 4)
        with engine.connect() as conn:  # the audit log names the selection, its expression normalised
            detail = conn.execute(text("SELECT detail FROM control_event WHERE run_id = :r AND action = 'bulk_flag'"),
                                  {"r": run_id}).scalar_one()
        assert detail == "3 records flagged bad: where=user:boxed=fail or language=fail", detail
        assert c.post(f"/api/runs/{run_id}/flags/undo").json()["undone"] == 3
        # by a user check
        body = {"filters": {"check": "judge"}, "verdict": "bad"}
        preview = c.post(f"/api/runs/{run_id}/flags/bulk", json=body).json()["preview"]
        assert preview["count"] == 1
        # a bad expression is refused, naming it, and flags nothing
        r = c.post(f"/api/runs/{run_id}/flags/bulk", json={"filters": {"where": "user:boxd=fail"}, "verdict": "bad"})
        assert r.status_code == 400 and "did you mean" in r.json()["detail"]
        # the form (htmx) path previews and applies the same selection
        form = {"status": "finished", "where": "user:boxed=fail", "flag_verdict": "bad", "flag_reason": "other"}
        r = c.post(f"/runs/{run_id}/flags/bulk", data=form)
        assert r.status_code == 200 and 'data-count="2"' in r.text
        assert 'name="where" value="user:boxed=fail"' in r.text  # the confirmation keeps the expression
    # a bulk flag is state-changing: a cross-site one is refused, whatever it selects
    r = httpx.post(f"{srv.url}/runs/{run_id}/flags/bulk", data={**form, "ids": str(ids[1])},
                   headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM record WHERE review = 'bad' AND run_id = :r"),
                            {"r": run_id}).scalar() == 0


def _wait_job(c: httpx.Client, run_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        body = c.get(f"/api/runs/{run_id}/repairs").json()
        job = body.get("job") or {}
        if job.get("state") in ("done", "failed"):
            return body  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"repair job still {job}"
        time.sleep(0.05)


def test_repair_page_reruns_the_records_of_a_user_check_alarm(engine: Any, live_app: Any) -> None:
    """The repair page's re-run for a `user:boxed` alarm answered "unknown check"; it now previews and queues
    exactly the records failing that check."""
    run_id, ids = verdict_run(engine)
    with engine.connect() as conn, store.write_begin(conn):
        alarm = conn.execute(text(
            "INSERT INTO alarm (run_id, rule, severity, title, message, count, raised_at, updated_at, active,"
            " auto_paused) VALUES (:r, 'user:boxed', 'error', 'user:boxed fails', 'm', 2, 1.0, 1.0, true, false)"
            " RETURNING id"), {"r": run_id}).scalar_one()
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30, headers={**SAME, "Origin": srv.url}) as c:
        page = c.get(f"/runs/{run_id}/repair", params={"alarm": alarm, "kind": "rerun"})
        assert page.status_code == 200
        for name in ("user:boxed", "language", VERIFY, "judge", "rule:has_boxed", "truncated"):
            assert f'<option value="{name}"' in page.text, name  # "records failing a check" offers every check
        r = c.post(f"/runs/{run_id}/repair/preview", data={"kind": "rerun", "alarm": str(alarm)})
        assert r.status_code == 200, r.text[-1500:]
        assert 'data-testid="repair-preview"' in r.text and "<b>2</b> of 2 records" in r.text
        max_id = r.text.split('name="max_id" value="')[1].split('"')[0]
        r = c.post(f"/runs/{run_id}/repair/apply", data={"kind": "rerun", "alarm": str(alarm), "check": "",
                                                           "flag": "", "filter": "", "ids": "", "max_id": max_id},
                   follow_redirects=False)
        assert r.status_code == 303 and "error" not in r.headers["location"], r.headers["location"]
        body = _wait_job(c, run_id)
        assert body["job"]["state"] == "done", body["job"]
        assert body["n_rerun_queued"] == 2
        # the same by check name and by expression, over the API
        prev = c.post(f"/api/runs/{run_id}/rerun", json={"check": "user:boxed", "dry_run": True}).json()
        assert prev["selected"] == 2
        prev = c.post(f"/api/runs/{run_id}/rerun", json={"filter": {"where": "judge=fail or language=fail"},
                                                          "dry_run": True}).json()
        assert prev["selected"] == 3
        r = c.post(f"/api/runs/{run_id}/rerun", json={"check": "user:boxd", "dry_run": True})
        assert r.status_code == 400 and "did you mean" in r.json()["detail"]
    with engine.connect() as conn:
        queued = [r[0] for r in conn.execute(text("SELECT id FROM record WHERE run_id = :r AND status = 'pending'"
                                                  " ORDER BY id"), {"r": run_id})]
        assert queued == pick(ids, 1, 4)
        kept = conn.execute(text("SELECT count(*) FROM record_history WHERE record_id IN (:a, :b)"),
                            {"a": ids[1], "b": ids[4]}).scalar()
        assert kept == 2  # their earlier outputs are kept


def test_openapi_describes_check_and_where(live_app: Any) -> None:
    srv = live_app()
    spec = httpx.get(f"{srv.url}/openapi.json", timeout=30).json()
    for path in ("/api/runs/{run_id}/records", "/api/runs/{run_id}/records/count"):
        params = {p["name"]: p for p in spec["paths"][path]["get"].get("parameters", [])}
        assert {"check", "where"} <= set(params), (path, sorted(params))
        desc = params["where"].get("description", "")
        assert "and" in desc and "or" in desc and "not" in desc and "400" in desc, desc
        assert "user:" in params["check"].get("description", "")
    bulk = spec["paths"]["/api/runs/{run_id}/flags/bulk"]["post"]
    assert "where" in bulk.get("description", ""), bulk.get("description")


def _scrape(srv: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    r = httpx.get(f"{srv.url}/metrics", timeout=30)
    assert r.status_code == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def _verdicts(m: dict[str, Any], run: str) -> dict[tuple[str, str, str], float]:
    return {(d["check"], d["kind"], d["verdict"]): v for key, v in m["synthwatch_check_verdicts"].items()
            for d in [dict(key)] if d["run"] == run}


def test_metrics_count_every_checks_verdicts_with_bounded_names(engine: Any, live_app: Any) -> None:
    run_id, ids = verdict_run(engine, "prom-where")
    with engine.connect() as conn, store.write_begin(conn):  # the writer's running totals of the built-in checks
        conn.execute(text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                          " updated_at) VALUES (:r, 'truncated', 1, 6, 1, 6, 1.0)"), {"r": run_id})
        # a check name as stored may be anything (an old run's, a hand-written row): it is bounded and escaped
        hostile = 'user:x"} 1\nsynthwatch_fake{a="' + "y" * 400
        vd.append(conn, [vd.NewVerdict(run_id, ids[0], hostile, vd.Verdict("fail"))])
    srv = live_app()
    m = _scrape(srv)
    got = _verdicts(m, "prom-where")
    assert got[("user:boxed", "user", "fail")] == 2 and got[("user:boxed", "user", "pass")] == 3
    assert got[("user:boxed", "user", "pending")] == 1
    assert got[("language", "language", "fail")] == 2
    assert got[("judge", "judge", "fail")] == 1 and got[("judge", "judge", "pass")] == 2
    assert got[("judge", "judge", "pending")] == 3
    assert got[(VERIFY, "verifier", "error")] == 1 and got[(VERIFY, "verifier", "fail")] == 1
    assert got[("rule:has_boxed", "rule", "fail")] == 1
    assert got[("truncated", "built-in", "fail")] == 1 and got[("truncated", "built-in", "pass")] == 5
    assert "synthwatch_fake" not in m
    assert all(len(check) <= 100 for check, _k, _v in got)
    assert {k for _c, k, _v in got} <= {"built-in", "verifier", "rule", "user", "language", "near_duplicate",
                                        "judge", "stored"}


@pytest.mark.parametrize("where", ["user:boxed=fail or", "(((", "user:boxed==fail", "and", "x" * 3000])
def test_a_bad_expression_is_a_400_on_every_surface(engine: Any, live_app: Any, where: str) -> None:
    run_id, _ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30, headers={**SAME, "Origin": srv.url}) as c:
        for r in (c.get(f"/api/runs/{run_id}/records", params={"where": where}),
                  c.get(f"/api/runs/{run_id}/records/count", params={"where": where}),
                  c.get(f"/runs/{run_id}/records", params={"where": where}),
                  c.get(f"/runs/{run_id}/records/count", params={"where": where}),
                  c.post(f"/api/runs/{run_id}/flags/bulk", json={"filters": {"where": where}, "verdict": "bad"}),
                  c.post(f"/runs/{run_id}/flags/bulk", data={"where": where, "flag_verdict": "bad"}),
                  c.post(f"/api/runs/{run_id}/rerun", json={"filter": {"where": where}, "dry_run": True})):
            assert r.status_code == 400, (r.request.url, r.status_code, r.text[:300])
            assert "where" in r.text


def test_check_and_where_select_the_same_records_on_both_databases(any_engine: Any) -> None:
    """The expression's SQL (its values bound, its subqueries correlated with the records table or its alias) on
    SQLite and PostgreSQL, alone, with other filters, with search and in a bulk flag's preview."""
    from synthwatch.review import flags as review_flags
    from synthwatch.review import idset
    from synthwatch.review import queries as review
    from synthwatch.review.filters import Filters, ReviewError

    run_id, ids = verdict_run(any_engine)
    cases = [({"check": "user:boxed"}, (1, 4)), ({"check": "verify:math"}, (2,)),
             ({"where": "user:boxed=fail or language=fail"}, (1, 2, 4)),
             ({"where": "user:boxed=pass and not judge=fail"}, (0, 2, 3)),
             ({"where": f"{VERIFY}=error or truncated"}, (3,)),
             ({"where": "user:boxed=pending"}, (5,)),
             ({"where": "judge=fail", "check": "user:boxed", "status": "ok"}, (1,)),
             ({"q": "needle", "where": "not user:boxed=fail"}, (5,)),
             ({"q": "needle", "check": "judge"}, (1,))]
    from synthwatch.store import search_index

    if search_index.applies(any_engine):  # SQLite's FTS5 index is filled from its queue (PostgreSQL's is an index)
        while search_index.index_some(any_engine)[0]:
            pass
    with any_engine.connect() as conn:
        for params, want in cases:
            f = Filters.from_params(params)
            got = sorted(r["id"] for r in review.page(conn, run_id, f, limit=100).rows)
            assert got == pick(ids, *want), params
            assert review.count(conn, run_id, f) == (len(want), False), params
            assert sorted(idset.decode(review_flags.bulk_preview(conn, run_id, f)["ids"])) == pick(ids, *want)
            conn.rollback()
        with pytest.raises(ReviewError, match="did you mean 'user:boxed'"):
            review.page(conn, run_id, Filters.from_params({"where": "user:boxd"}))


def test_random_samples_of_the_records_failing_any_check(engine: Any, live_app: Any) -> None:
    """The review's `failing` samples take any check of the run too (`check=user:boxed` was "unknown check")."""
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        seen = set()
        # a sample is the record after a random point of the records' random keys, so one whose key follows a short
        # gap comes up rarely (20 draws missed one in a fresh-clone CI run): drawn until both came, or 2,000 draws
        for _ in range(2000):
            r = c.get(f"/api/runs/{run_id}/sample", params={"mode": "failing", "check": "user:boxed"})
            assert r.status_code == 200, r.text
            seen.add(r.json()["record"]["id"])
            if seen >= set(pick(ids, 1, 4)):
                break
        assert seen == set(pick(ids, 1, 4))
        r = c.get(f"/api/runs/{run_id}/sample", params={"mode": "failing", "check": "rule:has_boxed"})
        assert r.json()["record"]["id"] == ids[4]
        r = c.get(f"/api/runs/{run_id}/sample", params={"mode": "failing", "check": "user:boxd"})
        assert r.status_code == 400 and "did you mean 'user:boxed'" in r.json()["detail"]
        # the viewer's sample links name every check of the run
        page = c.get(f"/runs/{run_id}/records/{ids[1]}", params={"mode": "failing", "check": "user:boxed"})
        assert page.status_code == 200 and "check=user:boxed" in page.text and "check=judge" in page.text


def test_a_repair_records_the_expression_in_its_normal_form(engine: Any, live_app: Any) -> None:
    """What a repair row keeps of an expression is its normalised text (canonical names, lower-case keywords): only
    names, keywords, operators and parentheses reach the store, whatever spacing or case was typed."""
    run_id, ids = verdict_run(engine)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30, headers={**SAME, "Origin": srv.url}) as c:
        r = c.post(f"/api/runs/{run_id}/rerun", json={"filter": {"where": "  JUDGE=FAIL   OR (verify:math=error)"}})
        assert r.status_code == 202, r.text
        body = _wait_job(c, run_id)
        assert body["job"]["state"] == "done" and body["n_rerun_queued"] == 2
    with engine.connect() as conn:
        sel = conn.execute(text("SELECT selection FROM repair WHERE run_id = :r"), {"r": run_id}).scalar_one()
    assert f'"where":"judge=fail or {VERIFY}=error"' in sel, sel
