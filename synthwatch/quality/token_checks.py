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


