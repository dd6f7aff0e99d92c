"""The preflight (workers/preflight.py) against real servers: a reply too large to be a list of models is read only
up to MAX_MODELS_BYTES and refused in one line, a redirect is reported rather than followed (#25: the preflight asks
through aiohttp now). The named refusals (missing /v1, wrong model, dead server, 401) are tests/test_first_hour.py's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import run_async

from synthwatch.workers.preflight import MAX_MODELS_BYTES, PreflightError, check_endpoint


class _Huge(BaseHTTPRequestHandler):
    sent: list[int] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # no length: the body ends when the connection does
            block = b" " * 65536
            n = 0
            try:
                while True:  # endless: a client without a bound would wait for its total timeout
                    self.wfile.write(block)
                    n += len(block)
            except OSError:
                pass  # the client stopped reading, as it should
            _Huge.sent.append(n)
        else:
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def huge_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Huge)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_an_endless_models_reply_is_read_only_up_to_the_bound(huge_server: str) -> None:
    with pytest.raises(PreflightError) as err:
        check_endpoint(f"{huge_server}/v1", "m", timeout_s=60)
    line = str(err.value)
    assert "answered 200 but not the OpenAI list of models" in line and len(line) < 600, line
    assert "\n" not in line
    # what the server got out before the client hung up: the bound, plus what the sockets' buffers held
    assert not _Huge.sent or _Huge.sent[-1] < MAX_MODELS_BYTES + 16 * 2**20, _Huge.sent


def test_a_redirect_is_reported_not_followed(huge_server: str) -> None:
    with pytest.raises(PreflightError) as err:
        check_endpoint(f"{huge_server}/other/v1", "m", timeout_s=30)
    assert "answered 302" in str(err.value), err.value


def test_the_preflight_works_from_a_thread_whose_loop_is_running(sim: Any) -> None:
    """check_endpoint is a plain function: called where an event loop already runs in the thread (a caller inside a
    loop; in the full suite, Playwright's sync API in the same process) it still checks, on a thread of its own."""
    url = sim()

    async def inside_a_loop() -> Any:
        return check_endpoint(url, "sim-reasoner", timeout_s=30)

    facts = run_async(inside_a_loop())  # a thread of its own: this one may hold Playwright's loop
    assert "sim-reasoner" in facts.models
    with pytest.raises(PreflightError, match="no-such-model"):
        run_async(_wrong_model(url))


async def _wrong_model(url: str) -> Any:
    return check_endpoint(url, "no-such-model", timeout_s=30)
