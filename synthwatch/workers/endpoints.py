"""Endpoint pool: least outstanding requests, ejection of failing endpoints, probing them back.

An endpoint that fails ``eject_after_failures`` times in a row is taken out for ``eject_s``
(doubling on each repeat, up to ``eject_max_s``). When the time is up it gets one probe request;
success puts it back, failure ejects it again for longer.

Rate limiting is not failure: a 429 or 503 makes that endpoint back off (for the server's Retry-After, in
seconds or as an HTTP date, or exponentially from 1 s), then start slowly (one request at a time, twice as
many after each success); meanwhile the other endpoints keep their pace, and a request waits only when every
endpoint is backing off.
"""

from __future__ import annotations

import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..config import EndpointConfig, EndpointPoolConfig, TLSConfig
from ..outbound import env_proxy
from ..redact import SecretError, secret_from_env

RATE_LIMIT_BASE_S = 1.0  # backoff after a 429/503 without Retry-After, doubling while they go on ...
RATE_LIMIT_MAX_S = 60.0  # ... up to this
SLOW_START_MAX = 1024  # a slow-start window this large is no limit any more
SLOW_START_POLL_S = 0.05


@dataclass
class Endpoint:
    label: str
    base_url: str
    url: str
    headers: dict[str, str]
    ssl: ssl.SSLContext | bool = True  # what the HTTP client verifies https with (True: the system's CAs)
    proxy: str | None = None  # from the environment (HTTP(S)_PROXY, NO_PROXY), read at start-up
    proxy_headers: dict[str, str] | None = None
    outstanding: int = 0
    ok: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    probing: bool = False
    last_error: str = ""
    eject_s: float = 0.0
    # rate limiting (429, 503): a backoff honouring Retry-After, then a slow start (window doubles per success)
    backoff_until: float = 0.0  # monotonic
    backoff_until_wall: float = 0.0  # the same moment, wall clock (shown as HH:MM:SS)
    window: int = 0  # most requests outstanding during the slow start (0: no limit)
    limited: int = 0  # 429 / 503 answers
    consecutive_limits: int = 0
    # the concurrency tuner (workers/autotune.py): this endpoint's own limit (0: none) and what it looks at
    limit: int = 0
    outstanding_max: int = 0
    n_timeouts: int = 0
    n_server_errors: int = 0
    done: deque[tuple[float, int, float | None]] = field(default_factory=lambda: deque(maxlen=4096))
    _latencies: list[float] = field(default_factory=list)

    def state(self, t: float) -> str:
        if self.ejected_until > t:
            return "ejected"
        if self.backoff_until > t:
            return "backing off until " + time.strftime("%H:%M:%S", time.localtime(self.backoff_until_wall))
        if self.window:
            return f"slow start ({self.window} at once)"
        return "normal"

    def public(self) -> dict[str, Any]:
        t = time.monotonic()
        return {
            "label": self.label, "outstanding": self.outstanding, "ok": self.ok, "failed": self.failed,
            "consecutive_failures": self.consecutive_failures, "ejections": self.ejections,
            "ejected_for_s": round(max(0.0, self.ejected_until - t), 1), "last_error": self.last_error[:300],
            "state": self.state(t), "rate_limited": self.limited,
            "backoff_for_s": round(max(0.0, self.backoff_until - t), 1), "window": self.window,
            "limit": self.limit,
        }


class MissingApiKey(Exception):
    """An endpoint's key, header value or TLS file is missing or unusable: the run cannot start.

    The message names the environment variable or file, never a secret value."""


def _secret_from_env(label: str, env: str, what: str) -> str:
    try:
        return secret_from_env(env, what)  # registered for redaction before anything can print it
    except SecretError as exc:
        raise MissingApiKey(f"endpoint {label}: {exc}") from None


def ssl_context(label: str, tls: TLSConfig) -> ssl.SSLContext:
    """The TLS settings of one endpoint; made once, at start-up (a missing file stops the run there)."""
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_bundle)
        if tls.client_cert:
            ctx.load_cert_chain(tls.client_cert, tls.client_key)
    except (OSError, ssl.SSLError) as exc:
        raise MissingApiKey(f"endpoint {label}: TLS settings: {exc.__class__.__name__}: {exc}") from None
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class EndpointPool:
    def __init__(self, configs: list[EndpointConfig], pool: EndpointPoolConfig) -> None:
        self.cfg = pool
        self.endpoints: list[Endpoint] = []
        for c in configs:
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
            if c.api_key_env:
                headers["Authorization"] = "Bearer " + _secret_from_env(c.label, c.api_key_env, "the API key")
            for name, env in c.headers_env.items():
                headers[name] = _secret_from_env(c.label, env, f"the value of header {name}")
            tls: ssl.SSLContext | bool = True
            if c.base_url.startswith("https:"):
                tls = ssl_context(c.label, c.tls)
            url = c.base_url + "/chat/completions"
            proxy, proxy_headers = env_proxy(url)
            if proxy_headers and not url.startswith("https:"):
                # a plain-http request goes to the proxy itself (absolute form): it carries the credentials;
                # an https one tunnels through CONNECT, which aiohttp sends with proxy_headers
                headers.update(proxy_headers)
                proxy_headers = None
            self.endpoints.append(Endpoint(c.label, c.base_url, url, headers, tls, proxy, proxy_headers))

    def pick(self) -> Endpoint:
        """The available endpoint with the fewest outstanding requests.

        When every endpoint is ejected, the one coming back soonest is used anyway: waiting
        would stall the run, and its result decides whether it comes back."""
        t = time.monotonic()
        best: Endpoint | None = None
        for ep in self.endpoints:
            if ep.ejected_until > t or not self._open(ep, t):
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
            best = min(self.endpoints, key=lambda e: (e.ejected_until, e.backoff_until, e.outstanding))
        return best

    @staticmethod
    def _open(ep: Endpoint, t: float) -> bool:
        """Not backing off, within its slow-start window and within its tuned limit."""
        return (ep.backoff_until <= t and not (ep.window and ep.outstanding >= ep.window)
                and not (ep.limit and ep.outstanding >= ep.limit))

    def wait_s(self) -> float:
        """How long until some endpoint takes a request (0: one does now). Only rate limiting makes a request
        wait: an ejected endpoint still gets its probe."""
        t = time.monotonic()
        if any(self._open(ep, t) for ep in self.endpoints):
            return 0.0
        backing = [ep.backoff_until - t for ep in self.endpoints if ep.backoff_until > t]
        if len(backing) == len(self.endpoints):
            return max(0.0, min(backing))
        return SLOW_START_POLL_S  # every open endpoint is at its slow-start window: a slot frees soon

    def rate_limited(self, ep: Endpoint, retry_after_s: float | None) -> float:
        """A 429 or 503: the endpoint backs off (Retry-After when the server gave one, else exponentially) and
        then starts slowly; the other endpoints keep their pace. Returns the backoff in seconds."""
        ep.limited += 1
        ep.consecutive_limits += 1
        wait = retry_after_s if retry_after_s is not None else min(
            RATE_LIMIT_MAX_S, RATE_LIMIT_BASE_S * 2 ** min(ep.consecutive_limits - 1, 10))
        until = time.monotonic() + wait
        if until > ep.backoff_until:
            ep.backoff_until, ep.backoff_until_wall = until, time.time() + wait
        ep.window = 1
        return wait

    def success(self, ep: Endpoint) -> None:
        if ep.window:  # slow start: twice as many at once after each success, until no limit is left
            ep.window = 0 if ep.window >= SLOW_START_MAX else ep.window * 2
        ep.consecutive_limits = 0
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
