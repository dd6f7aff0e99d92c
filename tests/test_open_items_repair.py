"""The repair findings of #26, each as a regression test, plus the open items on PostgreSQL.

- a re-run that selects 0 records created a repair row: now it says "nothing to re-run" and leaves none
  (library, CLI, the dashboard form and the API);
- after saving settings the repair page forgot the alarm it was repairing, and Preview failed with "choose
  the records one way": the selection now survives the save;
- `fix` printed whole endpoint blobs, TLS settings included: it prints one line per changed value, never a TLS
  path or a header's setting, and never a secret;
- open items on SQLite and PostgreSQL: opened from an alarm, closed by a re-derive, history kept.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from conftest import run_cli
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from test_checks_kit import completed_mismatch_run
from workerkit import make_config, run_row, run_to_end

from synthwatch.quality.detection import open_items
from synthwatch.repair import actions as repair
from synthwatch.repair import settings_diff
from synthwatch.store import versions


def _repairs(engine: Any, run_id: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM repair WHERE run_id = :r"), {"r": run_id}).scalar_one())


@pytest.mark.slow
def test_a_rerun_of_nothing_leaves_no_repair_row(engine: Any, db_path: Any, sim: Any, prompts: Any,
                                                 live_app: Any) -> None:
    url = sim(seed=51, reasoning_tokens="4-8", content_tokens="3-6")
    run_id, final = run_to_end(engine, make_config(url, prompts(6), name="nothing"))
    assert final == "completed"
    with engine.connect() as conn:  # no record fails truncated: the selection is empty
        sel = repair.select(conn, run_id, check="truncated")
    res = repair.rerun_records(engine, run_id, sel, actor="t")
    assert res["queued"] == 0 and res["repair_id"] is None and res["message"].startswith("nothing to re-run")
    assert _repairs(engine, run_id) == 0

    cli = run_cli("rerun", "--db", str(db_path), "nothing", "--check", "truncated", "--yes", check=True)
    assert "nothing to re-run" in cli.stdout and "repair #" not in cli.stdout
    assert _repairs(engine, run_id) == 0

    srv = live_app()
    headers = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}
    form = httpx.post(f"{srv.url}/runs/{run_id}/repair/apply", data={"kind": "rerun", "check": "truncated"},
                      headers=headers, follow_redirects=False)
    assert form.status_code == 303 and "nothing+to+re-run" in form.headers["location"]
    assert "check=truncated" in form.headers["location"]  # the page comes back with what was chosen
    api = httpx.post(f"{srv.url}/api/runs/{run_id}/rerun", json={"check": "truncated"}, headers=headers, timeout=30)
    assert api.status_code == 200 and api.json()["started"] is False and "nothing to re-run" in api.json()["detail"]
    assert _repairs(engine, run_id) == 0


def test_saving_settings_keeps_the_alarm_being_repaired(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    run_id = completed_mismatch_run(engine, sim(reasoning_field="reasoning", seed=52, reasoning_tokens="8-16",
                                                content_tokens="4-8"), prompts(12), "keep")
    with engine.connect() as conn:
        alarm_id = conn.execute(text("SELECT id FROM alarm WHERE run_id = :r AND rule = 'field_mismatch'"),
                                {"r": run_id}).scalar_one()
    srv = live_app()
    headers = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}
    with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as c:
        page = c.get(f"/runs/{run_id}/repair?alarm={alarm_id}#repair").text
        assert f'<input type="hidden" name="keep.alarm" value="{alarm_id}">' in page
        # the settings form as the page sends it: the change, and the records being repaired
        saved = c.post(f"/runs/{run_id}/settings", data={"set.reasoning.mode": "reasoning", "reason": "fix",
                                                         "keep.alarm": str(alarm_id), "keep.kind": "rederive"},
                       follow_redirects=False)
        assert saved.status_code == 303, saved.text[-2000:]
        back = saved.headers["location"]
        assert f"alarm={alarm_id}" in back and "message=" in back
        again = c.get(back).text
        assert re.search(rf'<option value="{alarm_id}" selected>', again), "the alarm is no longer selected"
        # Preview from the page as it came back: the alarm's records, no "choose the records one way"
        preview = c.post(f"/runs/{run_id}/repair/preview", data={"kind": "rederive", "alarm": str(alarm_id)})
        assert preview.status_code == 200 and "choose the records one way" not in preview.text
        # an invalid save keeps it too
        bad = c.post(f"/runs/{run_id}/settings", data={"set.sampling.max_tokens": "many", "keep.alarm": str(alarm_id)})
        assert bad.status_code == 400 and re.search(rf'<option value="{alarm_id}" selected>', bad.text)


def test_fix_prints_a_readable_diff_without_tls_or_header_values(engine: Any, db_path: Any, sim: Any,
                                                                 prompts: Any, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SECRET_KEY_VAR_NAME", "sk-the-secret-itself")
    monkeypatch.setenv("TEAM_HEADER_VAR", "team-header-value")
    url = sim(seed=53, reasoning_tokens="4-8", content_tokens="3-6")
    ca = tmp_path / "very-private-ca.pem"
    config = make_config(url, prompts(3), name="diff", endpoints=[{
        "base_url": url, "api_key_env": "SECRET_KEY_VAR_NAME", "headers_env": {"X-Team": "TEAM_HEADER_VAR"},
        "tls": {"ca_bundle": str(ca), "verify": True}}])
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    r = run_cli("fix", "--db", str(db_path), "diff", "--base-url", "http://127.0.0.1:9/v1", "--max-tokens", "77",
                check=True, env=None)
    out = r.stdout
    assert "generation endpoints[0].base_url: '" + url + "' -> 'http://127.0.0.1:9/v1'" in out, out
    assert "sampling.max_tokens:" in out and "-> 77" in out
    assert "endpoints[0].tls: changed (value not shown)" in out
    assert "endpoints[0].headers_env: changed (value not shown)" in out
    for leaked in ("very-private-ca.pem", "TEAM_HEADER_VAR", "X-Team", "SECRET_KEY_VAR_NAME", "sk-the-secret-itself",
                   "team-header-value", "{"):
        assert leaked not in out, (leaked, out)
    assert run_row(engine, run_id)["config_version"] == 2


_PLAIN = st.text(alphabet="abcxyz:/.-", max_size=20)  # never spells a secret below
_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), _PLAIN)
_TREE = st.recursive(_VALUE, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(_PLAIN, inner, max_size=3)),
                     max_leaves=12)
_SECRET = st.text(alphabet="0123456789", min_size=1, max_size=8).map(lambda s: "S3CR3T" + s)


@given(st.lists(st.fixed_dictionaries({"base_url": _PLAIN,
                                       "tls": st.fixed_dictionaries({"ca_bundle": _SECRET}),
                                       "headers_env": st.dictionaries(_SECRET, _SECRET, max_size=2),
                                       "extra": _TREE}), min_size=1, max_size=3),
       st.lists(st.fixed_dictionaries({"base_url": _PLAIN, "extra": _TREE,
                                       "tls": st.fixed_dictionaries({"client_cert": _SECRET})}), max_size=3))
def test_settings_diff_never_shows_tls_or_header_values(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """Whatever the endpoints were and became, no TLS path and no header setting is printed, and nothing raises."""
    lines = settings_diff.lines([{"path": "endpoints", "old": old, "new": new}])
    assert "S3CR3T" not in "\n".join(lines), lines
    changed = [i for i in range(max(len(old), len(new))) if (old[i] if i < len(old) else None)
               != (new[i] if i < len(new) else None)]
    assert bool(lines) == bool(changed)


def test_open_items_on_both_databases(any_engine: Any, sim: Any, prompts: Any) -> None:
    """An alarm opens an item counted from the records; a re-derive that fixes them closes it as repaired; the
    closed item stays (SQLite and PostgreSQL: the migration's table and the bit arithmetic on both)."""
    engine = any_engine
    run_id = completed_mismatch_run(engine, sim(reasoning_field="reasoning", seed=54, reasoning_tokens="8-16",
                                                content_tokens="4-8"), prompts(20), "both")
    with engine.connect() as conn:
        [item] = [i for i in open_items.items(conn, run_id) if i["check_name"] == "field_mismatch"]
    assert item["n_records"] == 20 and item["state"] == "open"
    assert run_row(engine, run_id)["status_message"].startswith("completed with 20 records failing field_mismatch")
    versions.change_settings(engine, run_id, {"reasoning": {"mode": "reasoning"}}, actor="t")
    with engine.connect() as conn:
        sel = repair.select(conn, run_id, check="field_mismatch")
    assert repair.rederive_records(engine, run_id, sel, actor="t")["changed"] == 20
    with engine.connect() as conn:
        everything = open_items.items(conn, run_id, include_closed=True)
        still = open_items.items(conn, run_id)
        events = [r[0] for r in conn.execute(text("SELECT action FROM control_event WHERE run_id = :r"),
                                             {"r": run_id})]
    closed = next(i for i in everything if i["id"] == item["id"])
    assert closed["state"] == "repaired" and closed["closed_by"] == "t" and closed["n_peak"] == 20
    assert not [i for i in still if i["check_name"] == "field_mismatch"]
    assert "open_item_opened" in events and "open_item_repaired" in events
    assert "field_mismatch" not in (run_row(engine, run_id)["status_message"] or "")
    # an undo brings the failures back: a new item after the repaired one; a re-run queues them (not failing)
    from synthwatch.repair import history as repair_history

    with engine.connect() as conn:
        [rep] = [r for r in repair_history.list_repairs(conn, run_id) if r["kind"] == "rederive"]
    repair_history.undo(engine, run_id, rep["id"], actor="t")
    with engine.connect() as conn:
        [again] = [i for i in open_items.items(conn, run_id) if i["check_name"] == "field_mismatch"]
        sel = repair.select(conn, run_id, check="field_mismatch")
    assert again["follows"] == item["id"] and again["n_records"] == 20
    assert repair.rerun_records(engine, run_id, sel, actor="t")["queued"] == 20
    with engine.connect() as conn:
        [queued] = [i for i in open_items.items(conn, run_id) if i["check_name"] == "field_mismatch"]
    assert (queued["id"], queued["n_records"], queued["n_queued"]) == (again["id"], 0, 20)
    assert "20 records queued for a re-run (field_mismatch)" in run_row(engine, run_id)["status_message"]


@pytest.mark.slow
def test_open_items_over_the_api(engine: Any, sim: Any, prompts: Any, live_app: Any) -> None:
    """GET lists the open item; an export over the API is refused (409 naming it) until confirmed, and its manifest
    says who confirmed; accepting needs a reason (400), then closes it and the export needs no yes."""
    run_id = completed_mismatch_run(engine, sim(reasoning_field="reasoning", seed=55, reasoning_tokens="8-16",
                                                content_tokens="4-8"), prompts(10), "api-items")
    srv = live_app()
    headers = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}
    with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as c:
        listed = c.get(f"/api/runs/{run_id}/open-items").json()["open_items"]
        [item] = [i for i in listed if i["check_name"] == "field_mismatch"]
        assert item["n_records"] == 10 and item["state"] == "open"
        refused = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw"})
        assert refused.status_code == 409 and f"open problem #{item['id']}" in refused.json()["detail"]
        assert item["id"] in [i["id"] for i in refused.json()["open_alarms"]["open_items"]]
        job = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw", "allow_open_alarms": True})
        assert job.status_code == 202, job.text

        def manifest(job_id: int) -> dict[str, Any]:
            from workerkit import wait_for

            wait_for(lambda: c.get(f"/api/runs/{run_id}/exports/{job_id}").json()["status"] == "done",
                     timeout_s=60, what="the export")
            return c.get(f"/api/runs/{run_id}/exports/{job_id}").json()["manifest"]  # type: ignore[no-any-return]

        m = manifest(job.json()["id"])
        assert m["confirmed_with_open_alarms"] is True and m["confirmed_by"] == "api"
        assert item["id"] in [i["id"] for i in m["open_items"]]
        short = c.post(f"/api/runs/{run_id}/open-items/{item['id']}/accept", json={"reason": "ok"})
        assert short.status_code == 400 and "needs a reason" in short.json()["detail"]
        for i in listed:
            done = c.post(f"/api/runs/{run_id}/open-items/{i['id']}/accept", json={"reason": "kept as a negative set"})
            assert done.status_code == 200 and done.json()["state"] == "accepted" and done.json()["closed_by"] == "api"
        assert c.get(f"/api/runs/{run_id}/open-items").json()["open_items"] == []
        closed = c.get(f"/api/runs/{run_id}/open-items", params={"closed": "true"}).json()["open_items"]
        assert {i["state"] for i in closed} == {"accepted"}
        free = c.post(f"/api/runs/{run_id}/exports", json={"format": "raw"})
        assert free.status_code == 202, free.text
        m2 = manifest(free.json()["id"])
        assert m2["confirmed_with_open_alarms"] is False and m2["open_items"] == []
