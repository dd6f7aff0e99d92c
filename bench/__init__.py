"""Benchmarks: `python -m bench` runs every bench/bench_*.py module's main(quick)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def load_average() -> str:
    """The machine's 1, 5 and 15-minute load averages (/proc/loadavg), e.g. "0.52 0.61 0.70"."""
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "unknown"


@dataclass
class Target:
    """One target a benchmark checked: what, the value it measured, the goal, and whether it was met."""

    bench: str
    what: str
    measured: str
    goal: str
    met: bool
    load: str | None = None  # the load average beside a result that needs a core to itself

    def line(self) -> str:
        core = f"  [needs a core to itself; load average {self.load}]" if self.load is not None else ""
        return f"{'met   ' if self.met else 'MISSED'}  {self.bench}: {self.what}: {self.measured} (target {self.goal}){core}"


# every target checked in this process, in order (`python -m bench` prints them all at the end)
TARGETS: list[Target] = []


def target(bench: str, what: str, measured: str, goal: str, met: bool, needs_core: bool = False) -> Target:
    """Record and print one target's result. `needs_core`: the figure depends on the benchmark having a core to
    itself (CPU per unit of work, ratios per CPU-second on a shared machine), so the load average is printed beside
    it."""
    t = Target(bench, what, measured, goal, bool(met), load_average() if needs_core else None)
    TARGETS.append(t)
    print("  " + t.line(), flush=True)
    return t


def write_section(name: str, markdown: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace this benchmark's section of docs/benchmarks.md (between its markers), or append it."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


class ServedApp:
    """The dashboard app on a real port in a thread (same process as the benchmark client)."""

    def __init__(self, db: Path) -> None:
        import socket
        import threading
        import time

        import uvicorn

        from synthwatch.app.main import create_app
        from synthwatch.settings import Settings

        app = create_app(str(db), Settings(db=str(db)))
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets whose proto says TCP; otherwise every
        # keep-alive response waits ~40 ms for a delayed ACK (Nagle), which `synthwatch serve` never does
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
