"""A prompt's samples as one request (``samples_in_one_request``, docs/samples.md): the claim hands the worker a
prompt's pending samples together; one request asks for ``n`` = their count, seeded with the first sample's
seed; choice i of the reply becomes the record of the i-th sample (its own text, finish reason, token ids and
counts, through the same Outcome a single request gives). Whatever happens to the request happens to each of its
records: a failure is each record's recorded error, an interruption sends each back to pending with the
interrupted attempt. A server that answers fewer choices than asked (it ignores ``n``) leaves the other samples
to single requests, one after the other in this task's slot, with one log line saying so."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import orjson

from ..capture.token_count import billed_tokens
from ..redact import redact
from ..store import queue as store
from . import faults
from .results import TIMEOUT_KINDS, AttemptResult, Outcome

log = logging.getLogger("synthwatch.worker")


class Tasks(Protocol):
    """What this module needs of synthwatch.workers.record.RecordTasks."""

    host: Any

    async def attempts(self, body: bytes, attempts: list[dict[str, Any]], record_id: int, where: dict[str, Any],
                       n: int = 1) -> AttemptResult: ...
    async def process(self, claimed: store.Claimed) -> None: ...
    def count_ok(self, ex: Any, latency_s: float, ep: Any) -> None: ...


def request_billed(choices: list[tuple[int, Any]], body_len: int) -> tuple[int, int, int]:
    """What one request with several choices is billed: its prompt once, every choice's completion."""
    p = c = e = 0
    for k, (_, ex) in enumerate(choices):
        b = choice_billed(ex, body_len, k == 0)
        p, c, e = p + b[0], c + b[1], e + b[2]
    return p, c, e


def choice_billed(ex: Any, body_len: int, first: bool) -> tuple[int, int, int]:
    """One choice's share: the first choice carries the prompt (prefilled once), each its own completion."""
    b = billed_tokens(ex, body_len)
    return b if first else (0, b[1], min(b[2], b[1]))


async def process_group(tasks: Tasks, group: list[store.Claimed]) -> None:
    host = tasks.host
    writer = host.writer
    assert writer is not None
    group = sorted(group, key=lambda c: c.sample_index)
    first = group[0]
    version = host.config_version
    where: dict[str, Any] = {"stage": "claim", "ep": None, "started": time.time()}
    own = {c.id: orjson.loads(c.attempts_json) if c.attempts_json else [] for c in group}
    shared: list[dict[str, Any]] = []  # this request's attempts, added to each record's own
    missing: list[store.Claimed] = []
    outcomes: list[Outcome] = []
    try:
        faults.hit("claim")
        where["stage"] = "request build"
        faults.hit("request build")
        body = host.body_for(first.messages, first.sample_index, n=len(group))
        last = await tasks.attempts(body, shared, first.id, where, n=len(group))
        where["stage"] = "write"
        faults.hit("write")
        now = time.time()
        billed = where.get("billed") or (0, 0, 0)
        if last.ok:
            got = dict(last.choices or [(0, last.extracted)])
            for pos, c in enumerate(group):
                ex = got.get(pos)
                if ex is None:
                    missing.append(c)
                    continue
                b = choice_billed(ex, len(body), pos == 0)
                # the first record's columns: every attempt of the request (the failed ones too), the last one's share
                rb = tuple(t - lb + x for t, lb, x in zip(billed, last.billed, b, strict=True)) if pos == 0 else b
                tasks.count_ok(ex, last.latency_s, where.get("ep"))
                outcomes.append(Outcome(
                    c.id, c.idx, "ok", c.messages, extracted=ex, attempts=own[c.id] + shared, endpoint=last.endpoint,
                    latency_s=last.latency_s, ttft_s=last.ttft_s, n_chunks=ex.n_chunks or last.n_chunks,
                    finished_at=now, config_version=version, rerun=c.rerun,
                    billed=(rb[0], rb[1], rb[2]),
                    attempt_billed=b))
            if missing:
                log.warning("record %d: the server answered %d of the %d choices asked for (n = %d; it does not"
                            " support n): the other %d samples are asked one request each", first.id,
                            len(group) - len(missing), len(group), len(group), len(missing))
        else:
            status = "timeout" if last.kind in TIMEOUT_KINDS else "error"
            for pos, c in enumerate(group):
                outcomes.append(Outcome(
                    c.id, c.idx, status, c.messages, extracted=last.extracted if pos == 0 else None,
                    attempts=own[c.id] + shared, error_kind=last.kind, error=last.message, endpoint=last.endpoint,
                    latency_s=last.latency_s, ttft_s=last.ttft_s, n_chunks=last.n_chunks, finished_at=now,
                    config_version=version, rerun=c.rerun, billed=billed if pos == 0 else (0, 0, 0)))
                if status == "timeout":
                    host.stats.timeouts += 1
                else:
                    host.stats.errors += 1
                host.stats.record(False, 0)
    except asyncio.CancelledError:
        ep, started = where["ep"], where["started"]
        if ep is not None:
            host.pool.abandon(ep)
        why = host.stop_reason or "interrupted: the worker stopped"
        for c in group:
            attempts = own[c.id] + shared
            if where.get("sending"):  # the request was under way: each record's attempt is recorded as interrupted
                attempts = [*attempts, {"n": len(attempts) + 1, "t": round(started, 3),
                                        "endpoint": ep.label if ep else None, "ok": False, "kind": "interrupted",
                                        "status": None, "error": f"{why}; the record went back to pending",
                                        "latency_s": round(time.time() - started, 4)}]
            back = Outcome(c.id, c.idx, "pending", c.messages, attempts=attempts, error_kind="interrupted",
                           error=why, finished_at=time.time(), endpoint=ep.label if ep else None)
            host.interrupted.append(back)
            writer.submit(back)
        raise
    except Exception as exc:  # nothing escapes: the exception is each record's recorded error
        ep, started, stage = where["ep"], where["started"], where["stage"]
        message = redact(f"{exc.__class__.__name__} during {stage}: {exc}")[:2000]
        log.error("records %s: %s", ",".join(str(c.id) for c in group), message)
        if stage == "send" and ep is not None:
            host.pool.abandon(ep)
        outcomes, missing = [], []
        for c in group:
            attempts = own[c.id] + shared
            attempts = [*attempts, {"n": len(attempts) + 1, "t": round(started, 3),
                                    "endpoint": ep.label if ep else None, "ok": False, "kind": "internal_error",
                                    "status": None, "error": message, "latency_s": round(time.time() - started, 4)}]
            host.stats.errors += 1
            host.stats.record(False, 0)
            outcomes.append(Outcome(c.id, c.idx, "error", c.messages, attempts=attempts, error_kind="internal_error",
                                    error=message, endpoint=ep.label if ep else None, finished_at=time.time(),
                                    config_version=version, rerun=c.rerun,
                                    billed=(where.get("billed") or (0, 0, 0)) if c is first else (0, 0, 0)))
    for o in outcomes:
        writer.submit(o)
    for done, c in enumerate(missing):  # the server ignored n: each of these samples gets a request of its own
        try:
            await tasks.process(c)
        except asyncio.CancelledError:  # the ones not started yet go back to pending too
            why = host.stop_reason or "interrupted: the worker stopped"
            for rest in missing[done + 1:]:
                back = Outcome(rest.id, rest.idx, "pending", rest.messages, attempts=own[rest.id],
                               error_kind="interrupted", error=why, finished_at=time.time())
                host.interrupted.append(back)
                writer.submit(back)
            raise
