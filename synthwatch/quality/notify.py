"""Alarm notifications for runs nobody is watching: a terminal line and an optional webhook.

The webhook is POSTed (JSON) from a background thread fed by a bounded queue, through the outbound client
(synthwatch/outbound.py: a total deadline of ``timeout_s`` per post, a bounded read of the reply, no
~/.netrc), so a slow or dead receiver never blocks the writer thread; when the queue is full the
notification is dropped and counted (the alarm itself is in the database either way).
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
from typing import Any

from ..outbound import OutboundError, fetch, register, run_sync, session

log = logging.getLogger("synthwatch.alarms")
MAX_REPLY_BYTES = 64 * 1024  # of a webhook receiver's reply read (and ignored)


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
        error = post_webhook(self.url, payload, self.timeout_s)
        if error is None:
            self.sent += 1
        else:
            self.failed += 1
            log.warning("webhook %s failed: %s", self.url, error)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (up to timeout_s), then stop the thread."""
        if self._thread is None:
            return
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)


def post_webhook(url: str, payload: dict[str, Any], timeout_s: float) -> str | None:
    """POST ``payload`` as JSON to ``url``, ended within ``timeout_s`` in all; None when the receiver took it (2xx),
    else why not (redacted). Never raises."""
    if not url.startswith(("http://", "https://")):
        return "the webhook URL is not http(s)"

    async def go() -> str | None:
        async with session("webhook") as sess:
            r = await fetch(sess, "POST", url, cap=MAX_REPLY_BYTES, deadline_s=timeout_s,
                            body=json.dumps(payload).encode(),
                            headers={"Content-Type": "application/json", "User-Agent": "synthwatch-alarms"})
        return None if 200 <= r.status < 300 else f"HTTP {r.status}: {r.quoted(200)}"

    try:
        return run_sync(go())
    except OutboundError as exc:
        return exc.message
    except Exception as exc:  # never out of the webhook thread
        return OutboundError("internal_error", f"{type(exc).__name__}: {exc}").message


@register("webhook", "alarm webhooks (quality/notify.py), POSTed from a thread of their own", 6.0)
def _drive_webhook(base_url: str, key_env: str) -> str:
    return post_webhook(base_url + "/hook", {"event": "alarm", "alarm": {"rule": "x"}}, 5.0) or "sent"
