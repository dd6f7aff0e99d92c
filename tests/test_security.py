"""Cross-site requests, token auth, loopback binding, headers: against a real server."""

from __future__ import annotations

import re
import socket

import httpx
import pytest
from conftest import HTTP_TIMEOUT_S, popen_cli, run_cli, wait_http_ready
from fastapi.routing import APIRoute

from synthwatch.app.main import create_app
from synthwatch.settings import Settings

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


def _walk(routes: list, prefix: str = "") -> list[tuple[str, str]]:  # type: ignore[type-arg]
    out = []
    for r in routes:
        if isinstance(r, APIRoute):
            for m in sorted(r.methods & UNSAFE):
                out.append((m, prefix + re.sub(r"\{[^}]+\}", "1", r.path)))
        elif hasattr(r, "original_router"):  # FastAPI keeps included routers as lazy wrappers
            ctx = getattr(r, "include_context", None)
            out += _walk(r.original_router.routes, prefix + (getattr(ctx, "prefix", "") or ""))
    return out


def _unsafe_routes(db: str) -> list[tuple[str, str]]:
    return _walk(create_app(db, Settings(db=db)).routes)


@pytest.mark.slow
def test_every_state_changing_endpoint_refuses_cross_site_requests(live_app, db_path) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    routes = _unsafe_routes(str(db_path))
    assert len(routes) >= 5, routes  # controls, flags, exports, start run ...
    hostile = [
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://evil.example"},  # older browsers: no Sec-Fetch-Site
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "null"},
    ]
    for method, path in routes:
        for headers in hostile:
            r = httpx.request(method, srv.url + path, headers=headers, data={"value": "1"}, timeout=10)
            assert r.status_code == 403, (method, path, headers, r.status_code, r.text[:200])
            assert "cross-site request refused" in r.text


def test_same_origin_control_is_accepted(live_app, engine) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.config import RunConfig
    from synthwatch.store import queue as store

    cfg = RunConfig.model_validate({"dataset": {"path": "x.jsonl"}, "endpoints": [{"base_url": "http://127.0.0.1:9/v1"}],
                                    "model": "m"})
    with engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "sec", cfg)
    srv = live_app()
    r = httpx.post(f"{srv.url}/api/runs/{rid}/control", json={"action": "pause"},
                   headers={"Origin": srv.url, "Sec-Fetch-Site": "same-origin"}, timeout=10)
    assert r.status_code == 200, r.text
    with engine.connect() as conn:
        assert store.run_row(conn, rid)["desired"] == "pause"


def test_security_headers_and_foreign_host_refused(live_app) -> None:  # type: ignore[no-untyped-def]
    srv = live_app()
    r = httpx.get(srv.url + "/runs", timeout=10)
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example
    r = httpx.get(srv.url + "/runs", headers={"Host": "evil.example:8000"}, timeout=10)
    assert r.status_code == 421


def test_token_required_on_every_page_and_api_call(live_app) -> None:  # type: ignore[no-untyped-def]
    srv = live_app(auth_token="s3cret-token")
    assert httpx.get(srv.url + "/api/runs", timeout=10).status_code == 401
    assert httpx.get(srv.url + "/runs", timeout=10, follow_redirects=False).status_code == 303
    assert httpx.get(srv.url + "/api/runs", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    assert httpx.get(srv.url + "/api/runs", headers={"Authorization": "Bearer s3cret-token"}, timeout=10).status_code == 200
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        r = c.post("/login", data={"token": "s3cret-token"}, headers={"Origin": srv.url})
        assert r.status_code == 303 and "synthwatch_token" in r.headers["set-cookie"]
        assert "httponly" in r.headers["set-cookie"].lower()
        assert c.get("/runs").status_code == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_refuses_non_loopback_without_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("serve", "--db", str(tmp_path / "x.db"), "--host", "0.0.0.0", "--port", str(_free_port()),
                   timeout=30)
    assert proc.returncode == 2
    assert "--auth-token" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("extra", [["--insecure"], ["--auth-token", "tok"]])
def test_serve_off_loopback_with_token_or_insecure(tmp_path, extra) -> None:  # type: ignore[no-untyped-def]
    port = _free_port()
    proc = popen_cli("serve", "--db", str(tmp_path / "x.db"), "--host", "0.0.0.0", "--port", str(port), *extra)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}", proc, headers={"Authorization": "Bearer tok"})
        r = httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=HTTP_TIMEOUT_S,
                      headers={"Authorization": "Bearer tok"})
        assert r.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    if extra == ["--insecure"]:
        assert "WARNING" in err and "no authentication" in err


def test_serve_binds_loopback_by_default(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.settings import Settings as S

    assert S().host == "127.0.0.1"


def test_serve_answers_the_address_it_prints_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the printed link is followed at once by scripts and browsers: it must never be refused, even while the
    # app is still starting
    proc = popen_cli("serve", "--db", str(tmp_path / "x.db"), "--port", "0")
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"http://(127\.0\.0\.1):(\d+)/runs", line)
        assert m, line
        with socket.create_connection((m.group(1), int(m.group(2))), timeout=5) as s:  # refused before the fix
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            s.settimeout(30)
            assert s.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
