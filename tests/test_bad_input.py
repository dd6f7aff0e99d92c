"""Bad input everywhere gets a clear message: a non-zero exit with the reason (CLI), a 4xx with a readable body
(API and pages); never a traceback, never a 500."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import run_cli


@pytest.fixture
def one_run(tmp_path: Path, sim: Any, prompts: Any) -> dict[str, Any]:
    db = tmp_path / "bad.db"
    url = sim()
    p = run_cli("run", "--dataset", str(prompts(3)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
                "--name", "good", timeout=60)
    assert p.returncode == 0, p.stderr
    bad_cfg = tmp_path / "bad.toml"
    bad_cfg.write_text('model = "sim-reasoner"\nconcurency = 4\n[dataset]\npath = "x.jsonl"\n')
    broken_toml = tmp_path / "broken.toml"
    broken_toml.write_text("model = \n[[[")
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"\xff\xfe not json at all\n{\"messages\": 5}\n")
    checks_cfg = tmp_path / "checks.toml"
    checks_cfg.write_text("[checks]\nno_such_setting = 1\n")
    return {"db": str(db), "url": url, "tmp": tmp_path, "bad_cfg": str(bad_cfg), "broken": str(broken_toml),
            "junk": str(junk), "checks_cfg": str(checks_cfg), "prompts": str(prompts(2, "p2.jsonl"))}


# (args with {placeholders}, a piece of the expected reason, case-insensitive)
CLI_CASES: list[tuple[list[str], str]] = [
    (["run", "--db", "{db}", "--dataset", "{tmp}/missing.jsonl", "--base-url", "{url}", "--model", "m"],
     "missing.jsonl"),
    (["run", "--db", "{db}", "--dataset", "{prompts}", "--base-url", "not a url", "--model", "m"], "url"),
    (["run", "--db", "{db}", "--dataset", "{prompts}", "--base-url", "ftp://example/v1", "--model", "m"], "url"),
    (["run", "--db", "{db}", "--dataset", "{prompts}", "--base-url", "{url}", "--model", "m", "--concurrency", "-3"],
     "concurrency"),
    (["run", "--db", "{db}", "--dataset", "{prompts}", "--base-url", "{url}", "--model", "m", "--concurrency",
      "100000000"], "concurrency"),
    (["run", "--db", "{db}", "--dataset", "{prompts}", "--base-url", "{url}", "--model", "m", "--cap", "-1"], "cap"),
    (["run", "--db", "{db}", "--dataset", "{prompts}", "--base-url", "{url}", "--model", "m", "--concurrency", "x"],
     "concurrency"),
    (["run", "--db", "{db}", "--config", "{bad_cfg}", "--base-url", "{url}"], "concurency"),
    (["run", "--db", "{db}", "--config", "{broken}"], "broken.toml"),
    (["run", "--db", "{db}", "--config", "{tmp}/nope.toml"], "nope.toml"),
    (["run", "--db", "{db}", "--dataset", "{junk}", "--base-url", "{url}", "--model", "sim-reasoner", "--name", "j"],
     "junk.jsonl"),
    (["export", "--db", "{db}", "no-such-run", "--format", "messages", "--out", "{tmp}/o.jsonl"], "no-such-run"),
    (["export", "--db", "{db}", "999", "--format", "messages", "--out", "{tmp}/o.jsonl"], "999"),
    (["export", "--db", "{db}", "good", "--format", "bogus", "--out", "{tmp}/o.jsonl"], "bogus"),
    (["export", "--db", "{db}", "good", "--format", "messages", "--out", "{tmp}/no/such/dir/o.jsonl"], "dir"),
    (["control", "--db", "{db}", "no-such-run", "pause"], "no-such-run"),
    (["control", "--db", "{db}", "good", "cap", "-5"], "cap"),
    (["control", "--db", "{db}", "good", "cap", "lots"], "cap"),
    (["control", "--db", "{db}", "good", "concurrency", "0"], "concurrency"),
    (["control", "--db", "{db}", "good", "concurrency", "99999999"], "concurrency"),
    (["control", "--db", "{db}", "good", "explode"], "explode"),
    (["watch", "--db", "{db}", "--map", "nonsense", "{tmp}/w.jsonl"], "nonsense"),
    (["watch", "--db", "{db}", "--map", "colour=a.b", "{tmp}/w.jsonl"], "colour"),
    (["import", "--db", "{db}", "{tmp}/none-*.jsonl"], "none-"),
    (["import", "--db", "{db}", "{junk}", "--run", "imp"], "junk.jsonl"),
    (["checks", "--db", "{db}", "no-such-run"], "no-such-run"),
    (["checks", "--db", "{db}", "good", "--config", "{checks_cfg}"], "no_such_setting"),
    (["serve", "--db", "{db}", "--port", "70000"], "port"),
    (["serve", "--db", "{db}", "--port", "-1"], "port"),
    (["serve", "--db", "{db}", "--host", "0.0.0.0"], "auth"),
    (["serve", "--db", "{db}", "--host", "no-such-host.invalid", "--insecure"], "no-such-host.invalid"),
]


@pytest.mark.slow
def test_cli_bad_input_exits_with_a_reason(one_run: dict[str, Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    failures = []
    cases = [([a.format(**one_run) for a in args], reason) for args, reason in CLI_CASES]
    with ThreadPoolExecutor(3) as pool:  # each case is a fresh interpreter (~2 s of imports)
        procs = list(pool.map(lambda c: run_cli(*c[0], timeout=60), cases))
    for (real, reason), p in zip(cases, procs, strict=True):
        out = p.stdout + p.stderr
        problem = None
        if p.returncode == 0:
            problem = "exit 0"
        elif "Traceback" in out:
            problem = "traceback"
        elif reason.lower() not in out.lower():
            problem = f"reason {reason!r} not named"
        if problem:
            failures.append(f"synthwatch {' '.join(real)}: {problem}\n    {out.strip()[-600:]}")
    assert not failures, "\n".join(failures)


def _call(method: str, url: str, body: bytes | None = None, ctype: str = "application/json",
          origin: str | None = None) -> tuple[int, str, str]:
    headers = {"Content-Type": ctype} if body is not None else {}
    if origin:
        headers["Origin"] = origin
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode(errors="replace")


def test_api_and_pages_answer_bad_input_with_readable_4xx(one_run: dict[str, Any], live_app: Any,
                                                          db_path: Path) -> None:
    import shutil

    for suffix in ("", "-wal", "-shm"):
        if Path(one_run["db"] + suffix).exists():
            shutil.copy(one_run["db"] + suffix, str(db_path) + suffix)
    app = live_app(launch_dataset_dirs=str(one_run["tmp"]))
    base = app.url
    status, _, body = _call("GET", f"{base}/api/runs")
    assert status == 200
    runs = orjson.loads(body)
    run_id = (runs if isinstance(runs, list) else runs["runs"])[0]["id"]

    # every GET route with a run id, for a run that does not exist
    spec = orjson.loads(_call("GET", f"{base}/openapi.json")[2])
    from synthwatch.app.main import create_app
    from synthwatch.settings import Settings

    def flat(routes: Any) -> Any:
        for r in routes:
            inner = getattr(r, "original_router", None)  # FastAPI wraps included routers
            yield from flat(inner.routes) if inner is not None else [r]

    routes = [r.path for r in flat(create_app(str(db_path), Settings(db=str(db_path))).routes)
              if "GET" in (getattr(r, "methods", None) or set()) and "{run_id}" in getattr(r, "path", "")]
    assert len(routes) >= 20 and spec["paths"]
    failures = []
    for path in routes:
        url = base + path.replace("{run_id}", "987654").replace("{record_id:int}", "1").replace(
            "{record_id}", "1").replace("{job_id}", "1").replace("{alarm_id}", "1").replace(
            "{field}", "content")
        status, ctype, body = _call("GET", url)
        if status != 404 or "Traceback" in body or not body.strip():
            failures.append(f"GET {path}: {status} {body[:200]}")
        elif "json" in ctype:
            assert "detail" in orjson.loads(body), path
        else:
            assert "987654" in body or "not found" in body.lower() or "no run" in body.lower(), (path, body[:300])
    # a record / job / alarm that does not exist in a run that does
    for path in (f"/runs/{run_id}/records/999999", f"/api/runs/{run_id}/records/999999",
                 f"/runs/{run_id}/records/999999/tokens", f"/api/runs/{run_id}/exports/999999",
                 f"/runs/{run_id}/exports/999999"):
        status, _, body = _call("GET", base + path)
        if status != 404 or "Traceback" in body:
            failures.append(f"GET {path}: {status} {body[:200]}")
    # bad query values
    for path in (f"/runs/{run_id}/records?status=bogus", f"/api/runs/{run_id}/records?reasoning_len_min=-4",
                 f"/api/runs/{run_id}/records?sort=nope", f"/runs/{run_id}/records?after=%%%garbage",
                 f"/api/runs/{run_id}/records?limit=abc", f"/api/runs/{run_id}/sample?minutes=abc",
                 f"/runs/{run_id}/records?q=" + "x" * 600, "/api/runs/abc"):
        status, _, body = _call("GET", base + path)
        if not 400 <= status < 500 or "Traceback" in body or not body.strip():
            failures.append(f"GET {path}: {status} {body[:200]}")

    # bad control values: 400 (or 422 from the schema) with the reason; a same-origin good one works
    same = base
    for body_obj, reason in (({"action": "cap", "value": -1}, "cap"), ({"action": "concurrency", "value": 0},
                                                                       "concurrency"),
                             ({"action": "concurrency", "value": 10**9}, "concurrency"),
                             ({"action": "explode"}, "action"), ({"action": "cap", "value": "many"}, "value")):
        status, _, body = _call("POST", f"{base}/api/runs/{run_id}/control", orjson.dumps(body_obj), origin=same)
        if status not in (400, 422) or reason not in body.lower() or "Traceback" in body:
            failures.append(f"POST control {body_obj}: {status} {body[:200]}")
    status, _, body = _call("POST", f"{base}/runs/{run_id}/control", b"action=cap&value=-7",
                            "application/x-www-form-urlencoded", origin=same)
    if status != 400 or "cap" not in body.lower() or "Traceback" in body:
        failures.append(f"POST control form cap -7: {status} {body[:200]}")
    status, _, body = _call("POST", f"{base}/api/runs/987654/control", orjson.dumps({"action": "pause"}), origin=same)
    if status != 404:
        failures.append(f"POST control unknown run: {status} {body[:200]}")
    status, _, body = _call("POST", f"{base}/api/runs", b"{not json", origin=same)
    if status not in (400, 422) or "Traceback" in body:
        failures.append(f"POST /api/runs bad JSON: {status} {body[:200]}")

    # the start-run form: bad input answers 400 with the message on the page
    tmp = one_run["tmp"]
    form_cases = [
        ({"dataset": str(tmp / "missing.jsonl"), "endpoints": one_run["url"], "model": "m"}, "missing.jsonl"),
        ({"dataset": one_run["prompts"], "endpoints": "not a url", "model": "m"}, "url"),
        ({"dataset": one_run["prompts"], "endpoints": one_run["url"], "model": "m", "concurrency": "-2"},
         "concurrency"),
        ({"dataset": one_run["prompts"], "endpoints": one_run["url"], "model": "m", "cap": "abc"}, "cap"),
    ]
    from urllib.parse import urlencode

    for fields, reason in form_cases:
        status, ctype, body = _call("POST", f"{base}/runs/new", urlencode(fields).encode(),
                                    "application/x-www-form-urlencoded", origin=same)
        if status != 400 or reason not in body.lower() or "Traceback" in body or "html" not in ctype:
            failures.append(f"POST /runs/new {fields}: {status} {body[:300]}")
    assert not failures, "\n".join(failures)


def test_same_origin_requests_to_each_kind_of_control_endpoint_work(one_run: dict[str, Any], live_app: Any,
                                                                     db_path: Path) -> None:
    """The cross-site refusal (tests/test_security.py) must not refuse the dashboard's own requests."""
    import shutil

    for suffix in ("", "-wal", "-shm"):
        if Path(one_run["db"] + suffix).exists():
            shutil.copy(one_run["db"] + suffix, str(db_path) + suffix)
    base = live_app().url
    runs = orjson.loads(_call("GET", f"{base}/api/runs")[2])
    run_id = (runs if isinstance(runs, list) else runs["runs"])[0]["id"]
    recs = orjson.loads(_call("GET", f"{base}/api/runs/{run_id}/records")[2])
    rid = (recs if isinstance(recs, list) else recs["records"])[0]["id"]
    form = "application/x-www-form-urlencoded"
    calls: list[tuple[str, bytes, str, tuple[int, ...]]] = [
        (f"/api/runs/{run_id}/control", orjson.dumps({"action": "cap", "value": 2}), "application/json", (200,)),
        (f"/runs/{run_id}/control", b"action=concurrency&value=3", form, (200, 303)),
        (f"/api/runs/{run_id}/records/{rid}/flag", orjson.dumps({"verdict": "bad", "reason": "truncated"}),
         "application/json", (200,)),
        (f"/api/runs/{run_id}/records/{rid}/undo", b"{}", "application/json", (200,)),
        (f"/runs/{run_id}/records/{rid}/flag", b"verdict=good", form, (200, 303)),
        (f"/api/runs/{run_id}/checks/recompute", b"{}", "application/json", (200, 202)),
        (f"/api/runs/{run_id}/exports", orjson.dumps({"format": "messages"}), "application/json", (200, 201, 202)),
    ]
    failures = []
    for path, body, ctype, ok in calls:
        status, _, text = _call("POST", base + path, body, ctype, origin=base)
        if status not in ok:
            failures.append(f"POST {path}: {status} {text[:200]}")
    assert not failures, "\n".join(failures)
    run = orjson.loads(_call("GET", f"{base}/api/runs/{run_id}")[2])
    assert run.get("cap", run.get("run", {}).get("cap")) == 2 or '"cap":2' in orjson.dumps(run).decode()
