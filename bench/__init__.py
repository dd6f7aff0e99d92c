"""Benchmarks: `python -m bench` runs every bench/bench_*.py module's main(quick)."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


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
