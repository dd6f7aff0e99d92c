"""The repair loop over the JSON API (real HTTP to a live dashboard, a real worker and simulator)."""

from __future__ import annotations

from typing import Any

import httpx
from test_checks_kit import completed_mismatch_run
from workerkit import make_config, records, run_row, wait_for

SAME = {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"}


def _post(srv: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers={**SAME, "Origin": srv.url}, timeout=30)


def test_api_settings_rederive_rerun_undo_autopause(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    run_id = completed_mismatch_run(engine, sim(reasoning_field="reasoning", seed=41, reasoning_tokens="8-24",
                                                content_tokens="4-12"), prompts(30), "api")
    srv = live_app()

    # settings: validated like a config file, refused for the dataset, a new version otherwise
    bad = _post(srv, f"/api/runs/{run_id}/settings", {"changes": {"reasoning.mode": "sideways"}})
    assert bad.status_code == 400 and "reasoning.mode" in bad.json()["detail"]
    fixed = _post(srv, f"/api/runs/{run_id}/settings", {"changes": {"dataset.path": "/etc/passwd"}})
    assert fixed.status_code == 400 and "dataset" in fixed.json()["detail"]
    # endpoints changed from the dashboard may not name just any variable: its value would go to the new URL
    leak = _post(srv, f"/api/runs/{run_id}/settings",
                 {"changes": {"endpoints": [{"base_url": "http://127.0.0.1:9/v1", "api_key_env": "HOME"}]}})
    assert leak.status_code == 400 and "HOME" in leak.json()["detail"] and "SYNTHWATCH_KEY_" in leak.json()["detail"]
    ok = _post(srv, f"/api/runs/{run_id}/settings", {"changes": {"reasoning": {"mode": "reasoning"}},
                                                     "reason": "renamed field"})
    assert ok.status_code == 200 and ok.json()["version"] == 2
    vs = httpx.get(f"{srv.url}/api/runs/{run_id}/versions").json()
    assert vs["current"] == 2 and [v["version"] for v in vs["versions"]] == [1, 2]
    assert vs["versions"][1]["reason"] == "renamed field"

    # cross-site writes are refused
    evil = httpx.post(f"{srv.url}/api/runs/{run_id}/rederive", json={"check": "field_mismatch"},
                      headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert evil.status_code == 403

    # re-derive: preview, then apply in the background
    sel_bad = _post(srv, f"/api/runs/{run_id}/rederive", {"check": "field_mismatch", "flag": "bad"})
    assert sel_bad.status_code == 400 and "one way" in sel_bad.json()["detail"]
    prev = _post(srv, f"/api/runs/{run_id}/rederive", {"check": "field_mismatch", "dry_run": True}).json()
    assert prev["dry_run"] and prev["selected"] == 30 and prev["changed"] == 30
    assert records(engine, run_id, "reasoning != ''") == []
    started = _post(srv, f"/api/runs/{run_id}/rederive", {"check": "field_mismatch", "max_id": prev["max_id"]})
    assert started.status_code == 202

    def job() -> dict[str, Any]:
        return httpx.get(f"{srv.url}/api/runs/{run_id}/repairs").json()  # type: ignore[no-any-return]

    wait_for(lambda: (job()["job"] or {}).get("state") == "done", timeout_s=30, what="the re-derive job")
    assert len(records(engine, run_id, "reasoning != ''")) == 30
    rid = records(engine, run_id)[0]["id"]
    hist = httpx.get(f"{srv.url}/api/runs/{run_id}/records/{rid}/history").json()["history"]
    assert len(hist) == 1 and hist[0]["reasoning"] == "" and hist[0]["action"] == "rederive"
    assert httpx.get(f"{srv.url}/api/runs/{run_id}/records/999999/history").status_code == 404

    # re-run two records, then undo that re-run (not generated yet)
    rr = _post(srv, f"/api/runs/{run_id}/rerun", {"ids": [rid, rid + 1]})
    assert rr.status_code == 202
    wait_for(lambda: (job()["job"] or {}).get("state") == "done" and job()["n_rerun_queued"] == 2, timeout_s=30,
             what="the re-run job")
    assert run_row(engine, run_id)["n_ok"] == 28
    repairs = job()["repairs"]
    assert [r["kind"] for r in repairs[:2]] == ["rerun", "rederive"]
    undo = _post(srv, f"/api/runs/{run_id}/repairs/{repairs[0]['id']}/undo", {})
    assert undo.status_code == 200 and undo.json()["restored"] == 2
    run = run_row(engine, run_id)
    assert run["n_ok"] == 30 and run["n_rerun"] == 0 and run["n_pending"] == 0
    again = _post(srv, f"/api/runs/{run_id}/repairs/{repairs[0]['id']}/undo", {})
    assert again.status_code == 400 and "already undone" in again.json()["detail"]

    # auto-pause off needs a reason; it is then listed with the alarms
    no = _post(srv, f"/api/runs/{run_id}/autopause", {"check": "empty_reasoning", "auto_pause": False})
    assert no.status_code == 400 and "reason" in no.json()["detail"]
    yes = _post(srv, f"/api/runs/{run_id}/autopause", {"check": "empty_reasoning", "auto_pause": False,
                                                       "reason": "model without reasoning for this split"})
    assert yes.status_code == 200
    listed = httpx.get(f"{srv.url}/api/runs/{run_id}/alarms").json()["auto_pause_off"]
    assert [o["check_name"] for o in listed] == ["empty_reasoning"]
    # the banner shows it (escaped) on every page of the run
    html = httpx.get(f"{srv.url}/runs/{run_id}/alarms/banner").text
    assert "Auto-pause is off for Empty reasoning" in html and "model without reasoning" in html
    # the settings and repair page renders with every section
    page = httpx.get(f"{srv.url}/runs/{run_id}/repair").text
    for part in ('id="settings"', 'id="repair"', 'id="versions"', 'id="repairs"', 'id="autopause"'):
        assert part in page


def test_settings_form_changes_endpoints_within_the_key_allowlist(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    from workerkit import run_to_end

    url = sim(seed=42, reasoning_tokens="4-8", content_tokens="4-8")
    run_id, final = run_to_end(engine, make_config(url, prompts(5), name="form-ep"))
    assert final == "completed"
    srv = live_app()
    headers = {"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}

    def post(lines: str) -> httpx.Response:
        return httpx.post(f"{srv.url}/runs/{run_id}/settings", data={"set.endpoints": lines, "reason": "moved"},
                          headers=headers, follow_redirects=False)

    bad = post(f"{url} HOME\n")  # the page again, the problem beside the endpoints, the lines kept
    assert bad.status_code == 400 and 'data-field-error="set.endpoints"' in bad.text and "HOME" in bad.text
    assert f"{url} HOME\n</textarea>" in bad.text
    assert run_row(engine, run_id)["config_version"] == 1
    same = post(f"{url}\n")  # what the form shows unchanged: no new version
    assert same.status_code == 400 and "nothing changes" in same.text
    ok = post(f"{url}\nhttp://127.0.0.1:9/v1 SYNTHWATCH_KEY_SECOND\n")
    assert "message=" in ok.headers["location"], ok.headers["location"]
    run = run_row(engine, run_id)
    assert run["config_version"] == 2
    import orjson

    eps = orjson.loads(run["config_json"])["endpoints"]
    assert [e["base_url"] for e in eps] == [url, "http://127.0.0.1:9/v1"]
    assert eps[1]["api_key_env"] == "SYNTHWATCH_KEY_SECOND"
