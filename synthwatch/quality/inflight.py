"""Checks on streams in flight (#36): what a stream's first deltas already say, judged while it is written.

A :class:`StreamJudge` follows one streamed attempt. The client calls :meth:`StreamJudge.observe` after each network
read (synthwatch.workers.client); it reads the stream's accumulator (synthwatch.capture.stream) and, at most once per
check and stream, returns a :class:`Verdict` with its evidence (the record, the delta index, an excerpt of the text):

- ``field_mismatch``: reasoning arrives in a field this run does not read (known from the first reasoning delta);
- ``empty_reasoning``: the answer starts while no reasoning came, and the run expects reasoning;
- ``think_tags_in_content``: think tags in the content although the reasoning came in a field, or leaked chat
  template text (``<|im_end|>``...) in the content;
- ``repetition``: the text repeats itself, by the same period detector the finished-record check uses
  (:func:`synthwatch.quality.checks.looping_period`, with the run's repetition settings).

Cost (the per-chunk hot path of the worker): the first three are judged on the first ``FIRST_DELTAS`` deltas only,
from a few short tails of the text; after that, only the loop detector runs, once every ``LOOP_EVERY_DELTAS``
deltas, on the last ``repetition_tail_chars`` characters. A decided stream costs one comparison per read.

A verdict goes to the alarm path as if that record's check had been observed failing early: :func:`deliver` is the
one call, in the writer thread, inside a write transaction (synthwatch.workers.inflight batches the verdicts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from ..capture.reasoning import REASONING_FIELDS
from ..check_catalog import CheckSettings
from ..config import ConfigError
from .checks import looping_period, parse_settings

FIRST_DELTAS = 64  # deltas judged for the first-delta checks; a decision usually comes at the first text delta
AUTO_EMPTY_DELTAS = 16  # auto / inline modes: content deltas without a think tag before "no reasoning" is decided
LOOP_EVERY_DELTAS = 64  # the loop detector's cadence
MISMATCH_AFTER_DELTAS = 3  # deltas after the first one in an unread field before a mismatch is said
EXCERPT_CHARS = 200
# Chat-template text that never belongs in an answer: a server that does not stop on the end-of-turn token, or a
# template rendered into the prompt twice, leaks it into the content.
LEAKED_TEMPLATE_TEXT = ("<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|endoftext|>", "<｜end▁of▁sentence｜>", "<｜Assistant｜>", "<｜User｜>",
                        "<|assistant|>", "<|user|>")

# What a pause by each check does to the streams still in flight (#36 item 2): a field mismatch is repairable from
# the stored raw response (a re-derive reads the other field), so its streams may finish; the others are doomed.
DOOMED_CHECKS = frozenset({"empty_reasoning", "repetition", "think_tags_in_content"})


@dataclass(slots=True)
class Verdict:
    """One stream's early failure of one check, with its evidence."""

    record_id: int
    check: str
    delta: int  # the index (1-based) of the delta that showed it
    excerpt: str
    endpoint: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        return {"record_id": self.record_id, "in_flight": True, "delta": self.delta, "excerpt": self.excerpt,
                "endpoint": self.endpoint, **self.detail}


@dataclass(slots=True)
class JudgeRules:
    """What the judges of a run need to know (from its config; re-read when a new config version is adopted)."""

    mode: str = "auto"
    expects: bool = True
    think_open: str = "<think>"
    think_close: str = "</think>"
    prefilled_open: bool = False
    disabled: frozenset[str] = frozenset()
    repetition_min_chars: int = 400
    repetition_min_repeats: int = 3
    repetition_tail_chars: int = 8000

    @classmethod
    def from_config(cls, reasoning: Any, checks: CheckSettings) -> JudgeRules:
        return cls(reasoning.mode, bool(reasoning.expect), reasoning.think_open or "", reasoning.think_close or "",
                   bool(reasoning.prefilled_open), frozenset(checks.disabled), checks.repetition_min_chars,
                   checks.repetition_min_repeats, checks.repetition_tail_chars)


def run_rules(config: Any) -> JudgeRules:
    """The judges' rules of a RunConfig (its [reasoning] and [checks]; a [checks] table that does not validate has
    been refused when the run started: the defaults are used then)."""
    try:
        checks = parse_settings(config.checks)
    except ConfigError:
        checks = parse_settings({})
    return JudgeRules.from_config(config.reasoning, checks)


def _excerpt(text: str) -> str:
    return text[-EXCERPT_CHARS:]


class StreamJudge:
    """The in-flight checks of one streamed attempt (see the module's docstring)."""

    __slots__ = ("record_id", "endpoint", "rules", "first_open", "next_loop", "done", "_fields", "_other_at")

    def __init__(self, record_id: int, endpoint: str, rules: JudgeRules) -> None:
        self.record_id = record_id
        self.endpoint = endpoint
        self.rules = rules
        self.first_open = True  # the first-delta checks are still being judged
        self.next_loop = LOOP_EVERY_DELTAS if "repetition" not in rules.disabled else 1 << 62
        self.done: set[str] = set()  # checks this stream already failed
        self._fields = tuple(f for f in REASONING_FIELDS if f != rules.mode) if rules.mode != "auto" else ()
        self._other_at = 0  # the delta at which reasoning first came in a field this run does not read

    def observe(self, acc: Any) -> list[Verdict] | None:
        """Judge the stream as it is now (``acc``: its StreamAccumulator). None, or this read's new verdicts."""
        n = acc.n_chunks
        out: list[Verdict] | None = None
        if self.first_open:
            out = self._first(acc, n)
            if n >= FIRST_DELTAS:
                self.first_open = False
        if n >= self.next_loop:
            self.next_loop = n + LOOP_EVERY_DELTAS
            v = self._loop(acc, n)
            if v is not None:
                out = [*(out or ()), v]
        return out

    def _fail(self, check: str, n: int, text: str, **detail: Any) -> Verdict | None:
        if check in self.done or check in self.rules.disabled:
            return None
        self.done.add(check)
        return Verdict(self.record_id, check, n, _excerpt(text), self.endpoint, detail)

    def _first(self, acc: Any, n: int) -> list[Verdict] | None:
        r = self.rules
        out: list[Verdict] = []
        mode = r.mode
        read_field = mode if mode in REASONING_FIELDS else None
        has_read = read_field is not None and acc.has_text(read_field)
        other = None
        if not has_read:
            for f in self._fields if mode != "auto" else ():
                if acc.has_text(f):
                    other = f
                    break
        if other is not None:  # reasoning in a field this run does not read (the first reasoning deltas say it)
            # a server that sends two fields (OpenRouter: reasoning and reasoning_details) may send the read one a
            # delta later: decided MISMATCH_AFTER_DELTAS deltas on, the read field still empty
            if not self._other_at:
                self._other_at = n
            if n < self._other_at + MISMATCH_AFTER_DELTAS:
                return None
            v = self._fail("field_mismatch", n, acc.tail(other, EXCERPT_CHARS), fields=[other], mode=mode)
            if v is not None:
                out.append(v)
            self.first_open = False  # its symptoms (empty reasoning...) are the mismatch's, not judged apart
            return out or None
        in_field = has_read or (mode == "auto" and any(acc.has_text(f) for f in REASONING_FIELDS))
        if not acc.has_text("content"):
            return None
        head = acc.tail("content", 4096) if n <= FIRST_DELTAS else ""
        tags = [t for t in (r.think_open, r.think_close) if t and t in head]
        if tags and (in_field or mode not in ("auto", "inline")):  # auto / inline: the tags delimit the reasoning
            v = self._fail("think_tags_in_content", n, head, tags=tags)
            if v is not None:
                out.append(v)
        leaked = [t for t in LEAKED_TEMPLATE_TEXT if t in head]
        if leaked:
            v = self._fail("think_tags_in_content", n, head, leaked=leaked)
            if v is not None:
                out.append(v)
        if r.expects and not in_field and "empty_reasoning" not in self.done:
            # the answer started and no reasoning came: in a field mode the first content delta says it; where
            # reasoning may be written inline (auto, inline) only content without any think tag, long enough
            if mode in ("auto", "inline"):
                decided = not r.prefilled_open and not tags and n >= AUTO_EMPTY_DELTAS
            else:
                decided = True
            if decided:
                v = self._fail("empty_reasoning", n, head)
                if v is not None:
                    out.append(v)
        return out or None

    def _loop(self, acc: Any, n: int) -> Verdict | None:
        r = self.rules
        if "repetition" in self.done:
            return None
        for name in ("reasoning", "reasoning_content", "thinking", "content"):
            t = acc.tail(name, r.repetition_tail_chars)
            if len(t) < r.repetition_min_chars:
                continue
            p = looping_period(t, r.repetition_min_chars, r.repetition_min_repeats, r.repetition_tail_chars)
            if p is not None:
                return self._fail("repetition", n, t.rstrip()[-min(p, EXCERPT_CHARS):], field=name,
                                  period_chars=p)
        return None


def deliver(conn: Connection, t: float, hooks: list[Any], verdicts: list[Verdict]) -> None:
    """THE hook from streams in flight into the alarm path (one call, in the writer thread, inside its write
    transaction): each verdict is a record's failure of that check observed early, with its evidence. The writer
    hooks that judge records (synthwatch.quality.live.ChecksHook.observe_early) count it in the check's window and
    run the same rules, hysteresis and auto-pause as for finished records."""
    for hook in hooks:
        observe = getattr(hook, "observe_early", None)
        if observe is not None:
            observe(conn, t, verdicts)
