"""Shared fixtures: a real SQLite file per test, the simulator on a real port, CLI subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Property-based tests (Hypothesis). "ci" keeps every suite's example count bounded so that the whole suite stays
# well inside CI's time; "fuzz" (./dev fuzz) runs many more. No deadline: a generated case that takes long because
# the machine is loaded is not a failure (what a case may cost is asserted by the tests themselves).
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=IN_CI, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "fuzz", max_examples=500, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("SYNTHWATCH_HYPOTHESIS_PROFILE", "ci"))


def run_async(coro: Any) -> Any:
    """asyncio.run in a fresh thread: Playwright's sync API leaves a loop running in the main thread."""
    import asyncio
    import threading

    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=main, daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def require(condition: bool, why: str) -> None:
    """Skip locally when a requirement is missing; under CI fail instead (never a quiet skip)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"requirement missing under CI: {why}")
    pytest.skip(why)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "synthwatch.db"


@pytest.fixture
def engine(db_path: Path) -> Any:
    from synthwatch.store.db import open_engine

    eng = open_engine(str(db_path))
    yield eng
    eng.dispose()


@pytest.fixture
def sim() -> Iterator[Callable[..., str]]:
    """Start simulators: sim(reasoning_field="reasoning", ...) -> base_url. All stop at teardown."""
    from contextlib import ExitStack

    from synthwatch.simulator.config import SimConfig
    from synthwatch.simulator.launch import running_in_thread

    with ExitStack() as stack:

        def start(**kw: Any) -> str:
            return stack.enter_context(running_in_thread(SimConfig(**kw)))

        yield start


@contextlib.contextmanager
def sim_process(*args: str) -> Iterator[str]:
    """A `synthwatch simulate` in a process of its own (its pacing is not slowed by the test's event loop), with
    these flags; yields its base URL and stops it after."""
    proc = subprocess.Popen([sys.executable, "-m", "synthwatch", "simulate", "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=cli_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(30)


def write_prompts(path: Path, n: int, *, start: int = 0) -> Path:
    with path.open("w") as fh:
        for i in range(start, start + n):
            a, b = 3 + i % 97, 5 + (i * 7) % 89
            fh.write(json.dumps({"id": f"p{i}", "messages": [
                {"role": "user", "content": f"What is {a} + {b}?"}]}) + "\n")
    return path


@pytest.fixture
def prompts(tmp_path: Path) -> Callable[[int], Path]:
    def make(n: int, name: str = "prompts.jsonl") -> Path:
        return write_prompts(tmp_path / name, n)

    return make


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHWATCH_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 120, check: bool = False, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "synthwatch", *args], capture_output=True, text=True, timeout=timeout,
        env=env or cli_env(), cwd=cwd or ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"synthwatch {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def kill_9_repeatedly(args: list[str], *, rounds: int, wait_s: tuple[float, float], seed: int,
                     env: dict[str, str] | None = None, started: Callable[[], bool] | None = None,
                     after_kill: Callable[[], None] | None = None) -> int:
    """Start `synthwatch *args` again and again, each time SIGKILLed after a random wait, until it finishes on
    its own or `rounds` are done; returns how many times it was killed. ``started``: the random wait begins
    once it is true (e.g. the process sent a request); ``after_kill`` runs after each kill."""
    import random
    import signal
    import time

    rng = random.Random(seed)
    kills = 0
    for _ in range(rounds):
        proc = popen_cli(*args, env=env)
        if started is not None:
            deadline = time.monotonic() + 60
            while proc.poll() is None and not started() and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(rng.uniform(*wait_s))
        if proc.poll() is not None:
            proc.communicate()
            break
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
        if after_kill is not None:
            after_kill()
    return kills


def popen_cli(*args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "synthwatch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env or cli_env(), cwd=ROOT, **kw,
    )


READY_TIMEOUT_S = 180.0
"""How long a test waits for a process it started to be ready (a dashboard's /healthz answering). A bound, not a
wait: the test goes on the moment the process answers. Large because a loaded machine (eight sessions on two
cores) starts a Python process in tens of seconds; a fixed 30 s made tests fail under load that pass alone."""
HTTP_TIMEOUT_S = 60.0
"""Per-request bound for a test's requests to a dashboard that is up: a slow answer under load is not a failure."""


def wait_http_ready(base_url: str, proc: subprocess.Popen[Any] | None = None, *, path: str = "/healthz",
                    headers: dict[str, str] | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once GET base_url+path answers 200; fail at once when ``proc`` exited first."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base_url + path, timeout=HTTP_TIMEOUT_S, headers=headers).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{base_url}: the process exited with code {proc.returncode} before it answered")
        if time.monotonic() > deadline:
            raise AssertionError(f"{base_url}{path} did not answer within {timeout_s:.0f} s")
        time.sleep(0.1)


# ---------------------------------------------------------------- live dashboard + real browser

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
# No DNS at all: any external URL fails at once and is reported by the problem checks below.
CHROMIUM_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):  # type: ignore[no-untyped-def]
    require(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} missing: run `apt-get install -y chromium`")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


class LiveServer:
    def __init__(self, app: Any) -> None:
        import socket as _socket
        import threading

        import uvicorn

        # IPPROTO_TCP explicitly: uvicorn then sets TCP_NODELAY on accepted connections (no 40 ms Nagle stalls)
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, _socket.IPPROTO_TCP)
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def start(self) -> LiveServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def live_app(db_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """live_app(**settings) -> a dashboard on a real port serving db_path; stopped at teardown."""
    servers: list[LiveServer] = []

    def start(**settings: Any) -> LiveServer:
        from synthwatch.app.main import create_app
        from synthwatch.settings import Settings

        app = create_app(str(db_path), Settings(db=str(db_path), **settings))
        srv = LiveServer(app).start()
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        s.stop()


class BrowserProblems(list):  # type: ignore[type-arg]
    """JS errors, console.error lines, failed requests and HTTP >= 400 responses."""

    def attach(self, page: Any) -> None:
        page.on("pageerror", lambda exc: self.append(f"pageerror: {exc}"))
        page.on("console", lambda m: m.type == "error" and self.append(f"console.error: {m.text}"))
        page.on("requestfailed", self._failed)
        page.on("response", lambda r: r.status >= 400 and self.append(f"HTTP {r.status}: {r.request.method} {r.url}"))

    def _failed(self, request: Any) -> None:
        err = request.failure or ""
        if "ERR_ABORTED" not in err:  # a navigation cancelled an in-flight poll: not a server fault
            self.append(f"requestfailed: {request.method} {request.url} {err}")


@pytest.fixture
def browser_problems(request: Any, page: Any) -> BrowserProblems:
    problems = BrowserProblems()
    problems.attach(page)
    request.node.browser_problems = problems
    return problems


@pytest.fixture(autouse=True)
def _watch_browser(request: Any) -> None:
    if "page" in request.fixturenames:
        request.getfixturevalue("browser_problems")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    result = yield
    problems = getattr(item, "browser_problems", None)
    if problems:
        pytest.fail("browser problems:\n  " + "\n  ".join(problems), pytrace=False)
    return result


# ---------------------------------------------------------------- SQLite and PostgreSQL

@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    from pgserver import PgServer, available

    why = available()
    require(why is None, why or "")
    server = PgServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request: Any, tmp_path: Path) -> str:
    """A database URL on each backend: a SQLite file, and a fresh database on a real PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "synthwatch.db")
    return request.getfixturevalue("pg_server").new_database()  # type: ignore[no-any-return]


@pytest.fixture
def any_engine(any_db: str) -> Iterator[Any]:
    from synthwatch.store.db import open_engine

    eng = open_engine(any_db)
    yield eng
    eng.dispose()


# ---------------------------------------------------------------- honest markers

def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """A test that drives a browser must say so (`-m "not browser"` is the quick loop's promise)."""
    unmarked = [item.nodeid for item in items
                if "page" in getattr(item, "fixturenames", ()) and item.get_closest_marker("browser") is None]
    if unmarked:
        raise pytest.UsageError("these tests use a browser page but lack @pytest.mark.browser:\n  "
                                + "\n  ".join(unmarked))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the schema- and registry-generated property tests cover (#34): each records a ``coverage`` property
    (record_property), which xdist carries back from its workers; printed at the end of every run."""
    lines = sorted({str(v) for reports in terminalreporter.stats.values() for r in reports
                    for k, v in getattr(r, "user_properties", ()) if k == "coverage"})
    if lines:
        terminalreporter.write_sep("-", "boundaries covered by the generated property tests")
        for line in lines:
            terminalreporter.write_line(line)
