"""Result objects: one per request attempt and one per finished record (no exceptions escape)."""

from __future__ import annotations

import time
from collections import deque
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
    billed: tuple[int, int, int] = (0, 0, 0)  # (prompt, completion, estimated part): capture.token_count.billed_tokens
    # a request with n > 1 (samples_in_one_request): (choice index, its reading) of each choice that came
    choices: list[tuple[int, Any]] | None = None

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
    status: str  # ok | error | timeout | pending; "turn": an earlier turn stored already (series only)
    messages: list[dict[str, Any]] | dict[str, Any]  # a prompt with tools is {"messages", "tools"}
    extracted: Any = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    prior_attempts: int = 0  # attempts of the conversation's earlier turns (synthwatch.capture.turns)
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
    turns: list[dict[str, Any]] | None = None  # turns = "all": the finished turns before this one (already stored)
    # billed tokens (prompt, completion, estimated part): of every attempt this worker made for the record (its
    # columns), and of the attempt this outcome reports (the series; failed attempts come as AttemptFailure)
    billed: tuple[int, int, int] = (0, 0, 0)
    attempt_billed: tuple[int, int, int] = (0, 0, 0)
    # the record's columns, built once when the writer spooled a long text of it (workers/long_texts.py); the
    # parsed reply (extracted) is let go then
    columns: dict[str, Any] | None = None


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
    billed: tuple[int, int, int] = (0, 0, 0)  # what the attempt cost before it failed (a timeout mid-stream)


@dataclass
class LiveStats:
    """What the terminal progress line shows; updated by the worker, read once a second."""

    started: float = field(default_factory=time.monotonic)
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    retries: int = 0
    empty_reasoning: int = 0
    completion_tokens: int = 0
    attempt_timeouts: int = 0  # failed attempts by kind, for the concurrency tuner
    rate_limited: int = 0
    server_errors: int = 0
    recent: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=4096))
    latencies: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=4096))

    def count_ok(self, ex: Any, latency_s: float) -> int:
        """A finished request (a record, or one turn of a conversation) with its parsed reply; returns its
        completion tokens."""
        tokens = 0
        if ex is not None:
            usage = ex.usage if isinstance(ex.usage, dict) else {}
            tokens = usage.get("completion_tokens") or ex.n_chunks or 0
            if type(tokens) is not int or tokens < 0:  # a server's usage is not trusted
                tokens = 0
            if not ex.reasoning.strip():
                self.empty_reasoning += 1
        self.ok += 1
        self.completion_tokens += tokens
        self.record(True, tokens)
        if tokens:
            self.latencies.append((time.monotonic(), latency_s / tokens))  # seconds per output token
        return int(tokens)

    def record(self, ok: bool, tokens: int) -> None:
        self.recent.append((time.monotonic(), 1 if ok else 0, tokens))

    def rates(self, window_s: float = 30.0) -> tuple[float, float]:
        t = time.monotonic()
        span = min(window_s, max(t - self.started, 1e-3))
        n = tok = 0
        for ts, ok, tk in reversed(self.recent):
            if ts < t - span:
                break
            n += ok
            tok += tk
        return n / span, tok / span
