"""Per-record data-quality checks.

Every final record (ok / error / timeout) goes through :class:`RecordChecker` when it is stored:
cheap string checks only (the worker writes thousands of records per second). The result is a
bitmask (``record.check_flags``, bit ``1 << CHECK_NAMES.index(name)``) and, for records that fail
something, ``record.check_json`` = ``{check_name: details}``. The writer hook that runs them while a run
is live is synthwatch.quality.live; the tokenizer checks are synthwatch.quality.token_checks; re-checking a
whole run is synthwatch.quality.recompute.

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

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from ..capture.token_count import completion_count, reasoning_count
from ..check_catalog import BIT, CHECK_NAMES, CheckSettings
from ..config import ConfigError, format_validation_error
from .template_leaks import MarkerFinder, find_tags, run_markers

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
        msg = format_validation_error(exc, source, CheckSettings).replace("\n  ", "\n  checks.")
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
    prompt_idx: int | None = None  # the prompt's dataset row (k samples share it); None: read from idx

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
    return RecordView(
        o.record_id, o.idx, o.status, ex.reasoning or "", ex.content or "", ex.finish_reason,
        _int_or_none(usage.get("completion_tokens")),
        # the record's reasoning_tokens column (ids, usage or an estimate): a recompute reads the same number
        reasoning_count(ex, completion_count(ex)[1])[0],
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
        prompt_json=r["prompt_json"], endpoint=r["endpoint"], prompt_idx=r.get("prompt_idx"),
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
        self.markers = MarkerFinder(run_markers(ctx.tokenizer, exclude=self.tags)) if BIT[
            "template_tokens_in_text"] & self.enabled else None

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
        # an answer that is a tool call has no content by design (vLLM: content null, finish_reason tool_calls)
        tool_call = v.finish_reason == "tool_calls"
        ct = v.completion_tokens
        if self.ctx.expects:
            applied |= BIT["empty_reasoning"]
            if r_empty:
                failed |= BIT["empty_reasoning"]
        applied |= BIT["empty_content"] | BIT["both_empty_with_tokens"] | BIT["truncated"] | BIT[
            "truncated_in_reasoning"] | BIT["think_tags_in_content"] | BIT["field_mismatch"] | BIT["repetition"]
        if c_empty and not truncated and not tool_call:
            failed |= BIT["empty_content"]
        if r_empty and c_empty and ct and not tool_call:
            failed |= BIT["both_empty_with_tokens"]
            det["both_empty_with_tokens"] = {"completion_tokens": ct}
        if truncated:
            failed |= BIT["truncated"]
            if c_empty and not r_empty:
                failed |= BIT["truncated_in_reasoning"]
        # a one-character scan (memchr) first: searching a long text for a whole tag costs ~20x more
        # a tag the model emitted: one in a code span or quoted is discussed (an answer about reasoning formats)
        if self.tags and c and any(t[0] in c and t in c for t in self.tags):
            tags = find_tags(c, self.tags)
            if tags:
                failed |= BIT["think_tags_in_content"]
                det["think_tags_in_content"] = {"tags": tags}
        if self.markers is not None:
            applied |= BIT["template_tokens_in_text"]
            for name, t in (("content", c), ("reasoning", r)):
                leaked = self.markers.find(t)
                if leaked:
                    failed |= BIT["template_tokens_in_text"]
                    det["template_tokens_in_text"] = {"field": name, "tokens": leaked}
                    break
        # A mismatch is reasoning the run did not store: a record whose read field holds reasoning never counts,
        # whatever else the response carries (a `</think>` the model sampled in its content, OpenRouter's
        # reasoning_details summary next to its reasoning). The alarm's advice (read `inline`, read another
        # field) would corrupt such a run.
        unread = {k: len(t) for k, t in v.unread_fields.items() if isinstance(t, str) and t.strip()} if r_empty else {}
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


_OK_BITS = sum(BIT[n] for n in ("empty_content", "both_empty_with_tokens", "truncated", "truncated_in_reasoning",
                                 "think_tags_in_content", "field_mismatch", "repetition", "template_tokens_in_text"))


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


