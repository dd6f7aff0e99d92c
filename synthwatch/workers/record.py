"""One claimed record's life in the worker: its request with retries (or, with ``turns = "all"``, each of its
turns in order), then one Outcome for the writer. Whatever happens on the way becomes the record's recorded
error: nothing escapes a record's task except its cancellation (an immediate stop, a graceful stop whose grace
period ran out, the worker failing), which is recorded first as an ``interrupted`` attempt, the record going back
to pending."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Protocol

import orjson

from ..capture import turns as turns_mod
from ..capture.token_count import billed_tokens
from ..config import RunConfig
from ..redact import redact
from ..store import queue as store
from . import faults
from . import record_group as group_mod
from .client import Requester
from .endpoints import EndpointPool
from .inflight import StreamBoard
from .results import RETRYABLE_KINDS, TIMEOUT_KINDS, AttemptFailure, AttemptResult, LiveStats, Outcome
from .series import record_columns
from .supervisor import writer_result
from .writer import Writer

log = logging.getLogger("synthwatch.worker")


class RecordHost(Protocol):
    """What a record's task needs from the worker that runs it (synthwatch.workers.engine.RunWorker). Read at each
    use: a new config version, endpoint pool or stop reason applies to the requests started after it."""

    config: RunConfig
    config_version: int
    writer: Writer | None
    requester: Requester
    pool: EndpointPool
    stats: LiveStats
    local_stop: str | None
    stop_reason: str  # why a request cancelled now was interrupted: recorded on its attempt
    interrupted: list[Outcome]  # outcomes of interrupted records, for a release without the writer
    streams: StreamBoard  # the streams in flight: judged while written, shown live (workers/inflight.py)

    def body_for(self, messages: list[dict[str, Any]] | dict[str, Any], sample_index: int = 0, n: int = 1) -> bytes:
        """The request body for one prompt (or one turn's history), sample ``sample_index`` of it (``n``: that many
        samples from it on, in one request)."""
        ...


class RecordTasks:
    """Runs one claimed record for its host (:meth:`process`), never raising except its cancellation."""

    def __init__(self, host: RecordHost) -> None:
        self.host = host
        self._rng = random.Random()

    # ------------------------------------------------------------ one record

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        r = self.host.config.retries
        delay = min(r.backoff_max_s, r.backoff_base_s * (2**attempt))
        delay = delay * (0.5 + self._rng.random())  # jitter: spread retries of a burst of failures
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _count_ok(self, ex: Any, latency_s: float, ep: Any) -> None:
        tokens = self.host.stats.count_ok(ex, latency_s)
        if ep is not None and self.host.config.autotune.enabled:  # what this endpoint's concurrency tuner looks at
            ep.done.append((time.monotonic(), tokens, latency_s / tokens if tokens else None))

    async def _attempts(self, body: bytes, attempts: list[dict[str, Any]], record_id: int,
                        where: dict[str, Any], n_choices: int = 1) -> AttemptResult:
        """One request with its retries; each attempt is appended to ``attempts``; the last one is returned.
        ``where`` carries the stage and the endpoint out, for the caller's error path."""
        host = self.host
        writer = host.writer
        assert writer is not None
        max_attempts = host.config.retries.max_attempts
        last: AttemptResult | None = None
        for n in range(max_attempts):
            where["stage"] = "send"
            pool = host.pool
            while (wait := pool.wait_s()) > 0:  # every endpoint is backing off from rate limits
                await asyncio.sleep(min(wait, 0.5))
            ep = where["ep"] = pool.pick()
            ep.outstanding += 1
            if ep.outstanding > ep.outstanding_max:
                ep.outstanding_max = ep.outstanding
            where["started"] = started = time.time()
            where["sending"] = True
            live = where["live"] = host.streams.open(record_id, ep.label) if host.config.stream else None
            where["body_len"] = len(body)
            try:
                faults.hit("send")
                res = await (host.requester.attempt(ep, body, host.config.stream, live, n_choices=n_choices) if n_choices > 1
                             else host.requester.attempt(ep, body, host.config.stream, live))
            finally:
                ep.outstanding -= 1
                if live is not None:
                    host.streams.close(live)
            where["sending"] = False  # not in the finally: a cancellation's handler must still see it
            where["stage"] = "capture"
            faults.hit("capture")
            last = res
            # what this attempt is billed, ok or not; the record's columns add up all of its attempts
            res.billed = b = billed_tokens(res.extracted, len(body)) if res.choices is None \
                else group_mod.request_billed(res.choices, len(body))
            t = where.get("billed") or (0, 0, 0)
            where["billed"] = (t[0] + b[0], t[1] + b[1], t[2] + b[2])
            attempts.append(res.attempt_dict(len(attempts) + 1, started))
            if res.ok:
                pool.success(ep)
                break
            retryable = res.kind in RETRYABLE_KINDS
            limited = res.kind == "http_429" or res.status_code == 503
            st = host.stats
            if res.kind in TIMEOUT_KINDS:
                st.attempt_timeouts += 1
                ep.n_timeouts += 1
            elif limited:
                st.rate_limited += 1
            elif res.kind == "http_5xx":
                st.server_errors += 1
                ep.n_server_errors += 1
            if limited:  # rate limiting: this endpoint backs off; the record may go on elsewhere at once
                ep.failed += 1
                ep.last_error = res.message
                pool.rate_limited(ep, res.retry_after_s)
            else:
                pool.failure(ep, res.message, server_fault=retryable)
            retry = retryable and n + 1 < max_attempts and host.local_stop != "stop_now"
            writer.submit_failure(AttemptFailure(
                record_id, ep.label, res.kind, res.status_code, res.message, time.time(), not retry, retry, b))
            if not retry:
                break
            st.retries += 1
            # after a rate limit the endpoint's own backoff (and the wait above) honours Retry-After
            await asyncio.sleep(self._backoff(n, None if limited else res.retry_after_s))
        assert last is not None
        return last

    async def process_group(self, group: list[store.Claimed]) -> None:
        """A prompt's claimed samples as one request with n = len(group) (samples_in_one_request): each choice
        its own record (synthwatch.workers.record_group), the samples a server did not answer one request each."""
        await group_mod.process_group(self, group)

    async def attempts(self, body: bytes, attempts: list[dict[str, Any]], record_id: int, where: dict[str, Any],
                       n: int = 1) -> AttemptResult:
        """One request with its retries (record_group's door to :meth:`_attempts`)."""
        return await self._attempts(body, attempts, record_id, where, n_choices=n)

    def count_ok(self, ex: Any, latency_s: float, ep: Any) -> None:
        self._count_ok(ex, latency_s, ep)

    async def process(self, claimed: store.Claimed) -> None:
        """One record: its request (with retries), or with ``turns = "all"`` each of its turns in order, every
        finished turn written before the next turn's request is sent (synthwatch.capture.turns)."""
        host = self.host
        writer = host.writer
        assert writer is not None
        attempts: list[dict[str, Any]] = []  # the current turn's
        version = host.config_version
        where: dict[str, Any] = {"stage": "claim", "ep": None, "started": time.time()}
        multi = claimed.n_turns > 1
        done_turns: list[dict[str, Any]] = turns_mod.load(claimed.turns_json) if multi else []
        prior = sum(len(t.get("attempts") or ()) for t in done_turns)
        try:
            faults.hit("claim")
            if claimed.attempts_json:
                attempts = orjson.loads(claimed.attempts_json)
            while True:
                where["stage"] = "request build"
                faults.hit("request build")
                k = len(done_turns)
                messages = turns_mod.history(claimed.messages, done_turns, k, host.config.history_reasoning) \
                    if multi else claimed.messages
                last = await self._attempts(host.body_for(messages, claimed.sample_index), attempts, claimed.id,
                                            where)
                if not (last.ok and multi and k + 1 < claimed.n_turns):
                    break
                # a finished turn that is not the last: stored (the record stays claimed) before the next request
                where["stage"] = "turn write"
                turn = turns_mod.stored_turn(
                    record_columns(last.extracted), attempts=attempts, endpoint=last.endpoint,
                    latency_s=last.latency_s, ttft_s=last.ttft_s, n_chunks=last.n_chunks, finished_at=time.time(),
                    gen_version=version)
                done_turns.append(turn)
                prior += len(attempts)
                # never cancels the writer's future (its answer would then crash the writer thread)
                if not await writer_result(writer, writer.write_turn(claimed.id, done_turns, prior)):
                    log.warning("record %d: its claim was taken over; turn %d is not written", claimed.id, k + 1)
                    return
                self._count_ok(last.extracted, last.latency_s, where.get("ep"))
                writer.submit_turn(Outcome(
                    claimed.id, claimed.idx, "turn", messages, extracted=last.extracted, endpoint=last.endpoint,
                    latency_s=last.latency_s, ttft_s=last.ttft_s, n_chunks=last.n_chunks, finished_at=time.time(),
                    attempt_billed=last.billed))
                attempts = []
            where["stage"] = "write"
            faults.hit("write")
            if last.ok:
                status = "ok"
            elif last.kind in TIMEOUT_KINDS:
                status = "timeout"
            else:
                status = "error"
            ex = last.extracted
            outcome = Outcome(
                claimed.id, claimed.idx, status, messages, extracted=ex, attempts=attempts, prior_attempts=prior,
                error_kind=None if last.ok else last.kind, error=None if last.ok else last.message,
                endpoint=last.endpoint, latency_s=last.latency_s, ttft_s=last.ttft_s, n_chunks=last.n_chunks,
                finished_at=time.time(), config_version=version, rerun=claimed.rerun,
                turns=done_turns if multi else None, billed=where.get("billed") or (0, 0, 0),
                attempt_billed=last.billed if last.ok else (0, 0, 0),
            )
            if status == "ok":
                self._count_ok(ex, last.latency_s, where.get("ep"))
            elif status == "timeout":
                host.stats.timeouts += 1
                host.stats.record(False, 0)
            else:
                host.stats.errors += 1
                host.stats.record(False, 0)
        except asyncio.CancelledError:
            ep, started = where["ep"], where["started"]
            if ep is not None:
                host.pool.abandon(ep)
            why = host.stop_reason or "interrupted: the worker stopped"
            if where.get("sending"):  # a request was under way: that attempt is recorded as interrupted
                attempts.append({"n": len(attempts) + 1, "t": round(started, 3),
                                 "endpoint": ep.label if ep else None, "ok": False, "kind": "interrupted",
                                 "status": None, "error": f"{why}; the record went back to pending",
                                 "latency_s": round(time.time() - started, 4)})
                live = where.get("live")
                acc = live.acc if live is not None else None
                if acc is not None and isinstance(acc.usage, dict) and ep is not None:
                    # the server reported what the cancelled request cost so far (vLLM's continuous usage): billed,
                    # and discarded with the request (the cost view counts it; the record goes back to pending)
                    try:
                        billed = billed_tokens(acc.result(), where.get("body_len", 0))
                    except Exception as exc:  # a partial reply's count: never in the way of the cancellation
                        log.warning("record %d: the cancelled request's usage not counted: %s", claimed.id, exc)
                    else:
                        writer.submit_failure(AttemptFailure(
                            claimed.id, ep.label, "interrupted", None, f"{why}; billed and discarded", time.time(),
                            True, False, billed))
            back = Outcome(claimed.id, claimed.idx, "pending", claimed.messages, attempts=attempts,
                           prior_attempts=prior, error_kind="interrupted", error=why, finished_at=time.time(),
                           endpoint=ep.label if ep else None)
            host.interrupted.append(back)  # for the worker's own release, should the writer be gone
            writer.submit(back)
            raise
        except Exception as exc:  # nothing escapes a record: the exception is its recorded error
            ep, started, stage = where["ep"], where["started"], where["stage"]
            message = redact(f"{exc.__class__.__name__} during {stage}: {exc}")[:2000]
            log.error("record %d: %s", claimed.id, message)
            if stage == "send" and ep is not None:
                host.pool.abandon(ep)
            attempts.append({"n": len(attempts) + 1, "t": round(started, 3), "endpoint": ep.label if ep else None,
                             "ok": False, "kind": "internal_error", "status": None, "error": message,
                             "latency_s": round(time.time() - started, 4)})
            host.stats.errors += 1
            host.stats.record(False, 0)
            outcome = Outcome(claimed.id, claimed.idx, "error", claimed.messages, attempts=attempts,
                              prior_attempts=prior, error_kind="internal_error", error=message,
                              endpoint=ep.label if ep else None, finished_at=time.time(), config_version=version,
                              rerun=claimed.rerun, turns=done_turns if multi else None,
                              billed=where.get("billed") or (0, 0, 0))
        writer.submit(outcome)
