"""The simulator's sending side (a part of :class:`server.Simulator`): a reply written at once, after a delay, or
paced one token at a time, with the stream faults, and counted in /metrics (server_view)."""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from typing import Any

import orjson

from .chat import DONE_EVENT, FAILURE_TEXT, NO_FAULTS, Faults, Reply, StreamChunks, completion_body, usage_body
from .config import PREEMPT_PAUSE_S, SimConfig
from .http import SSE_TYPE, Conn, HttpRequest, chunk_frame, error_json, response_head
from .server_view import ServerView


class ReplySender:
    """Writes replies; :class:`server.Simulator` routes requests, draws faults and builds the replies."""

    config: SimConfig
    view: ServerView
    stats: dict[str, Any]
    _chunk_prefix: bytes
    _preempt_rng: random.Random
    _fingerprint_json: bytes

    def _finished(self) -> None:
        self.stats["in_flight"] -= 1
        self.stats["completed"] += 1

    # what multi.py (n choices in one request) sends with
    def finished(self) -> None:
        self._finished()

    def stream_parts(self, reply: Reply) -> list[bytes]:
        return self._stream_parts(reply)

    def chunk_prefix(self, request_id: bytes, created: int) -> bytes:
        return self._chunk_prefix % (request_id, created)

    def delayed_reply(self, conn: Conn, delay: float, payload: bytes, keep_alive: bool,
                      tokens: tuple[int, int]) -> Any:
        return self._delayed_reply(conn, delay, payload, keep_alive, tokens)

    # non-streamed replies
    def _send_json(
        self, conn: Conn, req: HttpRequest, reply: Reply, faults: Faults, request_id: bytes, created: int
    ) -> None:
        if reply.json_tail is None:
            reply.json_tail = orjson.dumps(completion_body(reply, self.config))[1:]
        payload = b'{"id":"%s","object":"chat.completion","created":%d,%s' % (
            request_id,
            created,
            reply.json_tail,
        )
        if faults.truncated_json:
            payload = payload[: len(payload) // 2]
        cfg = self.config
        if cfg.ttft_ms > 0 or cfg.tokens_per_s > 0:
            delay = cfg.ttft_ms / 1000
            if cfg.tokens_per_s > 0:
                delay += reply.plan.tokens(reply.cut)[0] / cfg.tokens_per_s
            conn.start_task(self._delayed_reply(conn, delay, payload, req.keep_alive, self._tokens(reply)))
            return
        conn.respond(200, payload, req.keep_alive)
        self.view.observe(prompt_tokens=reply.prompt_tokens, completion_tokens=self._tokens(reply)[1], queued_s=0.0,
                          ttft_s=0.0, e2e_s=0.0, finish=reply.finish)
        self._finished()

    def _send_stream(
        self, conn: Conn, req: HttpRequest, reply: Reply, faults: Faults, request_id: bytes, created: int
    ) -> None:
        cfg = self.config
        parts = reply.stream_parts or self._stream_parts(reply)
        prefix = self._chunk_prefix % (request_id, created)
        paced = cfg.tokens_per_s > 0 or cfg.ttft_ms > 0 or faults.stall
        chunked, keep_alive = req.http11, req.keep_alive and req.http11
        head = response_head(200, SSE_TYPE, None if chunked else -1, keep_alive)
        if not paced and faults is NO_FAULTS and chunked and not reply.chat.continuous_usage:
            body = prefix + prefix.join(parts) + DONE_EVENT
            conn.write(b"%s%x\r\n%s\r\n0\r\n\r\n" % (head, len(body), body))
            if not keep_alive:
                conn.close()
            self._observe_unpaced(reply)
            self._finished()
            return
        chunks = StreamChunks(prefix, parts, reply.chat.include_usage,
                              reply.prompt_tokens if reply.chat.continuous_usage else -1)
        drop_at = self._stream_faults(chunks, faults, request_id)
        if paced:
            stall_at = len(chunks) // 2 if faults.stall else -1
            if cfg.rate_preempt and self._preempt_rng.random() < cfg.rate_preempt:
                chunks.preempt_at = len(chunks) // 2
            conn.start_task(self._paced_stream(conn, head, chunks, stall_at, drop_at, chunked, keep_alive,
                                               self._tokens(reply), reply.finish))
            return
        if drop_at >= 0:
            conn.write(head + chunk_frame(chunks.join(0, drop_at), chunked))
            conn.close()
            self._observe_unpaced(reply, finish="abort")
        else:
            conn.write(
                head + chunk_frame(chunks.join(0, len(chunks)), chunked) + (b"0\r\n\r\n" if chunked else b"")
            )
            if not keep_alive:
                conn.close()
            self._observe_unpaced(reply)
        self._finished()

    def _observe_unpaced(self, reply: Reply, finish: str | None = None) -> None:
        """/metrics counts a reply sent at once like any other (it had no queue and no time to first token)."""
        self.view.observe(prompt_tokens=reply.prompt_tokens, completion_tokens=self._tokens(reply)[1], queued_s=0.0,
                          ttft_s=0.0, e2e_s=0.0, finish=finish or reply.finish)

    def _stream_parts(self, reply: Reply) -> list[bytes]:
        """The stream's SSE events without their common ``data: {"id":…,"model":…,`` prefix.

        The role chunk, one part per token chunk, then the usage chunk when it was asked for.
        """
        plan, chat = reply.plan, reply.chat
        parts = [
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}],"prompt_token_ids":%s,"prompt_text":%s}\n\n'
            % (orjson.dumps(reply.prompt_ids), orjson.dumps(reply.prompt_text))
        ]
        shown_events, deltas, ids_jsons, suffixes = plan.stream()
        shown = bisect.bisect_left(shown_events, reply.cut)
        if shown:
            parts += suffixes[: shown - 1]
            delta, ids_json = deltas[shown - 1], ids_jsons[shown - 1]
        else:
            delta, ids_json = b'{"content":""}', b"[]" if chat.with_ids else b"null"
        lp_json = b"null"
        if plan.logprobs is not None:
            lp_json = plan.lp_json[shown - 1] if shown else b'{"content":[]}'
        last = b'"choices":[{"index":0,"delta":%s,"logprobs":%s,"finish_reason":"%s","stop_reason":%s,' % (
            delta,
            lp_json,
            reply.finish.encode(),
            orjson.dumps(reply.stop_reason),
        )
        last += b'"token_ids":%s}]' % ids_json
        # vLLM stamps the fingerprint on the finish chunk, or on the usage chunk when there is one.
        if chat.include_usage:
            parts.append(last + b"}\n\n")
            usage = orjson.dumps(usage_body(reply, exclude_none=True))
            parts.append(
                b'"choices":[],"usage":%s,"system_fingerprint":%s}\n\n' % (usage, self._fingerprint_json)
            )
        else:
            parts.append(last + b',"system_fingerprint":%s}\n\n' % self._fingerprint_json)
        reply.stream_parts = parts
        return parts

    def _stream_faults(self, chunks: StreamChunks, faults: Faults, request_id: bytes) -> int:
        """Apply stream faults to ``chunks``; returns the chunk index to drop the connection at (-1: none)."""
        if not (faults.status == "error_body" or faults.malformed or faults.drop):
            return -1
        n = len(chunks)
        at = min(n - 1, max(1, int(faults.position * n))) if n > 1 else 0
        # With a single token chunk the fault comes right after the role chunk.
        before = chunks.role_chunk() if at == 0 else b""
        if faults.status == "error_body":
            error = b"data: " + error_json(500, "InternalServerError", FAILURE_TEXT) + b"\n\n"
            chunks.override[at] = before + error + DONE_EVENT
            chunks.n = at + 1
            return -1
        if faults.malformed:
            broken = b'data: {"id":"%s","object":"chat.completion.chunk","choices":[\n\n' % request_id
            # The token chunk is lost; the usage chunk and [DONE] after it still come.
            chunks.override[at] = before + broken + chunks.tail(at)
        if faults.drop:
            if at == 0:
                chunks.override[0] = before
                return 1
            return at
        return -1

    def _tokens(self, reply: Reply) -> tuple[int, int]:
        return reply.prompt_tokens, reply.plan.tokens(reply.cut)[0]

    async def _delayed_reply(self, conn: Conn, delay: float, payload: bytes, keep_alive: bool,
                             tokens: tuple[int, int]) -> None:
        t0 = time.monotonic()
        try:
            async with self.view.slot() as queued:
                await asyncio.sleep(delay)
                conn.respond(200, payload, keep_alive)
            self.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=queued,
                              ttft_s=queued + self.config.ttft_ms / 1000, e2e_s=time.monotonic() - t0)
        finally:
            self._finished()

    async def _paced_stream(
        self,
        conn: Conn,
        head: bytes,
        chunks: StreamChunks,
        stall_at: int,
        drop_at: int,
        chunked: bool,
        keep_alive: bool,
        tokens: tuple[int, int] = (0, 0),
        finish: str = "stop",
    ) -> None:
        """Send one chunk per token at tokens_per_s after ttft_ms; one task per stream, not per token."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        end = drop_at if drop_at >= 0 else len(chunks)
        t0 = time.monotonic()
        try:
            conn.write(head)
            async with self.view.slot() as queued:
                tps = cfg.tokens_per_s
                if tps > 0 and cfg.batch_slowdown > 0:  # a bigger batch makes every token slower
                    tps /= 1 + self.view.running / cfg.batch_slowdown
                interval = 1.0 / tps if tps > 0 else 0.0
                await self._paced_body(conn, chunks, stall_at, drop_at, chunked, keep_alive, loop, interval, end)
            self.view.observe(prompt_tokens=tokens[0], completion_tokens=tokens[1], queued_s=queued,
                              ttft_s=queued + cfg.ttft_ms / 1000, e2e_s=time.monotonic() - t0,
                              finish="abort" if drop_at >= 0 or conn.closed else finish)
        finally:
            self._finished()

    async def _paced_body(self, conn: Conn, chunks: StreamChunks, stall_at: int, drop_at: int, chunked: bool,
                          keep_alive: bool, loop: asyncio.AbstractEventLoop, interval: float, end: int) -> None:
        cfg = self.config
        if cfg.ttft_ms > 0:
            await asyncio.sleep(cfg.ttft_ms / 1000)
        start = loop.time()
        i = 0
        preempt_at = chunks.preempt_at
        while i < end:
            if preempt_at >= 0 and i >= preempt_at:
                preempt_at = -1
                if self.view.waiting > 0:  # only under pressure: requests are queued for the batch
                    self.view.preempted()
                    await asyncio.sleep(PREEMPT_PAUSE_S)
                    start += PREEMPT_PAUSE_S
            if i == stall_at:
                await asyncio.sleep(cfg.stall_s)
                start += cfg.stall_s
                stall_at = -1
            if interval:
                due = int((loop.time() - start) / interval) + 1
                j = min(end, max(i + 1, due))
            else:
                j = end
            if stall_at > i:
                j = min(j, stall_at)
            conn.write(chunk_frame(chunks.join(i, j), chunked))
            i = j
            if conn.paused:
                await conn.drain()
            if conn.closed:
                return
            if i < end and interval:
                wait = start + i * interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
        if drop_at >= 0:
            conn.close()
            return
        if chunked:
            conn.write(b"0\r\n\r\n")
        if not keep_alive:
            conn.close()
