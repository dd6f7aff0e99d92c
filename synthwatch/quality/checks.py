"""Per-record data-quality checks, their live run-level rates, and the writer hook that raises alarms.

Every final record (ok / error / timeout) goes through :class:`RecordChecker` when it is stored:
cheap string checks only (the worker writes thousands of records per second). The result is a
bitmask (``record.check_flags``, bit ``1 << CHECK_NAMES.index(name)``) and, for records that fail
something, ``record.check_json`` = ``{check_name: details}``.

:class:`ChecksHook` plugs into the worker's single writer thread (``WriterHook``): it keeps a
rolling window per check in memory, adds whole-run counts to ``check_stat`` inside the writer's
transaction (the dashboard reads those rows, never the records), and lets
:class:`synthwatch.quality.alarms.AlarmKeeper` raise alarms and auto-pause the run.

Bounded-cost decisions (documented in docs/checks.md):

- repetition looks at the last ``repetition_tail_chars`` characters of the reasoning and of the
  content only: one ``rfind`` and one slice comparison per candidate period;
- duplicates: an in-memory map of hashes of the output (reasoning + content, stripped), at most
  ``duplicate_max_tracked`` entries; on resume it is seeded from the last
  ``duplicate_resume_records`` ok records only, and several workers of one run do not see each
  other's outputs (``synthwatch checks RUN --recompute`` scans the whole run);
- tokenizer checks (template keeps the reasoning: once per run; token count vs usage: 1 in
  ``token_sample_every`` ok records) run in a background thread, never in the writer;
- rolling windows live in memory: a resumed worker starts them empty (whole-run counts persist).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..capture.turns import load as load_turns
from ..check_catalog import BIT, CHECK_INFO, CHECK_NAMES, CheckSettings, Rule
from ..config import ConfigError, format_validation_error
from ..store import queue as store
from .alarms import AlarmKeeper, effective_rules
from .notify import Notifier

log = logging.getLogger("synthwatch.checks")

CANARY_SOURCE_PREFIX = "synthwatch-canary:"


class ChecksConfigError(ConfigError):
    pass


# ------------------------------------------------------------------------------------ settings


def parse_settings(raw: dict[str, Any] | None, source: str = "run config") -> CheckSettings:
    """Validate a `[checks]` table; the error names the key (checks.rules.x.threshold: ...)."""
    try:
        return CheckSettings.model_validate(raw or {})
    except ValidationError as exc:
        msg = format_validation_error(exc, source).replace("\n  ", "\n  checks.")
        raise ChecksConfigError(msg) from None


@dataclass(slots=True)
class RunContext:
    """What the checks need to know about a run (from its stored config snapshot)."""

    run_id: int
    name: str
    expects: bool = True
    mode: str = "auto"
    think_open: str = "<think>"
    think_close: str = "</think>"
    tokenizer: dict[str, Any] | None = None
    settings: CheckSettings = field(default_factory=lambda: CheckSettings.model_validate({}))
    webhook_url: str | None = None

    @classmethod
    def from_config(cls, run_id: int, name: str, cfg: dict[str, Any], source: str = "run config") -> RunContext:
        r = cfg.get("reasoning") or {}
        return cls(
            run_id=run_id, name=name, expects=bool(r.get("expect", True)), mode=str(r.get("mode") or "auto"),
            think_open=r.get("think_open", "<think>") or "", think_close=r.get("think_close", "</think>") or "",
            tokenizer=cfg.get("tokenizer") or None, settings=parse_settings(cfg.get("checks"), source),
            webhook_url=cfg.get("webhook_url"),
        )

    @property
    def notify_url(self) -> str | None:
        return self.settings.webhook.url or self.webhook_url


# ------------------------------------------------------------------------------------ one record


@dataclass(slots=True)
class RecordView:
    record_id: int
    idx: int
    status: str
    reasoning: str = ""
    content: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    unread_fields: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    system_fingerprint: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt_json: str | None = None
    endpoint: str | None = None

    def prompt_messages(self) -> list[dict[str, Any]]:
        if self.messages is None:
            self.messages = orjson.loads(self.prompt_json) if self.prompt_json else []
        return self.messages


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def view_from_outcome(o: Any) -> RecordView:
    ex = o.extracted
    if ex is None:
        return RecordView(o.record_id, o.idx, o.status, messages=o.messages, endpoint=o.endpoint)
    usage = ex.usage if isinstance(ex.usage, dict) else {}
    details = usage.get("completion_tokens_details")
    return RecordView(
        o.record_id, o.idx, o.status, ex.reasoning or "", ex.content or "", ex.finish_reason,
        _int_or_none(usage.get("completion_tokens")),
        _int_or_none(details.get("reasoning_tokens")) if isinstance(details, dict) else None,
        ex.unread_fields or {}, ex.model, ex.system_fingerprint, o.messages, endpoint=o.endpoint,
    )


def view_from_row(r: Any) -> RecordView:
    unread: dict[str, str] = {}
    if r["extra_json"]:
        try:
            extra = orjson.loads(r["extra_json"])
            unread = extra.get("unread_fields") or {} if isinstance(extra, dict) else {}
        except orjson.JSONDecodeError:
            unread = {}
    return RecordView(
        r["id"], r["idx"], r["status"], r["reasoning"] or "", r["content"] or "", r["finish_reason"],
        r["completion_tokens"], r["reasoning_tokens"], unread, r["model"], r["system_fingerprint"],
        prompt_json=r["prompt_json"], endpoint=r["endpoint"],
    )


def looping_period(text: str, min_chars: int, min_repeats: int, tail_chars: int, needle: int = 32) -> int | None:
    """Period of a block repeated at least min_repeats times (covering >= min_chars) at the end of text."""
    s = text[-tail_chars:].rstrip() if len(text) > tail_chars else text.rstrip()
    n = len(s)
    if n < min_chars or n < needle * 2:
        return None
    nd = s[-needle:]
    end = n - 1
    for _ in range(3):  # the nearest earlier occurrences of the tail are the candidate periods
        pos = s.rfind(nd, 0, end)
        if pos < 0:
            return None
        p = n - needle - pos
        span = max(min_repeats * p, min_chars)
        if span > n:
            return None
        seg = s[n - span:]
        if seg[:-p] == seg[p:]:
            return p
        end = pos + needle - 1
    return None


def output_hash(reasoning: str, content: str) -> int:
    """Hash of the output, leading/trailing whitespace ignored (Python's str hash: C speed, cached).

    Randomised per process, which is fine: the map lives in one process and a resumed worker
    re-hashes the records it seeds from."""
    return hash((reasoning.strip(), content.strip()))


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role", "user") == "user":
            c = m.get("content")
            return c.strip() if isinstance(c, str) else ""
    return ""


class RecordChecker:
    """Runs the per-record checks; holds the little state some need (duplicates, drift baseline)."""

    def __init__(self, ctx: RunContext) -> None:
        self.dups: dict[int, int] = {}
        # per endpoint: a pool of servers of different versions is not drift; a change on one server is
        self.baseline: dict[str, tuple[str | None, str | None]] = {}
        self.set_context(ctx)

    def set_context(self, ctx: RunContext) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.enabled = 0
        for name in CHECK_NAMES:
            if name not in s.disabled:
                self.enabled |= BIT[name]
        self.canaries = {c.prompt.strip(): c.answer for c in s.canary.prompts} if s.canary.every_n else {}
        self.tags = tuple(t for t in (ctx.think_open, ctx.think_close) if t)

    def remember(self, record_id: int, reasoning: str, content: str) -> None:
        if len(reasoning) + len(content) >= self.ctx.settings.duplicate_min_chars:
            self.dups.setdefault(output_hash(reasoning, content), record_id)

    def check(self, v: RecordView) -> tuple[int, int, dict[str, Any]]:
        """(applied bits, failed bits, details of the failed checks)."""
        en = self.enabled
        applied = en & (BIT["timeout"] | BIT["error"])
        failed = 0
        det: dict[str, Any] = {}
        if v.status == "timeout":
            failed |= BIT["timeout"]
        elif v.status == "error":
            failed |= BIT["error"]
        if v.status != "ok":
            return applied, failed & en, det
        s = self.ctx.settings
        r, c = v.reasoning, v.content
        # what `not x.strip()` says, without copying a long text that ends in a newline
        r_empty, c_empty = not r or r.isspace(), not c or c.isspace()
        truncated = v.finish_reason == "length"
        ct = v.completion_tokens
        if self.ctx.expects:
            applied |= BIT["empty_reasoning"]
            if r_empty:
                failed |= BIT["empty_reasoning"]
        applied |= BIT["empty_content"] | BIT["both_empty_with_tokens"] | BIT["truncated"] | BIT[
            "truncated_in_reasoning"] | BIT["think_tags_in_content"] | BIT["field_mismatch"] | BIT["repetition"]
        if c_empty and not truncated:
            failed |= BIT["empty_content"]
        if r_empty and c_empty and ct:
            failed |= BIT["both_empty_with_tokens"]
            det["both_empty_with_tokens"] = {"completion_tokens": ct}
        if truncated:
            failed |= BIT["truncated"]
            if c_empty and not r_empty:
                failed |= BIT["truncated_in_reasoning"]
        # a one-character scan (memchr) first: searching a long text for a whole tag costs ~20x more
        if self.tags and c and any(t[0] in c and t in c for t in self.tags):
            failed |= BIT["think_tags_in_content"]
            det["think_tags_in_content"] = {"tags": [t for t in self.tags if t in c]}
        unread = {k: len(t) for k, t in v.unread_fields.items() if isinstance(t, str) and t.strip()}
        if unread:
            failed |= BIT["field_mismatch"]
            det["field_mismatch"] = {"fields": sorted(unread), "chars": unread, "mode": self.ctx.mode}
        if v.reasoning_tokens is not None:
            applied |= BIT["reasoning_tokens_no_text"]
            if v.reasoning_tokens > 0 and r_empty:
                failed |= BIT["reasoning_tokens_no_text"]
                det["reasoning_tokens_no_text"] = {"reasoning_tokens": v.reasoning_tokens}
        if en & BIT["repetition"]:
            for name, t in (("reasoning", r), ("content", c)):
                p = looping_period(t, s.repetition_min_chars, s.repetition_min_repeats, s.repetition_tail_chars)
                if p is not None:
                    failed |= BIT["repetition"]
                    det["repetition"] = {"field": name, "period_chars": p, "sample": t.rstrip()[-min(p, 120):]}
                    break
        prompt = _last_user_text(v.prompt_messages()) if self.canaries else ""
        answer = self.canaries.get(prompt) if prompt else None
        if answer is not None:
            applied |= BIT["canary_failed"]
            why = None
            if r_empty:
                why = "no reasoning"
            elif answer not in c:
                why = f"the answer does not contain {answer!r}"
            if why:
                failed |= BIT["canary_failed"]
                det["canary_failed"] = {"why": why, "prompt": prompt[:200], "expected": answer}
        # canaries repeat the same prompts on purpose: their answers are not duplicates
        if en & BIT["duplicate_output"] and answer is None and len(r) + len(c) >= s.duplicate_min_chars:
            applied |= BIT["duplicate_output"]
            h = output_hash(r, c)
            first = self.dups.get(h)
            if first is None:
                if len(self.dups) < s.duplicate_max_tracked:
                    self.dups[h] = v.record_id
            elif first != v.record_id:
                failed |= BIT["duplicate_output"]
                det["duplicate_output"] = {"same_as": first}
        if v.model is not None or v.system_fingerprint is not None:
            applied |= BIT["server_drift"]
            now = (v.model, v.system_fingerprint)
            ep = v.endpoint or ""
            base = self.baseline.get(ep)
            if base is not None and base != now:
                fld = "model" if base[0] != now[0] else "system_fingerprint"
                i = 0 if fld == "model" else 1
                failed |= BIT["server_drift"]
                det["server_drift"] = {"field": fld, "from": base[i], "to": now[i], "record_id": v.record_id,
                                       "idx": v.idx, "endpoint": v.endpoint}
            self.baseline[ep] = now
        applied &= en
        failed &= applied
        if det:
            det = {k: d for k, d in det.items() if failed & BIT[k]}
        return applied, failed, det


# ------------------------------------------------------------------------------------ tokenizer checks


@dataclass(slots=True)
class TokenJob:
    record_id: int
    messages: list[dict[str, Any]]
    reasoning: str
    content: str
    completion_tokens: int | None
    template: bool
    count: bool


def tokenizer_spec(ctx: RunContext) -> Any:
    from ..tokens.tokenizer import TokenizerSpec

    t = ctx.tokenizer or {}
    return TokenizerSpec(t["name_or_path"], chat_template=t.get("chat_template"),
                         trust_remote_code=bool(t.get("trust_remote_code")),
                         think_open=ctx.think_open or "<think>", think_close=ctx.think_close or "</think>")


def run_token_job(lt: Any, job: TokenJob) -> list[tuple[int, str, bool, dict[str, Any]]]:
    """(record_id, check, failed, details) results of one tokenizer job."""
    from ..tokens.render import render_record

    rendered = render_record(lt, job.messages, job.reasoning, job.content,
                             usage_completion_tokens=job.completion_tokens if job.count else None)
    codes = {w.code: w for w in rendered.warnings}
    out: list[tuple[int, str, bool, dict[str, Any]]] = []
    if job.template:
        w = codes.get("reasoning_dropped_by_template")
        out.append((job.record_id, "template_drops_reasoning", w is not None,
                    {"message": w.message, "template": rendered.template_source[:200] or None} if w else {}))
    if job.count and job.completion_tokens is not None:
        w = codes.get("completion_length_mismatch")
        out.append((job.record_id, "token_count_mismatch", w is not None, dict(w.detail) if w else {}))
    return out


class TokenThread:
    """Tokenizer checks off the writer thread: bounded job queue in, results out."""

    def __init__(self, spec: Any, max_queue: int = 32) -> None:
        self.spec = spec
        self.jobs: queue.Queue[TokenJob] = queue.Queue(maxsize=max_queue)
        self.results: queue.SimpleQueue[tuple[int, str, bool, dict[str, Any]]] = queue.SimpleQueue()
        self.skipped = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._main, name="synthwatch-token-checks", daemon=True)
        self._thread.start()

    def submit(self, job: TokenJob) -> bool:
        if self.error is not None:
            return False
        try:
            self.jobs.put_nowait(job)
            return True
        except queue.Full:
            self.skipped += 1
            return False

    def _main(self) -> None:
        from ..tokens.tokenizer import TokenizerError, load_tokenizer

        try:
            lt = load_tokenizer(self.spec)
        except (TokenizerError, OSError, ValueError) as exc:
            self.error = str(exc)
            log.warning("tokenizer checks disabled: %s", exc)
            return
        while True:
            job = self.jobs.get()
            try:
                for res in run_token_job(lt, job):
                    self.results.put(res)
            except Exception as exc:  # a template that cannot render one record must not stop the others
                log.warning("tokenizer check of record %d failed: %s", job.record_id, exc)

    def drain(self) -> list[tuple[int, str, bool, dict[str, Any]]]:
        out = []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out


# ------------------------------------------------------------------------------------ rolling windows


class Window:
    __slots__ = ("size", "buf", "fail")

    def __init__(self, size: int, items: Iterable[bool] = ()) -> None:
        self.size = size
        self.buf: deque[bool] = deque(maxlen=size)
        self.fail = 0
        self.extend(list(items))

    def add(self, failed: bool) -> None:
        if len(self.buf) == self.size and self.buf[0]:
            self.fail -= 1
        self.buf.append(failed)
        if failed:
            self.fail += 1

    def extend(self, items: list[bool]) -> None:
        """add() for each item in order; one flush's records at once (counted in C, not per record)."""
        if not items:
            return
        buf = self.buf
        if len(items) >= self.size:
            buf.clear()
            self.fail = 0
            items = items[-self.size:]
        else:
            overflow = len(buf) + len(items) - self.size
            if overflow > 0:  # the oldest entries leave the window
                self.fail -= sum(itertools.islice(buf, overflow))
        buf.extend(items)
        self.fail += sum(items)

    @property
    def total(self) -> int:
        return len(self.buf)


@functools.lru_cache(maxsize=64)
def _stat_upsert(n_rows: int) -> Any:
    """Add a flush's counts to check_stat for n_rows checks at once; returns each check's running totals."""
    values = ", ".join(f"(:r, :c{i}, :f{i}, :n{i}, :wf{i}, :wn{i}, :ex{i}, :t)" for i in range(n_rows))
    return text(
        "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, example_record_id,"
        f" updated_at) VALUES {values} ON CONFLICT (run_id, check_name) DO UPDATE SET"
        " n_fail = check_stat.n_fail + excluded.n_fail, n_total = check_stat.n_total + excluded.n_total,"
        " win_fail = excluded.win_fail, win_total = excluded.win_total,"
        " example_record_id = COALESCE(excluded.example_record_id, check_stat.example_record_id),"
        " updated_at = excluded.updated_at RETURNING check_name, n_fail, n_total, example_record_id"
    )


_OK_BITS = sum(BIT[n] for n in ("empty_content", "both_empty_with_tokens", "truncated", "truncated_in_reasoning",
                                 "think_tags_in_content", "field_mismatch", "repetition"))


def applied_bits(status: str, reasoning_tokens: Any, expects: bool) -> int:
    """Which per-record checks apply to a stored record, from what it stored (a record's applied bits are not
    kept): the status checks always; the answer checks on ok records; empty reasoning when the run expects it;
    the reasoning-tokens check when the server reported them."""
    applied = BIT["timeout"] | BIT["error"]
    if status == "ok":
        applied |= _OK_BITS
        if expects:
            applied |= BIT["empty_reasoning"]
        if reasoning_tokens is not None:
            applied |= BIT["reasoning_tokens_no_text"]
    return applied



def check_turns(checker: RecordChecker, v: RecordView, turns: list[dict[str, Any]] | None
                ) -> tuple[int, int, dict[str, Any]]:
    """Check a record and its earlier turns (synthwatch.capture.turns): a record fails a check when any of its turns
    does. The details are the last turn's, plus ``turns``: {turn number (1-based): details} for the earlier
    turns that failed. Each earlier turn is checked as an ok record of its own."""
    applied, failed, det = checker.check(v)
    for i, turn in enumerate(turns or ()):
        tv = view_from_row({**turn, "id": v.record_id, "idx": v.idx, "status": "ok", "prompt_json": None})
        a, f, d = checker.check(tv)
        applied |= a
        failed |= f
        if f:
            det.setdefault("turns", {})[str(i + 1)] = {n: d.get(n, {}) for n in CHECK_NAMES if f & BIT[n]}
    return applied, failed, det


def recent_windows(conn: Connection, run_id: int, checker: RecordChecker, rules: dict[str, Rule]) -> dict[str, Window]:
    """Each check's rolling window over the run's most recently finished records, from their stored results.

    Which checks applied to a record is not stored: the cheap per-record rules decide it again (status,
    expected reasoning, usage); what failed is the stored check_flags."""
    size = max(rules[n].window for n in CHECK_NAMES)
    rows = conn.execute(
        text("SELECT status, reasoning_tokens, check_flags FROM record WHERE run_id = :r AND finished_at IS NOT NULL"
             " AND status IN ('ok', 'error', 'timeout') ORDER BY finished_at DESC LIMIT :n"),
        {"r": run_id, "n": size},
    ).all()
    windows = {n: Window(rules[n].window) for n in CHECK_NAMES}
    en = checker.enabled
    for status, reasoning_tokens, flags in reversed(rows):
        applied = applied_bits(status, reasoning_tokens, checker.ctx.expects)
        if status == "ok":
            applied |= BIT["duplicate_output"] | BIT["server_drift"]
        applied &= en
        for name in CHECK_NAMES:
            if applied & BIT[name]:
                windows[name].add(bool((flags or 0) & BIT[name]))
    return windows


# ------------------------------------------------------------------------------------ the writer hook


class ChecksHook:
    """WriterHook: per-record checks before the write, rates + alarms inside the write transaction."""

    RELOAD_S = 2.0

    def __init__(self, engine: Engine, ctx: RunContext, *, notifier: Notifier | None = None,
                 load: bool = True) -> None:
        self.engine = engine
        self.run_id = ctx.run_id
        self.ctx = ctx
        self.checker = RecordChecker(ctx)
        self.rules: dict[str, Rule] = effective_rules(ctx.settings.rules)
        self.windows: dict[str, Window] = {n: Window(self.rules[n].window) for n in CHECK_NAMES}
        self.run_stats: dict[str, tuple[int, int, int | None]] = {}
        self.details: dict[str, dict[str, Any]] = {}
        self.mismatch_fields: set[str] = set()
        self.notifier = notifier if notifier is not None else Notifier(
            ctx.notify_url, timeout_s=ctx.settings.webhook.timeout_s)
        self.keeper = AlarmKeeper(ctx.run_id, ctx.name, self.notifier, ctx.settings.webhook.dashboard_url)
        self.tokens: TokenThread | None = None
        self.template_done = False
        self.ok_seen = 0
        self.check_errors = 0
        # record_id -> (record_id, applied, failed, new): checked, not written yet. The writer checks finished
        # records as they arrive (so an auto-pause lands before its worker's next claim) and again at the flush;
        # a record is staged once.
        self._staged: dict[int, tuple[int, int, int, bool]] = {}
        self._new_fail: dict[str, float] = {}  # check -> latest finish time of a failing staged record
        self._seen_seq: tuple[int, int] | None = None  # (config_version, repair_seq) the state was loaded at
        self._results: dict[int, tuple[int, int, dict[str, Any]]] = {}  # recent record -> result (retries)
        self._sample_details: dict[int, dict[str, Any]] = {}
        self._raw_checks = orjson.dumps(ctx.settings.model_dump(mode="json"))
        self._last_reload = time.monotonic()
        self._reevaluate_all = True
        if load:
            self._load()

    # -- state on start / resume ----------------------------------------------------------------

    def _load(self) -> None:
        with self.engine.connect() as conn:
            for name, n_fail, n_total, ex in conn.execute(
                text("SELECT check_name, n_fail, n_total, example_record_id FROM check_stat WHERE run_id = :r"),
                {"r": self.run_id},
            ):
                self.run_stats[name] = (n_fail, n_total, ex)
            self.template_done = self.run_stats.get("template_drops_reasoning", (0, 0, None))[1] > 0
            for ep, model, fp in conn.execute(
                text("SELECT endpoint, model, system_fingerprint FROM record WHERE run_id = :r AND status = 'ok'"
                     " AND finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT 200"), {"r": self.run_id},
            ):
                if model is not None or fp is not None:
                    self.checker.baseline.setdefault(ep or "", (model, fp))
            n = self.ctx.settings.duplicate_resume_records
            if n and "duplicate_output" not in self.ctx.settings.disabled:
                for rid, r, c in conn.execute(
                    text("SELECT id, reasoning, content FROM record WHERE run_id = :r AND status = 'ok'"
                         " AND finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT :n"), {"r": self.run_id, "n": n},
                ):
                    self.checker.remember(rid, r or "", c or "")
            self.keeper.load(conn)
            conn.rollback()
        if self.ctx.tokenizer and self.ctx.tokenizer.get("name_or_path"):
            self.tokens = TokenThread(tokenizer_spec(self.ctx))

    # -- WriterHook ----------------------------------------------------------------------------

    def on_outcomes(self, outcomes: list[Any]) -> None:
        staged = self._staged
        for o in outcomes:
            if o.status == "pending" or o.record_id in staged:
                continue
            prev = self._results.get(o.record_id)
            if prev is not None:  # the same outcome again: the previous write transaction failed
                applied, failed, det = prev
                o.check_flags = failed
                o.check_json = orjson.dumps(det).decode() if det else None
                staged[o.record_id] = (o.record_id, applied, failed, False)
                continue
            v = view_from_outcome(o)
            try:
                applied, failed, det = check_turns(self.checker, v, o.turns) if o.turns \
                    else self.checker.check(v)
            except Exception as exc:  # a checks bug must not stop data collection: flag the record instead
                self.check_errors += 1
                if self.check_errors <= 5:
                    log.exception("checks failed on record %d", o.record_id)
                applied, failed, det = 0, 0, {"check_error": f"{exc.__class__.__name__}: {exc}"[:500]}
            o.check_flags = failed
            o.check_json = orjson.dumps(det).decode() if det else None
            self._results[o.record_id] = (applied, failed, det)
            staged[o.record_id] = (o.record_id, applied, failed, True)
            if failed:
                fin = o.finished_at or time.time()
                for name in CHECK_NAMES:
                    if failed & BIT[name] and fin > self._new_fail.get(name, 0.0):
                        self._new_fail[name] = fin
            if v.status == "ok":
                self.ok_seen += 1
                self._maybe_tokenize(v, det)
        if len(self._results) > 20_000:  # keep only what a retried flush can ask for again
            for k in list(self._results)[: len(self._results) - 10_000]:
                del self._results[k]

    def _maybe_tokenize(self, v: RecordView, det: dict[str, Any]) -> None:
        if self.tokens is None:
            return
        template = not self.template_done and bool(v.reasoning.strip()) \
            and "template_drops_reasoning" not in self.ctx.settings.disabled
        count = ("token_count_mismatch" not in self.ctx.settings.disabled and v.completion_tokens is not None
                 and self.ok_seen % self.ctx.settings.token_sample_every == 0)
        if not (template or count):
            return
        job = TokenJob(v.record_id, v.prompt_messages(), v.reasoning, v.content, v.completion_tokens, template, count)
        if self.tokens.submit(job):
            if template:
                self.template_done = True
            if len(self._sample_details) < 1000:
                self._sample_details[v.record_id] = det

    def pause_due(self) -> bool:
        """Would the records checked but not yet written pause the run? (windows as they would be after them)"""
        if not self._new_fail:
            return False
        windows = {n: (w.fail, w.total) for n, w in self.windows.items()}
        for _rid, applied, failed, new in self._staged.values():
            if not new:
                continue
            for name in self._new_fail:
                b = BIT[name]
                if applied & b:
                    f, n = windows[name]
                    w = self.windows[name]
                    full = n >= w.size
                    windows[name] = (f + bool(failed & b), n if full else n + 1)
        return self.keeper.would_pause(self.rules, windows, self._new_fail)

    def take_paused(self) -> bool:
        """True once after a flush in which an alarm paused the run."""
        paused, self.keeper.paused = self.keeper.paused, False
        return paused

    def on_flush(self, conn: Connection, t: float) -> None:
        deltas: dict[str, list[Any]] = {}  # check -> [fail, total, example]
        staged = list(self._staged.values())
        any_applied = any_failed = 0
        for _rid, applied, failed, _new in staged:
            any_applied |= applied
            any_failed |= failed
        # per check rather than per record and check: a flush holds hundreds of records, a dozen checks apply
        for name in CHECK_NAMES:
            b = BIT[name]
            if not any_applied & b:
                continue
            if not any_failed & b:  # the usual case: every record passed this check
                deltas[name] = [0, sum(1 for s in staged if s[1] & b), None]
                self.windows[name].extend([False] * sum(1 for s in staged if s[3] and s[1] & b))
                continue
            rows = [(s[0], bool(s[2] & b), s[3]) for s in staged if s[1] & b]
            fails = [rid for rid, f, _new in rows if f]
            deltas[name] = [len(fails), len(rows), fails[-1] if fails else None]
            self.windows[name].extend([f for _rid, f, new in rows if new])
        for rid, _applied, failed, new in staged:
            if new and failed:
                det = self._results[rid][2]
                for name, d in det.items():
                    if name not in BIT:
                        continue
                    self.details[name] = {**d, "record_id": rid}
                    if name == "field_mismatch":
                        self.mismatch_fields.update(d.get("fields") or ())
        if self.tokens is not None:
            self._apply_token_results(conn, deltas)
        if time.monotonic() - self._last_reload >= self.RELOAD_S:
            self._last_reload = time.monotonic()
            self._reload(conn)
        touched = set(deltas)
        if deltas:
            # one multi-row statement per flush (RETURNING does not combine with executemany everywhere,
            # and a statement per check was a dozen round trips per flush)
            params: dict[str, Any] = {"r": self.run_id, "t": t}
            for i, (n, d) in enumerate(deltas.items()):
                params.update({f"c{i}": n, f"f{i}": d[0], f"n{i}": d[1], f"wf{i}": self.windows[n].fail,
                               f"wn{i}": self.windows[n].total, f"ex{i}": d[2]})
            for name, n_fail, n_total, ex in conn.execute(_stat_upsert(len(deltas)), params):
                self.run_stats[name] = (n_fail, n_total, ex)
        if touched or self._reevaluate_all:
            self._evaluate(conn, t, None if self._reevaluate_all else touched)
            self._reevaluate_all = False
        self._staged = {}
        self._new_fail = {}

    def _apply_token_results(self, conn: Connection, deltas: dict[str, list[Any]]) -> None:
        assert self.tokens is not None
        for rid, name, failed, det in self.tokens.drain():
            d = deltas.setdefault(name, [0, 0, None])
            d[1] += 1
            self.windows[name].add(failed)
            if not failed:
                continue
            d[0] += 1
            d[2] = rid
            self.details[name] = {**det, "record_id": rid}
            merged = dict(self._sample_details.get(rid) or {})
            merged[name] = det
            conn.execute(text("UPDATE record SET check_flags = check_flags | :b, check_json = :j WHERE id = :i"),
                         {"b": BIT[name], "j": orjson.dumps(merged).decode(), "i": rid})
        if len(self._sample_details) >= 1000:
            self._sample_details.clear()

    def _evaluate(self, conn: Connection, t: float, only: set[str] | None) -> None:
        windows = {n: (w.fail, w.total) for n, w in self.windows.items()}
        details = dict(self.details)
        if "field_mismatch" in details:
            details["field_mismatch"] = {**details["field_mismatch"], "fields": sorted(self.mismatch_fields),
                                         "mode": self.ctx.mode}
        self.keeper.evaluate(conn, t, self.rules, windows, self.run_stats, details, only=only,
                             new_fail=self._new_fail)

    def _reload(self, conn: Connection) -> None:
        """Pick up what changed while running: check settings, a new config version (reading settings), and
        repairs (re-derive / re-run rewrote check results: whole-run counts, windows and alarms are re-read)."""
        row = conn.execute(text("SELECT config_json, config_version, repair_seq FROM run WHERE id = :r"),
                           {"r": self.run_id}).first()
        if row is None:
            return
        seq = (int(row[1] or 1), int(row[2] or 0))
        if self._seen_seq is None:
            self._seen_seq = seq
        elif seq != self._seen_seq:
            self._seen_seq = seq
            try:
                cfg = orjson.loads(row[0]) or {}
                fresh = RunContext.from_config(self.run_id, self.ctx.name, cfg)
            except (orjson.JSONDecodeError, ConfigError) as exc:
                log.warning("ignoring invalid config of run %d: %s", self.run_id, exc)
            else:
                self.ctx.mode, self.ctx.expects = fresh.mode, fresh.expects
                self.ctx.think_open, self.ctx.think_close = fresh.think_open, fresh.think_close
                self.checker.set_context(self.ctx)
            self.reload_state(conn)
        try:
            raw = (orjson.loads(row[0]) or {}).get("checks") or {}
            settings = parse_settings(raw)
        except (orjson.JSONDecodeError, ChecksConfigError, AttributeError) as exc:
            log.warning("ignoring invalid check settings of run %d: %s", self.run_id, exc)
            return
        dumped = orjson.dumps(settings.model_dump(mode="json"))
        if dumped == self._raw_checks:
            return
        self._raw_checks = dumped
        self.apply_settings(settings)

    def reload_state(self, conn: Connection) -> None:
        """Whole-run counts, rolling windows and active alarms as stored (after a repair changed them)."""
        self.run_stats = {name: (n_fail, n_total, ex) for name, n_fail, n_total, ex in conn.execute(
            text("SELECT check_name, n_fail, n_total, example_record_id FROM check_stat WHERE run_id = :r"),
            {"r": self.run_id})}
        self.windows = recent_windows(conn, self.run_id, self.checker, self.rules)
        self.details = {}
        self.mismatch_fields = set()
        self.keeper.load(conn)
        self._reevaluate_all = True

    def apply_settings(self, settings: CheckSettings) -> None:
        self.ctx.settings = settings
        self.checker.set_context(self.ctx)
        self.rules = effective_rules(settings.rules)
        for name in CHECK_NAMES:
            w = self.windows[name]
            if w.size != self.rules[name].window:
                self.windows[name] = Window(self.rules[name].window, list(w.buf))
        self._reevaluate_all = True
        log.info("run %d: check settings reloaded", self.run_id)


def writer_hooks(engine: Engine, run_id: int, config: Any) -> list[Any]:
    """The hooks a worker (or `synthwatch watch`) passes to its writer for this run.

    config: a RunConfig, its snapshot dict, or None (the run's stored config). Raises ChecksConfigError
    (a ConfigError) for a bad `[checks]` table."""
    if config is None:  # use what the run stored
        with engine.connect() as conn:
            row = store.run_row(conn, run_id)
            conn.rollback()
        cfg = orjson.loads(row["config_json"] or "{}") or {}
        cfg.setdefault("name", row["name"])
    else:
        cfg = config if isinstance(config, dict) else config.snapshot()
    name = cfg.get("name") or str(run_id)
    ctx = RunContext.from_config(run_id, name, cfg)
    return [ChecksHook(engine, ctx)]


# ------------------------------------------------------------------------------------ canaries


@dataclass(slots=True)
class CanaryRow:
    index: int
    line: int | None
    source_id: str
    messages: list[dict[str, str]]


def with_canaries(prompts: Iterable[Any], settings: CheckSettings) -> Iterator[Any]:
    """The dataset prompts with a canary as every Nth one (negative idx, source_id synthwatch-canary:K)."""
    n = settings.canary.every_n
    if n < 2:
        yield from prompts
        return
    canaries = settings.canary.prompts
    pos = k = 0
    for p in prompts:
        pos += 1
        if pos % n == 0:
            c = canaries[k % len(canaries)]
            yield CanaryRow(-(k + 1), None, f"{CANARY_SOURCE_PREFIX}{k}", [{"role": "user", "content": c.prompt}])
            k += 1
            pos += 1
        yield p


# ------------------------------------------------------------------------------------ recompute

_RECORD_COLS = ("id, idx, status, reasoning, content, finish_reason, completion_tokens, reasoning_tokens, extra_json,"
                " model, system_fingerprint, prompt_json, finished_at, endpoint, turns_json")


def save_settings(engine: Engine, run_id: int, raw: dict[str, Any], actor: str = "cli") -> CheckSettings:
    """Validate and store a run's `[checks]` table in its config snapshot."""
    from ..store.versions import create_version

    settings = parse_settings(raw)
    with engine.connect() as conn, store.write_begin(conn):
        store.lock_run(conn, run_id)
        row = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).first()
        if row is None:
            raise store.NotFound(f"no run {run_id}")
        cfg = orjson.loads(row[0]) or {}
        before = effective_rules(parse_settings(cfg.get("checks") or {}).rules)
        after = effective_rules(settings.rules)
        dropped = [n for n in CHECK_NAMES if before[n].auto_pause and not after[n].auto_pause]
        if dropped:
            # an off switch for the run's protection is its own action, with a reason on the record
            raise ChecksConfigError(
                f"turning auto-pause off ({', '.join(dropped)}) is a separate action with a reason: "
                f"`synthwatch autopause RUN {dropped[0]} off --reason ...`, the run page's alarm banner, or "
                f"POST /api/runs/{run_id}/autopause")
        new_checks = settings.model_dump(mode="json", exclude_defaults=True)
        if cfg.get("checks") != new_checks:
            # settings are never overwritten: the change is the run's next config version
            create_version(conn, run_id, {**cfg, "checks": new_checks}, actor=actor, reason="check settings")
        store.add_event(conn, run_id, "check_settings", None, actor=actor)
    return settings


def recompute(engine: Engine, run_id: int, *, batch: int = 1000, use_tokenizer: bool = True) -> dict[str, Any]:
    """Re-run every check on every finished record of a run with its current settings.

    Rewrites check_flags / check_json, rebuilds check_stat (whole run and windows: the most
    recently finished records), and re-evaluates alarms (clears those that no longer fire, raises
    new ones; never auto-pauses). One pass in id order, batched write transactions."""
    with engine.connect() as conn:
        run = store.run_row(conn, run_id)
        conn.rollback()
    ctx = RunContext.from_config(run_id, run["name"], orjson.loads(run["config_json"] or "{}") or {})
    ctx.expects = bool(run["expects_reasoning"])
    checker = RecordChecker(ctx)
    rules = effective_rules(ctx.settings.rules)
    lt = None
    if use_tokenizer and ctx.tokenizer and ctx.tokenizer.get("name_or_path"):
        from ..tokens.tokenizer import TokenizerError, load_tokenizer

        try:
            lt = load_tokenizer(tokenizer_spec(ctx))
        except (TokenizerError, OSError, ValueError) as exc:
            log.warning("tokenizer checks skipped: %s", exc)
    totals: dict[str, list[Any]] = {n: [0, 0, None] for n in CHECK_NAMES}
    heaps: dict[str, list[tuple[float, int, bool]]] = {n: [] for n in CHECK_NAMES}
    details: dict[str, dict[str, Any]] = {}
    mismatch: set[str] = set()
    template_done = False
    ok_seen = 0
    last_id = 0
    n_records = 0
    t0 = time.time()
    while True:
        with engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT {_RECORD_COLS} FROM record WHERE run_id = :r AND id > :last"
                     " AND status IN ('ok', 'error', 'timeout') ORDER BY id LIMIT :n"),
                {"r": run_id, "last": last_id, "n": batch},
            ).mappings().all()
            conn.rollback()
        if not rows:
            break
        updates = []
        for row in rows:
            v = view_from_row(row)
            applied, failed, det = check_turns(checker, v, load_turns(row["turns_json"]))
            if v.status == "ok" and lt is not None:
                ok_seen += 1
                template = not template_done and bool(v.reasoning.strip()) \
                    and "template_drops_reasoning" not in ctx.settings.disabled
                count = ("token_count_mismatch" not in ctx.settings.disabled and v.completion_tokens is not None
                         and ok_seen % ctx.settings.token_sample_every == 0)
                if template or count:
                    template_done = template_done or template
                    job = TokenJob(v.record_id, v.prompt_messages(), v.reasoning, v.content, v.completion_tokens,
                                   template, count)
                    try:
                        results = run_token_job(lt, job)
                    except Exception as exc:  # one unrenderable record must not stop the recompute
                        log.warning("tokenizer check of record %d failed: %s", v.record_id, exc)
                        results = []
                    for _rid, name, bad, d in results:
                        applied |= BIT[name]
                        if bad:
                            failed |= BIT[name]
                            det[name] = d
            fin = row["finished_at"] or 0.0
            for name in CHECK_NAMES:
                b = BIT[name]
                if not applied & b:
                    continue
                tot = totals[name]
                tot[1] += 1
                bad = bool(failed & b)
                if bad:
                    tot[0] += 1
                    tot[2] = v.record_id
                    details[name] = {**det.get(name, {}), "record_id": v.record_id}
                h = heaps[name]
                item = (fin, v.record_id, bad)
                if len(h) < rules[name].window:
                    heapq.heappush(h, item)
                elif item > h[0]:
                    heapq.heapreplace(h, item)
            if det.get("field_mismatch"):
                mismatch.update(det["field_mismatch"].get("fields") or ())
            updates.append({"f": failed, "j": orjson.dumps(det).decode() if det else None, "i": v.record_id})
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("UPDATE record SET check_flags = :f, check_json = :j WHERE id = :i"), updates)
        n_records += len(rows)
        last_id = rows[-1]["id"]
    t = time.time()
    windows = {n: (sum(1 for x in heaps[n] if x[2]), len(heaps[n])) for n in CHECK_NAMES}
    if "field_mismatch" in details:
        details["field_mismatch"] = {**details["field_mismatch"], "fields": sorted(mismatch), "mode": ctx.mode}
    run_stats = {n: (v[0], v[1], v[2]) for n, v in totals.items()}
    keeper = AlarmKeeper(run_id, ctx.name, None, ctx.settings.webhook.dashboard_url)
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("DELETE FROM check_stat WHERE run_id = :r"), {"r": run_id})
        stat_rows = [{"r": run_id, "c": n, "f": v[0], "n": v[1], "wf": windows[n][0], "wn": windows[n][1],
                      "ex": v[2], "t": t} for n, v in totals.items() if v[1]]
        if stat_rows:
            conn.execute(
                text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                     " example_record_id, updated_at) VALUES (:r, :c, :f, :n, :wf, :wn, :ex, :t)"), stat_rows)
        raised = keeper.evaluate(conn, t, rules, windows, run_stats, details, allow_pause=False, clear_sticky=True)
        store.add_event(conn, run_id, "recompute_checks", n_records, actor="checks")
    return {
        "run_id": run_id, "records": n_records, "seconds": round(time.time() - t0, 3), "raised": raised,
        "active_alarms": sorted(keeper.active),
        "checks": {n: {"fail": v[0], "total": v[1], "window_fail": windows[n][0], "window_total": windows[n][1]}
                   for n, v in totals.items()},
    }


def check_rates(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """check_stat rows of a run in CHECK_NAMES order, with rates (one small indexed query)."""
    rows = {r["check_name"]: dict(r) for r in conn.execute(
        text("SELECT check_name, n_fail, n_total, win_fail, win_total, example_record_id, updated_at"
             " FROM check_stat WHERE run_id = :r"), {"r": run_id},
    ).mappings()}
    out = []
    for name in CHECK_NAMES:
        r = rows.get(name) or {"check_name": name, "n_fail": 0, "n_total": 0, "win_fail": 0, "win_total": 0,
                               "example_record_id": None, "updated_at": None}
        r["rate"] = r["n_fail"] / r["n_total"] if r["n_total"] else None
        r["win_rate"] = r["win_fail"] / r["win_total"] if r["win_total"] else None
        r["description"] = CHECK_INFO[name]
        out.append(r)
    return out
