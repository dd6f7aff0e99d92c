"""Endpoint pool: least outstanding requests, ejection of failing endpoints, probing them back.

An endpoint that fails ``eject_after_failures`` times in a row is taken out for ``eject_s``
(doubling on each repeat, up to ``eject_max_s``). When the time is up it gets one probe request;
success puts it back, failure ejects it again for longer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import EndpointConfig, EndpointPoolConfig


@dataclass
class Endpoint:
    label: str
    base_url: str
    url: str
    headers: dict[str, str]
    outstanding: int = 0
    ok: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    probing: bool = False
    last_error: str = ""
    eject_s: float = 0.0
    _latencies: list[float] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        t = time.monotonic()
        return {
            "label": self.label, "outstanding": self.outstanding, "ok": self.ok, "failed": self.failed,
            "consecutive_failures": self.consecutive_failures, "ejections": self.ejections,
            "ejected_for_s": round(max(0.0, self.ejected_until - t), 1), "last_error": self.last_error[:300],
        }


class MissingApiKey(Exception):
    pass


class EndpointPool:
    def __init__(self, configs: list[EndpointConfig], pool: EndpointPoolConfig) -> None:
        self.cfg = pool
        self.endpoints: list[Endpoint] = []
        for c in configs:
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
            if c.api_key_env:
                key = os.environ.get(c.api_key_env)
                if not key:
                    raise MissingApiKey(
                        f"endpoint {c.label}: environment variable {c.api_key_env} is not set (it should hold the API key)"
                    )
                if any(c in key for c in "\r\n\0"):
                    # sent as is, a line break would end the header and let the rest rewrite the request
                    raise MissingApiKey(f"endpoint {c.label}: environment variable {c.api_key_env} holds a line break"
                                        " or NUL character (the key is not shown)")
                headers["Authorization"] = f"Bearer {key}"
            self.endpoints.append(Endpoint(c.label, c.base_url, c.base_url + "/chat/completions", headers))

    def pick(self) -> Endpoint:
        """The available endpoint with the fewest outstanding requests.

        When every endpoint is ejected, the one coming back soonest is used anyway: waiting
        would stall the run, and its result decides whether it comes back."""
        t = time.monotonic()
        best: Endpoint | None = None
        for ep in self.endpoints:
            if ep.ejected_until > t:
                continue
            if ep.ejected_until and not ep.probing and ep.consecutive_failures:
                # ejection over: exactly one probe request decides
                ep.probing = True
                return ep
            if ep.probing:
                continue
            if best is None or ep.outstanding < best.outstanding:
                best = ep
        if best is None:
            best = min(self.endpoints, key=lambda e: (e.ejected_until, e.outstanding))
        return best

    def success(self, ep: Endpoint) -> None:
        ep.ok += 1
        ep.consecutive_failures = 0
        ep.probing = False
        ep.ejected_until = 0.0
        ep.eject_s = 0.0

    def failure(self, ep: Endpoint, message: str, *, server_fault: bool = True) -> None:
        ep.failed += 1
        ep.last_error = message
        if not server_fault:
            return
        ep.consecutive_failures += 1
        if ep.probing or ep.consecutive_failures >= self.cfg.eject_after_failures:
            ep.eject_s = min(self.cfg.eject_max_s, ep.eject_s * 2 if ep.eject_s else self.cfg.eject_s)
            ep.ejected_until = time.monotonic() + ep.eject_s
            ep.ejections += 1
            ep.probing = False

    def abandon(self, ep: Endpoint) -> None:
        """A request cancelled before its result: a probe in flight must not block the endpoint."""
        ep.probing = False

    def outstanding(self) -> dict[str, int]:
        return {ep.label: ep.outstanding for ep in self.endpoints}

    def public(self) -> list[dict[str, Any]]:
        return [ep.public() for ep in self.endpoints]
