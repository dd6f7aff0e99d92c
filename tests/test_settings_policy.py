"""One policy for what the dashboard may set (#34): the attacks of the issue, replayed through the API.

- the judge's endpoint set from ``POST /api/runs/{id}/settings`` with a secret key variable, extra headers and a TLS
  file outside the dashboard's folders: refused naming each key; and a configuration a dashboard stored that way
  before (an older dashboard) is refused by the operator's own resume, which sends nothing to that server;
- user checks as import paths (``this:s``, ``builtins:print``): refused, never imported by the dashboard nor by a
  resumed worker;
- the bounds: a seed of −2^63−1 (was a 500), ``limits.max_reply_bytes`` of 2^63 (switched the cap off), a rederive
  selection with an id ≥ 2^64 (its job died);
- a checks form post with none (or some) of the form's fields switched every built-in check off (#35).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import cli_env, run_cli, write_prompts
from keyecho import KeyEchoServer
from workerkit import run_row, wait_for

import synthwatch.quality.detection.overrides  # noqa: F401  (registers the weakening guard versions.create_version asks, #35)
from synthwatch.check_catalog import CHECK_NAMES
from synthwatch.config import ConfigError, build_config
from synthwatch.store import versions
from synthwatch.store.db import open_engine

SAME = {"Sec-Fetch-Site": "same-origin"}
SECRET = "sk-policy-test-0123456789abcdef"


def _cli_run(tmp_path: Path, url: str, db: Path, n: int = 3, **env: str) -> tuple[list[str], Any]:
    """A run made by the operator's own `synthwatch run` (what they type again to resume it)."""
    data = write_prompts(tmp_path / "p.jsonl", n)
    flags = ["run", "--name", "mine", "--dataset", str(data), "--base-url", url, "--model", "sim-reasoner",
             "--db", str(db), "--quiet", "--no-preflight"]
    run_cli(*flags, check=True, env=cli_env(**env))
    return flags, open_engine(str(db))


def _post(srv: Any, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, headers={**SAME, "Origin": srv.url}, timeout=30)


def test_the_judge_endpoint_cannot_carry_a_secret_a_header_or_a_tls_file(
        tmp_path: Path, sim: Any, live_app: Any, db_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shadow = outside / "shadow"
    shadow.write_text("root:$6$secret")
    (tmp_path / "tls").mkdir()
    flags, engine = _cli_run(tmp_path, sim(), db_path)
    run_id = run_row(engine, 1)["id"]
    srv = live_app(launch_tls_dirs=str(tmp_path / "tls"))
    with KeyEchoServer() as attacker:
        judge = {"endpoint": {"base_url": attacker.url, "api_key_env": "MY_SECRET",
                              "headers_env": {"X-Leak": "PATH"}, "tls": {"ca_bundle": str(shadow)}}, "model": "j"}
        r = _post(srv, f"/api/runs/{run_id}/settings", {"changes": {"judge": judge}})
        assert r.status_code == 400, r.text
        refused = set(r.json()["refused"])
        assert refused == {"judge.endpoint.api_key_env", "judge.endpoint.headers_env",
                           "judge.endpoint.tls.ca_bundle"}, r.text
        for key in refused:
            assert key in r.json()["detail"]
        assert "SYNTHWATCH_LAUNCH_TLS_DIRS" in r.json()["detail"]
        # the same through the run's endpoints and with dotted keys: the same validator, by type
        r = _post(srv, f"/api/runs/{run_id}/settings", {"changes": {"judge.endpoint.base_url": attacker.url,
                                                                    "judge.endpoint.api_key_env": "MY_SECRET",
                                                                    "judge.model": "j"}})
        assert r.status_code == 400 and r.json()["refused"] == ["judge.endpoint.api_key_env"], r.text
        r = _post(srv, f"/api/runs/{run_id}/settings", {"changes": {"endpoints": [
            {"base_url": attacker.url, "api_key_env": "MY_SECRET", "tls": {"client_cert": str(shadow)}}]}})
        assert r.status_code == 400, r.text
        assert set(r.json()["refused"]) == {"endpoints[0].api_key_env", "endpoints[0].tls.client_cert"}
        assert run_row(engine, run_id)["config_version"] == 1  # nothing refused was stored


def test_a_resume_never_sends_a_secret_that_a_dashboard_change_stored(tmp_path: Path, sim: Any,
                                                                      db_path: Path) -> None:
    """A dashboard before this policy stored the issue's judge: the operator's own `synthwatch run --name RUN` with
    the run's original flags used to send ``Authorization: Bearer <MY_SECRET>`` to it and open the TLS file."""
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$secret")
    flags, engine = _cli_run(tmp_path, sim(), db_path)
    with KeyEchoServer() as attacker:
        judge = {"endpoint": {"base_url": attacker.url, "api_key_env": "MY_SECRET",
                              "headers_env": {"X-Leak": "MY_SECRET"}, "tls": {"ca_bundle": str(shadow)}}, "model": "j"}
        versions.change_settings(engine, 1, {"judge": judge}, actor="api")
        proc = run_cli(*flags, env=cli_env(MY_SECRET=SECRET))
        assert attacker.seen == [], f"the resumed worker sent {len(attacker.seen)} requests to the dashboard's judge"
        assert proc.returncode == 2, proc.stdout + proc.stderr
        for key in ("judge.endpoint.api_key_env", "judge.endpoint.headers_env", "judge.endpoint.tls.ca_bundle"):
            assert key in proc.stderr, proc.stderr
        assert SECRET not in proc.stdout + proc.stderr
        proc = run_cli("judge", "mine", "--db", str(db_path), env=cli_env(MY_SECRET=SECRET))  # the catch-up too
        assert proc.returncode == 2 and "judge.endpoint.api_key_env" in proc.stderr, proc.stdout + proc.stderr
        assert attacker.seen == []
        # the operator's own change of those keys (synthwatch fix, checks --config) is theirs: the resume goes on
        versions.change_settings(engine, 1, {"judge": None}, actor="cli", reason="the judge was not mine")
        proc = run_cli(*flags, env=cli_env(MY_SECRET=SECRET))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert attacker.seen == []


def test_a_running_worker_does_not_adopt_a_stored_dashboard_change_the_policy_refuses(
        tmp_path: Path, sim: Any, db_path: Path) -> None:
    _flags, engine = _cli_run(tmp_path, sim(), db_path)
    config = build_config(orjson.loads(run_row(engine, 1)["config_json"]), "test")
    versions.change_settings(engine, 1, {"endpoints": [{"base_url": "http://127.0.0.1:9/v1",
                                                         "api_key_env": "MY_SECRET"}]}, actor="ui")
    with engine.connect() as conn, pytest.raises(ConfigError, match=r"endpoints\[0\]\.api_key_env"):
        versions.worker_config(conn, 1, config)
    versions.change_settings(engine, 1, {"endpoints": [{"base_url": "http://127.0.0.1:9/v1",
                                                         "api_key_env": "SYNTHWATCH_KEY_OK"}]}, actor="ui")
    with engine.connect() as conn:
        adopted, version = versions.worker_config(conn, 1, config)  # a variable meant for the dashboard: adopted
    assert version == 3 and adopted.endpoints[0].api_key_env == "SYNTHWATCH_KEY_OK"


def test_a_key_variable_meant_for_the_dashboard_is_accepted_and_used(
        tmp_path: Path, sim: Any, live_app: Any, db_path: Path) -> None:
    _flags, engine = _cli_run(tmp_path, sim(), db_path)
    srv = live_app()
    with KeyEchoServer() as judge_server:
        r = _post(srv, "/api/runs/1/settings", {"changes": {"judge": {
            "endpoint": {"base_url": judge_server.url, "api_key_env": "SYNTHWATCH_KEY_JUDGE"}, "model": "j"}}})
        assert r.status_code == 200, r.text
    cfg = orjson.loads(run_row(engine, 1)["config_json"])
    assert cfg["judge"]["endpoint"]["api_key_env"] == "SYNTHWATCH_KEY_JUDGE"


def test_user_checks_are_never_imported_from_the_dashboard(tmp_path: Path, sim: Any, live_app: Any,
                                                           db_path: Path) -> None:
    mod = tmp_path / "mods"
    mod.mkdir()
    marker = tmp_path / "imported"
    (mod / "sw_policy_canary.py").write_text(
        f"import traceback\nfrom pathlib import Path\nPath({str(marker)!r}).write_text(''.join(traceback.format_stack()))\n"
        "def check(record):\n    return True\n")
    flags, engine = _cli_run(tmp_path, sim(), db_path)
    sys.path.insert(0, str(mod))
    try:
        srv = live_app()
        for user in ([{"name": "pwn", "function": "this:s"}, {"name": "pr", "function": "builtins:print"}],
                     [{"name": "canary", "function": "sw_policy_canary:check"}]):
            r = _post(srv, "/api/runs/1/checks/settings", {"user": user})
            assert r.status_code == 400, r.text
            assert "checks.user[0].function" in r.json()["refused"], r.text
            assert "import path" in r.json()["detail"]
        # an entry point the operator's configuration did not enable is refused too
        r = _post(srv, "/api/runs/1/checks/settings", {"user": [{"name": "boxed"}]})
        assert r.status_code == 400 and r.json()["refused"] == ["checks.user[0].name"], r.text
        r = httpx.post(f"{srv.url}/api/runs/1/checks/recompute", headers={**SAME, "Origin": srv.url}, timeout=30)
        assert r.status_code == 202
        wait_for(lambda: not httpx.get(f"{srv.url}/api/runs/1/checks", timeout=30).json()["recomputing"], 60)
        assert run_row(engine, 1)["config_version"] == 1
        # an older dashboard stored one: the dashboard's recompute and the operator's resume both refuse to run it
        from synthwatch.quality.recompute import save_settings

        save_settings(engine, 1, {"user": [{"name": "canary", "function": "sw_policy_canary:check"}]}, actor="api")
        r = httpx.post(f"{srv.url}/api/runs/1/checks/recompute", headers={**SAME, "Origin": srv.url}, timeout=30)
        assert r.status_code == 409 and "checks.user[0].function" in r.json()["detail"], r.text
        env = cli_env(PYTHONPATH=f"{mod}:{Path(__file__).resolve().parent.parent}")
        proc = run_cli(*flags, env=env)
        assert proc.returncode == 2 and "checks.user[0].function" in proc.stderr, proc.stdout + proc.stderr
        for more in (["--recompute"], ["--pending"]):
            proc = run_cli("checks", "mine", "--db", str(db_path), *more, env=env)
            assert proc.returncode == 2 and "checks.user[0].function" in proc.stderr, proc.stdout + proc.stderr
        assert not marker.exists(), marker.read_text()
        assert "sw_policy_canary" not in sys.modules and "this" not in sys.modules
    finally:
        sys.path.remove(str(mod))


def test_numbers_are_bounded_and_a_refusal_names_the_key(tmp_path: Path, sim: Any, live_app: Any,
                                                        db_path: Path) -> None:
    _flags, engine = _cli_run(tmp_path, sim(), db_path)
    srv = live_app()
    for key, value in (("sampling.seed", -(2**63) - 1), ("sampling.seed", 2**64), ("limits.max_reply_bytes", 2**63),
                       ("limits.max_body_bytes", 2**40), ("timeouts.total_s", 1e300), ("retries.backoff_max_s", 1e9)):
        r = _post(srv, "/api/runs/1/settings", {"changes": {key: value}})
        assert r.status_code == 400, (key, r.status_code, r.text)
        assert r.json()["refused"] == [key] and key in r.json()["detail"], r.text
    r = _post(srv, "/api/runs/1/checks/settings", {"duplicate_max_tracked": 2**70})
    assert r.status_code == 400 and r.json()["refused"] == ["checks.duplicate_max_tracked"], r.text
    assert run_row(engine, 1)["config_version"] == 1
    # a rederive or rerun selection with an id beyond 64 bits: refused, naming the field (its job used to die)
    for path in ("rederive", "rerun"):
        for body in ({"ids": [2**64]}, {"ids": [1, 2**63]}, {"alarm": 2**64}, {"max_id": 2**64, "ids": [1]}):
            r = _post(srv, f"/api/runs/1/{path}", body)
            assert r.status_code == 400, (path, body, r.text)
            field = next(iter(body)) if "max_id" not in body else "max_id"
            assert any(p.startswith(field) for p in r.json()["problems"]), r.text
    r = httpx.post(f"{srv.url}/runs/1/repair/apply", data={"kind": "rederive", "ids": str(2**64)},
                   headers={**SAME, "Origin": srv.url}, follow_redirects=False, timeout=30)
    assert r.status_code == 303 and "error=ids" in r.headers["location"], r.headers
    assert httpx.get(f"{srv.url}/api/runs/1/repairs", timeout=30).json()["repairs"] == []


def test_a_form_post_without_the_forms_fields_switches_no_check_off(tmp_path: Path, sim: Any, live_app: Any,
                                                                    db_path: Path) -> None:
    _flags, engine = _cli_run(tmp_path, sim(), db_path)
    srv = live_app()

    def form(data: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{srv.url}/runs/1/checks/settings", data=data, headers={**SAME, "Origin": srv.url},
                          follow_redirects=False, timeout=30)

    def checks() -> dict[str, Any]:
        return httpx.get(f"{srv.url}/api/runs/1/checks", timeout=30).json()

    assert form({}).status_code == 303
    got = checks()
    assert got["settings"]["disabled"] == [], got["settings"]
    assert all(r["enabled"] for r in got["rules"].values())
    # some of the fields (a script posting one threshold): only that changes
    # (a raised threshold weakens detection: it carries its reason, #35)
    assert form({"threshold__truncated": "20%", "reason": "a script's lenient threshold"}).status_code == 303
    got = checks()
    assert got["settings"]["disabled"] == [] and all(r["enabled"] for r in got["rules"].values())
    assert got["rules"]["truncated"]["threshold"] == 0.2
    # the page's own form (every row shown): an unticked box is an explicit "off"
    page = {f"shown__{n}": "1" for n in CHECK_NAMES} | {f"computed__{n}": "on" for n in CHECK_NAMES} \
        | {f"enabled__{n}": "on" for n in CHECK_NAMES}
    del page["computed__repetition"], page["enabled__duplicate_output"]
    page["reason"] = "switched off on purpose"
    assert form(page).status_code == 303
    got = checks()
    assert got["settings"]["disabled"] == ["repetition"]
    assert [n for n, r in got["rules"].items() if not r["enabled"]] == ["duplicate_output"]
    # and an empty post after it leaves that as it is
    assert form({}).status_code == 303
    got = checks()
    assert got["settings"]["disabled"] == ["repetition"]
    assert [n for n, r in got["rules"].items() if not r["enabled"]] == ["duplicate_output"]
