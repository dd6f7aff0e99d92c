"""Tokenizer checks: the chat template keeps the reasoning (once per run) and the token count agrees with the
server's usage (1 in ``token_sample_every`` ok records). They need a tokenizer, so they run in a thread of their
own (:class:`TokenThread`), never in the writer thread; results come back to the writer hook (synthwatch.quality.live)."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any

from .checks import RunContext

log = logging.getLogger("synthwatch.checks")

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


def think_ids(tokenizer: dict[str, Any] | None, think_open: str, think_close: str,
              request_token_ids: bool) -> tuple[list[int], list[int]] | None:
    """(think-open ids, think-close ids) in the run's tokenizer, when the run asks for ids and names a tokenizer;
    None otherwise, or when it does not load (logged: the counts then come from the stream's reasoning chunks,
    the server's usage or, last, the text-length estimate)."""
    if not request_token_ids or not tokenizer or not think_close:
        return None
    from ..tokens.tokenizer import TokenizerError, TokenizerSpec, load_tokenizer

    try:
        lt = load_tokenizer(TokenizerSpec(
            str(tokenizer["name_or_path"]), chat_template=tokenizer.get("chat_template"),
            trust_remote_code=bool(tokenizer.get("trust_remote_code")), think_open=think_open,
            think_close=think_close))
    except (TokenizerError, ImportError, OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("reasoning tokens are not split at %s: the tokenizer did not load (%s)", think_close, exc)
        return None
    return lt.think_open_ids, lt.think_close_ids


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


# The most text (reasoning, content and prompt, in characters) the tokenizer checks hold at once, queued or being
# tokenized. A count of jobs alone did not bound it: 32 queued replies of max_reply_bytes each were ~2 GB, against a
# worker that otherwise holds a long reply about twice (#39). One sampled record is tokenized only up to
# ``max_job_chars`` (the worker passes long_text_spool_chars: a text long enough to be spooled is not held here).
MAX_HELD_CHARS = 16 * 2**20


def job_chars(job: TokenJob) -> int:
    """The characters a job holds: its texts and its prompt's text parts."""
    n = len(job.reasoning) + len(job.content)
    for m in job.messages:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            n += len(c)
        elif isinstance(c, list):
            n += sum(len(p["text"]) for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return n


class TokenThread:
    """Tokenizer checks off the writer thread: bounded job queue in (at most ``max_queue`` jobs and
    ``max_held_chars`` characters of text, the one being tokenized included; a job over ``max_job_chars`` is not
    taken), results out."""

    def __init__(self, spec: Any, max_queue: int = 32, max_held_chars: int = MAX_HELD_CHARS,
                 max_job_chars: int = MAX_HELD_CHARS) -> None:
        self.spec = spec
        self.jobs: queue.Queue[tuple[TokenJob, int]] = queue.Queue(maxsize=max_queue)
        self.results: queue.SimpleQueue[tuple[int, str, bool, dict[str, Any]]] = queue.SimpleQueue()
        self.skipped = 0  # sampled records not tokenized: the queue was full, or the record too long
        self.skipped_long = 0
        self.error: str | None = None
        self.max_held_chars = max_held_chars
        self.max_job_chars = min(max_job_chars, max_held_chars)
        self.held_chars = 0  # text in the queue and in the job being tokenized
        self._held_lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="synthwatch-token-checks", daemon=True)
        self._thread.start()

    def submit(self, job: TokenJob) -> bool:
        """Queue a job; False (and counted) when the checks are off, the queue is full or holds too much text."""
        n = job_chars(job)
        with self._held_lock:
            if self.error is not None:
                return False
            if n > self.max_job_chars:
                self.skipped += 1
                self.skipped_long += 1
                if self.skipped_long == 1 or not self.skipped_long % 100:
                    log.warning("tokenizer checks: record %d not tokenized: %s characters of text, over the %s one"
                                " record may hold (%d records so far)", job.record_id, f"{n:,}",
                                f"{self.max_job_chars:,}", self.skipped_long)
                return False
            if self.held_chars + n > self.max_held_chars:
                self.skipped += 1
                return False
            try:
                self.jobs.put_nowait((job, n))
            except queue.Full:
                self.skipped += 1
                return False
            self.held_chars += n
            return True

    def _main(self) -> None:
        from ..tokens.tokenizer import TokenizerError, load_tokenizer

        try:
            lt = load_tokenizer(self.spec)
        except (TokenizerError, OSError, ValueError) as exc:
            log.warning("tokenizer checks disabled: %s", exc)
            with self._held_lock:  # what was queued while it loaded is never tokenized: let its texts go
                self.error = str(exc)
                while True:
                    try:
                        self.jobs.get_nowait()
                    except queue.Empty:
                        break
                    self.skipped += 1
                self.held_chars = 0
            return
        while True:
            job, n = self.jobs.get()
            try:
                for res in run_token_job(lt, job):
                    self.results.put(res)
            except Exception as exc:  # a template that cannot render one record must not stop the others
                log.warning("tokenizer check of record %d failed: %s", job.record_id, exc)
            finally:
                del job  # its texts go now, not when the next job arrives
                with self._held_lock:
                    self.held_chars -= n

    def drain(self) -> list[tuple[int, str, bool, dict[str, Any]]]:
        out = []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out


