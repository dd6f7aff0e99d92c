"""Result objects: one per request attempt and one per finished record (no exceptions escape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Failure kinds. Retryable ones are transient server or network faults. The others: redirect (a 3xx, not
# followed), http_error (not a valid HTTP reply, or a 1xx as the final reply), bad_encoding (a compressed
# body that does not decompress), body_too_large / event_too_large / header_too_large (a configured limit,
# see LimitsConfig), internal_error (an exception anywhere in a record's processing: a bug, recorded on the
# record instead of escaping), http_<status> for other 4xx.
TIMEOUT_KINDS = frozenset({"timeout", "idle_timeout", "connect_timeout"})
RETRYABLE_KINDS = frozenset({
    "timeout", "idle_timeout", "connect_timeout", "connect", "dropped", "http_429", "http_5xx",
    "malformed", "error_body", "bad_content_type", "http_408",
})


@dataclass(slots=True)
class AttemptResult:
    ok: bool
    kind: str = ""  # "" when ok, else a failure kind
    status_code: int | None = None
    message: str = ""
    extracted: Any = None  # reasoning.Extracted, also kept (partial) on failures
    latency_s: float = 0.0
    ttft_s: float | None = None
    n_chunks: int = 0
    retry_after_s: float | None = None
    endpoint: str = ""

    def attempt_dict(self, n: int, started_at: float) -> dict[str, Any]:
        return {
            "n": n,
            "t": round(started_at, 3),
            "endpoint": self.endpoint,
            "ok": self.ok,
            "kind": self.kind or None,
            "status": self.status_code,
            "error": self.message[:2000] or None,
            "latency_s": round(self.latency_s, 4),
        }


@dataclass(slots=True)
class Outcome:
    """A record that reached a final state (ok / error / timeout) or went back to pending."""

    record_id: int
    idx: int
    status: str  # ok | error | timeout | pending
    messages: list[dict[str, Any]]
    extracted: Any = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    prior_attempts: int = 0
    error_kind: str | None = None
    error: str | None = None
    endpoint: str | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    n_chunks: int = 0
    finished_at: float = 0.0
    check_flags: int = 0
    check_json: str | None = None
    config_version: int | None = None  # the run's config version the request was made under
    rerun: bool = False  # the record was queued again by a re-run


@dataclass(slots=True)
class AttemptFailure:
    """A failed attempt, reported when it happens (retried or not) for live failure charts."""

    record_id: int
    endpoint: str
    kind: str
    status_code: int | None
    message: str
    t: float
    final: bool
    retried: bool
