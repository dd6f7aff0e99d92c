"""What a worker writes besides the record rows: a reply's record columns, and the time series (per-interval
counters of one writer, upserted per bucket into ``series``). Used by the worker's writer and by ``watch``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..capture.safety import MAX_COUNT
from ..capture.token_count import completion_count, reasoning_count
from ..store import queue as store
from .refusals import NUL_STAND_IN, refusal_reason, refuse
from .results import TIMEOUT_KINDS, AttemptFailure, Outcome
from .sketch import TPS_MIN, Sketch

SERIES_WIDTH_S = 5
_SERIES_COUNTERS = (
    "finished", "ok", "errors", "timeouts", "attempts_failed", "attempt_timeouts", "retries", "dropped",
    "http_429", "http_4xx", "http_5xx", "other_errors", "cancelled", "prompt_tokens", "completion_tokens",
    "reasoning_tokens", "content_tokens", "chunks", "empty_reasoning", "finish_length", "reasoning_estimated",
    "billed_prompt_tokens", "billed_completion_tokens", "billed_estimated",
)


@dataclass
class Bucket:
    run_id: int
    worker_id: int
    endpoint: str
    t: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SERIES_COUNTERS, 0))
    latency_sum: float = 0.0
    lat: Sketch = field(default_factory=Sketch)
    ttft: Sketch = field(default_factory=Sketch)
    tps: Sketch = field(default_factory=lambda: Sketch(TPS_MIN))
    sources: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    concurrency: int = 0


def _usage_int(usage: dict[str, Any] | None, key: str, sub: str | None = None) -> int | None:
    if not isinstance(usage, dict):
        return None
    v = usage.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    # a count outside 0..MAX_COUNT is impossible: capture recorded it as a problem; it is not stored as a number
    return v if type(v) is int and 0 <= v <= MAX_COUNT else None


_EXTRACTED_COLS = (
    "reasoning", "content", "reasoning_source", "reasoning_len", "content_len", "finish_reason", "prompt_tokens",
    "completion_tokens", "reasoning_tokens", "reasoning_tokens_source", "usage_json", "token_ids_json", "model",
    "system_fingerprint", "response_id", "extra_json", "logprobs_json",
)


def record_columns(ex: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record columns from a parsed response (synthwatch.capture.reasoning.Extracted), None -> all empty.

    ``extra`` is merged into the stored raw fields (e.g. where an ingested line came from)."""
    if ex is None:
        cols: dict[str, Any] = dict.fromkeys(_EXTRACTED_COLS)
        cols["content_null"] = False
        if extra:
            cols["extra_json"] = orjson.dumps(extra, option=orjson.OPT_NON_STR_KEYS).decode()
        return cols
    usage = ex.usage if isinstance(ex.usage, dict) else None
    # the same count as the time series' (SeriesAccumulator._add_one): the column, the API totals and the per-version sums agree
    reasoning, reasoning_source = reasoning_count(ex, completion_count(ex)[1])
    token_ids = None
    if ex.token_ids is not None or ex.prompt_token_ids is not None:
        token_ids = orjson.dumps({"prompt": ex.prompt_token_ids, "completion": ex.token_ids}).decode()
    raw = dict(extra) if extra else {}
    raw.update(ex.extra or {})
    if ex.unread_fields:
        raw["unread_fields"] = ex.unread_fields
    if ex.duplicate_fields:
        raw["duplicate_fields"] = ex.duplicate_fields
    if ex.problems:
        raw["problems"] = ex.problems
    if ex.raw_content is not None:
        raw["raw_content"] = ex.raw_content
    cols = {
        "reasoning": ex.reasoning, "content": ex.content, "content_null": ex.content_was_null,
        "reasoning_source": ex.reasoning_source, "reasoning_len": len(ex.reasoning),
        "content_len": len(ex.content), "finish_reason": ex.finish_reason,
        "prompt_tokens": _usage_int(usage, "prompt_tokens"),
        "completion_tokens": _usage_int(usage, "completion_tokens"),
        "reasoning_tokens": reasoning, "reasoning_tokens_source": reasoning_source,
        "usage_json": orjson.dumps(usage).decode() if usage is not None else None,
        "token_ids_json": token_ids, "model": ex.model, "system_fingerprint": ex.system_fingerprint,
        "response_id": ex.response_id, "logprobs_json": ex.logprobs,
    }
    # written out rather than a loop over the columns: this runs for every record (a generator cost ~3 us)
    fr, model, fp, rid = ex.finish_reason, ex.model, ex.system_fingerprint, ex.response_id
    if "\x00" in ex.reasoning or "\x00" in ex.content or fr is not None and "\x00" in fr \
            or model is not None and "\x00" in model or fp is not None and "\x00" in fp \
            or rid is not None and "\x00" in rid:
        _nul_safe(cols, raw)
    cols["extra_json"] = orjson.dumps(raw, option=orjson.OPT_NON_STR_KEYS).decode() if raw else None
    return cols


_SHORT_TEXT_COLS = ("finish_reason", "model", "system_fingerprint", "response_id")


def _nul_safe(cols: dict[str, Any], raw: dict[str, Any]) -> None:
    """Text a backend cannot hold (NUL: PostgreSQL text refuses it) stored the same way on every backend: the
    column gets U+2400 (␀, the symbol for NUL) in its place, and the exact text goes into extra_json.nul_text
    (JSON escapes it as
    \\u0000, so it round-trips), with a problem saying so (docs/limits.md)."""
    exact: dict[str, str] = {}
    for k in ("reasoning", "content", *_SHORT_TEXT_COLS):
        v = cols[k]
        if v is not None and "\x00" in v:
            exact[k] = v
            cols[k] = v.replace("\x00", NUL_STAND_IN)
    raw["nul_text"] = exact
    raw["problems"] = [*raw.get("problems", ()), f"NUL characters in {', '.join(exact)}: stored as U+2400 (␀);"
                       " the exact text is in extra_json.nul_text"]


class SeriesAccumulator:
    """Per-interval counters of one writer (run, worker), upserted per bucket into ``series``.

    The worker keeps recent buckets in memory; a watcher, whose records may carry old timestamps
    and which may restart, seeds the buckets it touches from their stored rows first (``load``)."""

    def __init__(self, run_id: int, worker_id: int) -> None:
        self.run_id = run_id
        self.worker_id = worker_id
        self.buckets: dict[tuple[str, int], Bucket] = {}

    def bucket(self, endpoint: str, t: float) -> Bucket:
        bt = int(t // SERIES_WIDTH_S) * SERIES_WIDTH_S
        key = (endpoint, bt)
        b = self.buckets.get(key)
        if b is None:
            b = Bucket(self.run_id, self.worker_id, endpoint, bt)
            self.buckets[key] = b
        return b

    def load(self, conn: Connection, keys: set[tuple[str, int]]) -> None:
        """Replace the in-memory buckets by the stored rows for these (endpoint, bucket start) keys."""
        self.buckets = {k: Bucket(self.run_id, self.worker_id, k[0], k[1]) for k in keys}
        ts = sorted({k[1] for k in keys})
        for chunk in store.int_lists(ts):
            for row in conn.execute(
                text(f"SELECT * FROM series WHERE run_id = :r AND worker_id = :w AND t IN ({chunk})"),
                {"r": self.run_id, "w": self.worker_id},
            ).mappings():
                b = self.buckets.get((row["endpoint"], row["t"]))
                if b is None:
                    continue
                for c in _SERIES_COUNTERS:
                    b.counts[c] = row[c] or 0
                b.latency_sum = row["latency_sum"] or 0.0
                b.lat.merge_text(row["lat_hist"])
                b.ttft.merge_text(row["ttft_hist"])
                b.tps.merge_text(row["tps_hist"])
                b.sources = orjson.loads(row["sources_json"] or "{}")
                b.inflight, b.concurrency = row["inflight"] or 0, row["concurrency"] or 0

    def add(self, outcomes: list[Outcome], failures: list[AttemptFailure]) -> dict[tuple[str, int], Bucket]:
        touched: dict[tuple[str, int], Bucket] = {}
        for o in outcomes:
            try:
                self._add_one(o, touched)
            except Exception as exc:  # one record's values: that record is refused, the others are counted
                refuse(o, refusal_reason(exc, "adding it to the time series"))
        for f in failures:
            b = self.bucket(f.endpoint, f.t)
            touched[(b.endpoint, b.t)] = b
            c = b.counts
            c["attempts_failed"] += 1
            bp, bc, be = f.billed  # a failed attempt's tokens are billed too (a timeout half-way, a dropped stream)
            c["billed_prompt_tokens"] += bp
            c["billed_completion_tokens"] += bc
            c["billed_estimated"] += be
            if f.retried:
                c["retries"] += 1
            k = f.kind
            if k in TIMEOUT_KINDS:
                c["attempt_timeouts"] += 1
            elif k == "dropped":
                c["dropped"] += 1
            elif k == "http_429":
                c["http_429"] += 1
            elif k == "http_5xx":
                c["http_5xx"] += 1
            elif k.startswith("http_"):
                c["http_4xx"] += 1
            else:
                c["other_errors"] += 1
        return touched

    def _add_one(self, o: Outcome, touched: dict[tuple[str, int], Bucket]) -> None:
        b = self.bucket(o.endpoint or "", o.finished_at)
        touched[(b.endpoint, b.t)] = b
        c = b.counts
        if o.status == "pending":
            c["cancelled"] += 1
            return
        # an earlier turn of a conversation (synthwatch.capture.turns) adds its tokens and timing; the record's
        # counters (finished, ok, per-record shares) count its last turn only
        turn = o.status == "turn"
        if not turn:
            c["finished"] += 1
            if o.status == "ok":
                c["ok"] += 1
            elif o.status == "timeout":
                c["timeouts"] += 1
            else:
                c["errors"] += 1
        bp, bc, be = o.attempt_billed  # the ok attempt's (a failed one's came as an AttemptFailure)
        c["billed_prompt_tokens"] += bp
        c["billed_completion_tokens"] += bc
        c["billed_estimated"] += be
        ex = o.extracted
        if ex is not None and (o.status == "ok" or turn):
            p, comp, _counted = completion_count(ex)
            r, r_src = reasoning_count(ex, comp)
            c["prompt_tokens"] += p
            c["completion_tokens"] += comp
            c["reasoning_tokens"] += r
            c["content_tokens"] += comp - r
            if r_src == "estimate":
                c["reasoning_estimated"] += r
            c["chunks"] += ex.n_chunks
            if not turn:
                if not ex.reasoning.strip():
                    c["empty_reasoning"] += 1
                if ex.finish_reason == "length":
                    c["finish_length"] += 1
                src = ex.reasoning_source or "none"
                b.sources[src] = b.sources.get(src, 0) + 1
            if o.latency_s is not None:
                b.latency_sum += o.latency_s
                b.lat.add(o.latency_s)
                gen_s = o.latency_s - (o.ttft_s or 0.0)
                if comp and gen_s > 0:
                    b.tps.add(comp / gen_s)
            if o.ttft_s is not None:
                b.ttft.add(o.ttft_s)

    def forget_before(self, t: float) -> None:
        for key in [k for k, v in self.buckets.items() if v.t < t]:
            del self.buckets[key]

    def write(self, conn: Connection, buckets: list[Bucket]) -> None:
        if not buckets:
            return
        rows = []
        for b in buckets:
            row: dict[str, Any] = dict(b.counts)
            row.update({
                "run_id": b.run_id, "worker_id": b.worker_id, "endpoint": b.endpoint, "t": b.t,
                "width_s": SERIES_WIDTH_S, "inflight": b.inflight, "concurrency": b.concurrency,
                "latency_sum": b.latency_sum, "lat_hist": b.lat.to_text(), "ttft_hist": b.ttft.to_text(),
                "tps_hist": b.tps.to_text(), "sources_json": orjson.dumps(b.sources).decode(),
            })
            rows.append(row)
        conn.execute(_SERIES_UPSERT, rows)


_SERIES_COLS = (
    "run_id", "worker_id", "endpoint", "t", "width_s", *_SERIES_COUNTERS, "inflight", "concurrency",
    "latency_sum", "lat_hist", "ttft_hist", "tps_hist", "sources_json",
)
_SERIES_UPSERT = text(
    f"INSERT INTO series ({', '.join(_SERIES_COLS)}) VALUES ({', '.join(':' + c for c in _SERIES_COLS)})"
    " ON CONFLICT (run_id, worker_id, endpoint, t) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SERIES_COLS[4:])
)
