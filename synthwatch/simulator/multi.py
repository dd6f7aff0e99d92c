"""``n`` choices in one request, as vLLM's OpenAI server sends them (its ``serving_chat``):

- the reply carries n choices, each with its ``index`` (0 … n-1), its own ``finish_reason`` and ``stop_reason``, and
  its ``token_ids`` with ``return_token_ids``;
- streamed, the first chunks are one role chunk per choice (index 0 … n-1), then each engine step sends one chunk
  per choice that produced a token, in index order, so the choices' deltas are interleaved; a choice's finish chunk
  comes at the step it ends; the usage chunk (``include_usage``) comes once, after every choice ended;
- usage is the request's: ``prompt_tokens`` once (the prompt is prefilled once), ``completion_tokens`` the sum over
  the choices (``reasoning_tokens`` likewise); with ``continuous_usage_stats`` a chunk's usage counts its own
  choice's tokens so far;
- the prompt is prefilled once: the time to first token (``ttft_ms``) is paid once per request, then every step
  decodes one token of every unfinished choice.

Choice i is the reply the same request with ``seed + i`` gets (seed 0 when none is given): a simulator's choice of
determinism, so that an ``n = k`` run can be compared record for record with k single-sample requests. Faults
inside a stream (stall, drop, malformed) are not drawn for such a request; whole-reply faults (429, 500, wrong
content type) are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from typing import Any, Protocol

import orjson

from .chat import DONE_EVENT, ChatRequest, Reply, completion_body, usage_body
from .config import SimConfig
from .http import SSE_TYPE, Conn, HttpRequest, chunk_frame, response_head
from .server_view import ServerView


class Simulator(Protocol):
    """What this module needs of synthwatch.simulator.server.Simulator."""

    config: SimConfig
    view: ServerView
    stats: dict[str, Any]

    def build_reply(self, chat: ChatRequest, key: bytes) -> Reply: ...
    def stream_parts(self, reply: Reply) -> list[bytes]: ...
    def chunk_prefix(self, request_id: bytes, created: int) -> bytes: ...
    def finished(self) -> None: ...
    def delayed_reply(self, conn: Conn, delay: float, payload: bytes, keep_alive: bool,
                      tokens: tuple[int, int]) -> Any: ...

MAX_N = 128  # vLLM refuses nothing below its max_num_seqs; a bound keeps one request's work bounded here
_INDEX0 = re.compile(rb'^"choices":\[\{"index":0,')


def replies(sim: Simulator, chat: ChatRequest, raw: bytes) -> list[Reply]:
    """The n choices' replies: choice i is the reply to the same request with ``seed + i``."""
    base = chat.seed if type(chat.seed) is int else 0
    out = []
    for i in range(chat.n):
        one = dataclasses.replace(chat, n=1, seed=base + i if (i or chat.seed is not None) else None)
        key = b"%s\x00n%d" % (raw, i)  # the reply caches are keyed by the body: one key per choice
        out.append(sim.build_reply(one, key))
    return out


def usage(rs: list[Reply], exclude_none: bool) -> dict[str, Any]:
    """The request's usage: the prompt counted once, the completions summed (vLLM's ``UsageInfo`` for n > 1)."""
    total = usage_body(rs[0], exclude_none)
    for r in rs[1:]:
        u = usage_body(r, exclude_none)
        total["completion_tokens"] += u["completion_tokens"]
        details = total.get("completion_tokens_details")
        if isinstance(details, dict):
            details["reasoning_tokens"] += (u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return total


def json_payload(sim: Simulator, rs: list[Reply], request_id: bytes, created: int) -> bytes:
    body = completion_body(rs[0], sim.config)
    choices = []
    for i, r in enumerate(rs):
        c = completion_body(r, sim.config)["choices"][0]
        c["index"] = i
        choices.append(c)
    body["choices"] = choices
    body["usage"] = usage(rs, exclude_none=False)
    return orjson.dumps({"id": request_id.decode(), "object": "chat.completion", "created": created, **body})


def _reindex(part: bytes, i: int) -> bytes:
    return _INDEX0.sub(b'"choices":[{"index":%d,' % i, part, count=1) if i else part


def stream_steps(sim: Simulator, rs: list[Reply], prefix: bytes) -> list[bytes]:
    """The stream as one bytes object per engine step: the role chunks, then each step's chunks (one per choice
    still generating, index order), the usage chunk and [DONE] after the last."""
    include_usage = rs[0].chat.include_usage
    continuous = rs[0].prompt_tokens if rs[0].chat.continuous_usage else -1
    per: list[list[bytes]] = []
    for i, r in enumerate(rs):
        parts = r.stream_parts or sim.stream_parts(r)
        if include_usage:
            parts = parts[:-1]  # the choice's own usage chunk: the request sends one, summed
        per.append([_reindex(p, i) for p in parts])
    steps = [b"".join(prefix + p[0] for p in per)]
    n_steps = max(len(p) for p in per) - 1
    for k in range(1, n_steps + 1):
        out = []
        for p in per:
            if k < len(p):
                part = p[k]
                if continuous >= 0 and part.endswith(b"}\n\n"):
                    part = part[:-3] + b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
                        continuous, continuous + k, k)
                out.append(prefix + part)
        steps.append(b"".join(out))
    tail = b""
    if include_usage:
        tail = prefix + b'"choices":[],"usage":%s,"system_fingerprint":%s}\n\n' % (
            orjson.dumps(usage(rs, exclude_none=True)), orjson.dumps(sim.config.fingerprint))
    steps[-1] += tail + DONE_EVENT
    return steps


def send(sim: Simulator, conn: Conn, req: HttpRequest, chat: ChatRequest, raw: bytes, request_id: bytes,
         created: int) -> None:
    """Answer a request with n > 1 choices (its whole-reply faults were drawn by the caller)."""
    rs = replies(sim, chat, raw)
    sim.stats["prefills"] += 1
    sim.stats["prefill_tokens"] += rs[0].prompt_tokens
    cfg = sim.config
    tokens = (rs[0].prompt_tokens, sum(r.plan.tokens(r.cut)[0] for r in rs))
    finish = rs[0].finish
    paced = cfg.tokens_per_s > 0 or cfg.ttft_ms > 0
    if not chat.stream:
        payload = json_payload(sim, rs, request_id, created)
        if paced:
            longest = max(r.plan.tokens(r.cut)[0] for r in rs)  # the choices decode side by side
            delay = cfg.ttft_ms / 1000 + (longest / cfg.tokens_per_s if cfg.tokens_per_s > 0 else 0.0)
            conn.start_task(sim.delayed_reply(conn, delay, payload, req.keep_alive, tokens))
            return
        conn.respond(200, payload, req.keep_alive)
        sim.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=0.0, ttft_s=0.0, e2e_s=0.0,
                         finish=finish)
        sim.finished()
        return
    sim.stats["streamed"] += 1
    steps = stream_steps(sim, rs, sim.chunk_prefix(request_id, created))
    chunked, keep_alive = req.http11, req.keep_alive and req.http11
    head = response_head(200, SSE_TYPE, None if chunked else -1, keep_alive)
    if not paced:
        conn.write(head + chunk_frame(b"".join(steps), chunked) + (b"0\r\n\r\n" if chunked else b""))
        if not keep_alive:
            conn.close()
        sim.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=0.0, ttft_s=0.0, e2e_s=0.0,
                         finish=finish)
        sim.finished()
        return
    conn.start_task(_paced(sim, conn, head, steps, chunked, keep_alive, tokens, finish))


async def _paced(sim: Simulator, conn: Conn, head: bytes, steps: list[bytes], chunked: bool, keep_alive: bool,
                 tokens: tuple[int, int], finish: str) -> None:
    """The role chunks after one time to first token (one prefill), then one step per token interval."""
    cfg = sim.config
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    try:
        conn.write(head)
        async with sim.view.slot() as queued:
            if cfg.ttft_ms > 0:
                await asyncio.sleep(cfg.ttft_ms / 1000)
            interval = 1.0 / cfg.tokens_per_s if cfg.tokens_per_s > 0 else 0.0
            start = loop.time()
            for k, step in enumerate(steps):
                conn.write(chunk_frame(step, chunked))
                if conn.paused:
                    await conn.drain()
                if conn.closed:
                    break
                if interval and k + 1 < len(steps):
                    wait = start + (k + 1) * interval - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
            else:
                if chunked:
                    conn.write(b"0\r\n\r\n")
                if not keep_alive:
                    conn.close()
        sim.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=queued,
                         ttft_s=queued + cfg.ttft_ms / 1000, e2e_s=time.monotonic() - t0,
                         finish="abort" if conn.closed else finish)
    finally:
        sim.finished()
