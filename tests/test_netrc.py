"""A ~/.netrc entry for the model server's host is never sent (review finding): the metrics scraper, the worker's
client, the preflight and `synthwatch probe` each ask a real HTTP server that records every request's headers,
with HOME pointing at a folder whose .netrc names that host. aiohttp's ``trust_env`` (and an HTTP client reading
netrc) would send ``Authorization: Basic <login:password>``; a proxy is used only where the environment names one
(HTTP(S)_PROXY, NO_PROXY), read at start-up (synthwatch/outbound.py env_proxy)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import cli_env, run_async, run_cli

from synthwatch.config import EndpointConfig, EndpointPoolConfig
from synthwatch.workers.endpoints import EndpointPool
from synthwatch.workers.server_metrics import Scraper

LOGIN, PASSWORD = "netrc-user", "netrc-password-4711"
BASIC = base64.b64encode(f"{LOGIN}:{PASSWORD}".encode()).decode()

METRICS = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
"""


class Recorder:
    """An OpenAI-compatible server on 127.0.0.1 that keeps every request's path and headers."""

    def __init__(self) -> None:
        seen: list[tuple[str, dict[str, str]]] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                seen.append((self.path, dict(self.headers)))
                path = urlsplit(self.path).path  # a proxied request names the whole URL
                if path == "/v1/models":
                    self._answer(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())
                elif path == "/metrics":
                    self._answer(200, METRICS, "text/plain")
                elif path == "/version":
                    self._answer(200, b'{"version": "0.32.0"}')
                else:
                    self._answer(404, b"{}")

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                seen.append((self.path, dict(self.headers)))
                msg = {"role": "assistant", "content": "8", "reasoning": "3 + 5 = 8."}
                self._answer(200, json.dumps({
                    "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}).encode())

            def log_message(self, *a: Any) -> None:
                pass

        self.seen = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def leaked(self) -> list[str]:
        return [path for path, headers in self.seen
                if any(BASIC in v or PASSWORD in v for v in headers.values())]


@pytest.fixture
def recorder() -> Any:
    r = Recorder()
    yield r
    r.server.shutdown()


@pytest.fixture
def netrc_home(tmp_path: Path, monkeypatch: Any) -> Path:
    """HOME (and nothing else) points at a folder whose .netrc names 127.0.0.1, as a developer's might."""
    home = tmp_path / "home"
    home.mkdir()
    netrc = home / ".netrc"
    netrc.write_text(f"machine 127.0.0.1\nlogin {LOGIN}\npassword {PASSWORD}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("NETRC", raising=False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_the_metrics_scraper_sends_no_netrc_credentials(recorder: Recorder, netrc_home: Path) -> None:
    import netrc

    assert netrc.netrc().authenticators("127.0.0.1") is not None  # the entry is there to be read
    pool = EndpointPool([EndpointConfig(base_url=recorder.url)], EndpointPoolConfig())
    rows: list[dict[str, Any]] = []

    async def scrape_once() -> None:
        done = asyncio.get_running_loop().create_future()

        def write(batch: list[dict[str, Any]]) -> None:
            rows.extend(batch)
            if not done.done():
                done.set_result(None)

        task = asyncio.create_task(Scraper(pool.endpoints, interval_s=0.2, timeout_s=10, write=write).run())
        try:
            await asyncio.wait_for(done, 60)
        finally:
            task.cancel()

    run_async(scrape_once())  # a thread of its own: a browser test's loop may be running in this one
    paths = [p for p, _ in recorder.seen]
    assert "/metrics" in paths and "/version" in paths, paths
    assert rows and rows[0].get("error") is None, rows  # it scraped (the request really went out)
    assert recorder.leaked() == [], recorder.seen


def test_the_metrics_scraper_uses_the_proxy_the_environment_names(recorder: Recorder, netrc_home: Path,
                                                                  monkeypatch: Any) -> None:
    """A proxy configured explicitly (HTTP_PROXY) is still used, as for the worker's own requests."""
    monkeypatch.setenv("HTTP_PROXY", recorder.url.removesuffix("/v1"))
    monkeypatch.setenv("NO_PROXY", "")
    pool = EndpointPool([EndpointConfig(base_url="http://metrics.example.invalid:8000/v1")], EndpointPoolConfig())
    assert pool.endpoints[0].proxy, "the environment's proxy was not read"

    async def scrape_once() -> list[dict[str, Any]]:
        done: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(Scraper(pool.endpoints, interval_s=0.2, timeout_s=10,
                                           write=lambda b: done.done() or done.set_result(b)).run())
        try:
            return await asyncio.wait_for(done, 60)
        finally:
            task.cancel()

    rows = run_async(scrape_once())
    assert rows and rows[0].get("error") is None, rows
    assert "http://metrics.example.invalid:8000/metrics" in [p for p, _ in recorder.seen], recorder.seen
    assert recorder.leaked() == []


@pytest.mark.slow  # two CLI processes
def test_run_preflight_and_probe_send_no_netrc_credentials(recorder: Recorder, netrc_home: Path, tmp_path: Path,
                                                           prompts: Any) -> None:
    env = cli_env(HOME=str(netrc_home))
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NETRC"):
        env.pop(var, None)
    proc = run_cli("run", "--dataset", str(prompts(3)), "--base-url", recorder.url, "--model", "m", "--no-stream",
                   "--db", str(tmp_path / "n.db"), "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("probe", "--base-url", recorder.url, "--model", "m", "--timeout", "60", env=env)
    paths = [p for p, _ in recorder.seen]
    assert paths.count("/v1/chat/completions") >= 3 and paths.count("/v1/models") >= 2, paths
    assert recorder.leaked() == [], [(p, h) for p, h in recorder.seen if p in recorder.leaked()]


def test_the_preflight_asks_through_the_proxy_the_environment_names(recorder: Recorder, netrc_home: Path,
                                                                   monkeypatch: Any) -> None:
    """The preflight goes where the run's own requests go (the pool's proxy, read once from HTTP_PROXY), and
    sends no ~/.netrc credentials on the way (#25: it asks through aiohttp now, as the worker does)."""
    from types import SimpleNamespace

    from synthwatch.workers.preflight import check_run_endpoints

    monkeypatch.setenv("HTTP_PROXY", recorder.url.removesuffix("/v1"))
    monkeypatch.setenv("NO_PROXY", "")
    config = SimpleNamespace(endpoints=[EndpointConfig(base_url="http://models.example.invalid:8000/v1")],
                             pool=EndpointPoolConfig(), model="m")
    check_run_endpoints(config, timeout_s=30)
    assert "http://models.example.invalid:8000/v1/models" in [p for p, _ in recorder.seen], recorder.seen
    assert recorder.leaked() == []
