"""Alarm notifications for runs nobody is watching: a terminal line and an optional webhook.

The webhook is POSTed (JSON) from a background thread fed by a bounded queue with a short
timeout, so a slow or dead receiver never blocks the writer thread; when the queue is full the
notification is dropped and counted (the alarm itself is in the database either way).
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger("synthwatch.alarms")


class Notifier:
    def __init__(self, url: str | None, *, timeout_s: float = 5.0, max_queue: int = 100) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, payload: dict[str, Any]) -> None:
        """Log the alarm on the worker's terminal and queue the webhook (never blocks)."""
        a = payload.get("alarm", {})
        run = payload.get("run", {})
        verb = "AUTO-PAUSED" if payload.get("event") == "auto_pause" else "ALARM"
        log.warning(
            "%s run %r: %s. %s Fix: %s%s", verb, run.get("name"), a.get("title"), a.get("message"), a.get("fix"),
            f" Example: {payload['example_link']}" if payload.get("example_link") else "",
        )
        if not self.url:
            return
        self._ensure_thread()
        try:
            self._q.put_nowait(payload)
        except queue.Full:
            self.dropped += 1
            log.warning("webhook queue full: notification for %r dropped", a.get("rule"))

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                first = self._thread is None
                self._thread = threading.Thread(target=self._main, name="synthwatch-webhook", daemon=True)
                self._thread.start()
                if first:  # a worker that exits right after an alarm still delivers it (up to 2 s)
                    atexit.register(self.close)

    def _main(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            self._post(item)

    def _post(self, payload: dict[str, Any]) -> None:
        assert self.url is not None
        body = json.dumps(payload).encode()
        req = urllib.request.Request(
            self.url, data=body, method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "synthwatch-alarms"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 (http(s) checked)
                resp.read(1024)
            self.sent += 1
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failed += 1
            log.warning("webhook %s failed: %s", self.url, exc)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (up to timeout_s), then stop the thread."""
        if self._thread is None:
            return
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)
