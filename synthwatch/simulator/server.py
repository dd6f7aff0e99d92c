"""An OpenAI-compatible chat server shaped like vLLM >= 0.16, for tests, the demo and benchmarks.

It speaks HTTP/1.1 itself on a raw :class:`asyncio.Protocol` (keep-alive, Content-Length bodies,
chunked transfer encoding for streams) because it is the benchmark target and must stay far faster
than any client it is pointed at. Requests that need no waiting are answered synchronously inside
``data_received``: no task, one ``transport.write`` for the whole response. Paced streams
(``tokens_per_s``, ``ttft_ms``, stalls) get one task each that sleeps until the next token is due.

What a reply looks like is decided in three cached steps:

1. :func:`answers._generate` turns (seed, messages) into reasoning pieces and content pieces (a "token" is a
   word or punctuation piece with its leading whitespace).
2. :func:`token_plan.plan_events` lays those pieces out for one ``reasoning_field`` mode: which delta key each
   piece goes to, its token ids and how many tokens it counts for.
3. :class:`plan.Plan` serialises every event once, and the finished reply (minus its id and
   timestamp) is cached per request body, so a repeated request only glues bytes together.

The wire format follows vLLM's ``serving_chat`` code: key order and nulls; ``system_fingerprint``
on the finish chunk, or on the usage chunk when ``include_usage`` is set; a ``delta: {}`` chunk for
the ``</think>`` token only when ``return_token_ids`` is set; ``completion_tokens_details`` only
where a reasoning parser runs (the ``reasoning``, ``reasoning_content`` and ``both`` modes).
Token accounting: ``completion_tokens`` counts every generated token, including the ``</think>``
token in parser modes and the think tags in inline modes; ``reasoning_tokens`` counts the
reasoning text only. With ``token_ids="deepseek"`` the ids look like vLLM 0.32's with a DeepSeek
R1-style template: in the parser modes the prompt ids end with the prefilled ``<think>`` and newline,
and the completion ids end with EOS (id 1, counted as a token) only when the reply stopped by itself.
A request offering ``tools`` whose last message is the user's is answered with a call of the first tool
(after the reasoning), as vLLM's tool parser returns it: ``content`` null, ``finish_reason``
``tool_calls``, the arguments as JSON text, streamed as a delta with the call's id and name and then the
arguments in pieces.

The package: config.py (SimConfig, modes, fault kinds), answers.py (what the model says), token_plan.py
(token ids, events, pre-serialised plans), http.py (the HTTP protocol), chat.py (one request and its reply
body), server.py (the Simulator: routing, faults, caches), sending.py (writing replies: at once, delayed or paced,
with the stream faults), server_view.py (the engine's queue and
/metrics), launch.py (flags, a blocking run, a server in a thread), multi.py (a request with ``n`` > 1: n choices,
interleaved by index when streamed, usage summed, one prefill).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from typing import Any

import orjson

from . import multi
from .answers import Gen, generate_answer
from .chat import (
    CACHE_TOKENS,
    FAILURE_TEXT,
    NO_FAULTS,
    ChatRequest,
    Faults,
    Reply,
    RequestError,
    bad_request,
)
from .config import FAULT_KINDS, PARSER_MODES, SimConfig
from .http import JSON_TYPE, Conn, HttpRequest, error_json
from .logprobs import entries as logprob_entries
from .plan import Plan
from .sending import ReplySender
from .server_view import ServerView
from .token_plan import TokenIds, apply_stop, deepseek_tokenizer, plan_events


class Simulator(ReplySender):
    """The simulated server. Create, ``await start()``, ``await stop()``.

    ``stats`` is a live dict: requests, chat_requests, streamed, completed, bad_requests,
    client_disconnects, errors_injected (by kind), in_flight, max_in_flight, connections,
    max_connections.
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats: dict[str, Any] = {
            "requests": 0,
            "chat_requests": 0,
            "streamed": 0,
            "completed": 0,
            "bad_requests": 0,
            "client_disconnects": 0,
            "errors_injected": dict.fromkeys(FAULT_KINDS, 0),
            "in_flight": 0,
            "max_in_flight": 0,
            "connections": 0,
            "max_connections": 0,
            "prefills": 0,  # chat requests whose prompt was prefilled (one per request, whatever its n)
            "prefill_tokens": 0,  # the prompt tokens of those prefills
            "n_asked": {},  # requests per n asked for ("1", "4", ...), answered or not
        }
        self.conns: set[Conn] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._created = int(time.time())
        self._apply_config(config)

    def _apply_config(self, config: SimConfig) -> None:
        seed_changed = not hasattr(self, "_fault_rng") or config.seed != self.config.seed
        self.config = config
        kept = getattr(self, "_kept", ())
        self._kept: deque[Any] = deque(kept, maxlen=config.keep_requests or 1)
        if seed_changed:
            self._fault_rng = random.Random(config.seed)
            self._preempt_rng = random.Random(config.seed + 1)
        self._any_faults = any(getattr(config, name) > 0 for name in config.fault_rates())
        self._ids: TokenIds | None = None if config.token_ids == "deepseek" else TokenIds("words")
        self._gens: dict[bytes, Gen] = {}
        self._replies: dict[bytes, Reply] = {}
        self._cached_tokens = 0
        model_json = orjson.dumps(config.model).replace(b"%", b"%%")
        self._chunk_prefix = (
            b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":' + model_json + b","
        )
        self._fingerprint_json = orjson.dumps(config.fingerprint)
        view = getattr(self, "view", None)
        if view is None or (view.kind, view.model) != (config.server_kind, config.model):
            self.view = ServerView(config.server_kind, config.server_version, config.capacity, config.model,
                                   config.max_model_len)
        else:  # counters and the queue carry on: a server whose settings changed is still the same server
            view.capacity, view.version = config.capacity, config.server_version
        self.view.kv_max_concurrency = config.kv_max_concurrency or config.capacity

    def update_config(self, **changes: Any) -> SimConfig:
        """Change config fields at run time (what ``PATCH /sim/config`` does)."""
        self._apply_config(self.config.updated(changes))
        return self.config

    def _token_ids(self) -> TokenIds:
        if self._ids is None:
            self._ids = TokenIds(self.config.token_ids)
        return self._ids

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 = any free port) and return the bound port."""
        loop = asyncio.get_running_loop()
        if self.config.token_ids == "deepseek":
            await loop.run_in_executor(None, deepseek_tokenizer)
        self._server = await loop.create_server(lambda: Conn(self), host, port, backlog=4096)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Stop listening, close every connection and end every stream task."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.abort()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await asyncio.sleep(0)

    # routing
    def dispatch(self, conn: Conn, req: HttpRequest) -> None:
        self.stats["requests"] += 1
        method, path = req.method, req.path
        if path.startswith("/v1/sim/"):
            path = path[3:]
        if path == "/v1/chat/completions":
            if method == "POST":
                self._chat(conn, req)
                return
        elif path == "/v1/models":
            if method == "GET":
                conn.respond(200, self._models_body(), req.keep_alive)
                return
        elif path == "/health":
            if method == "GET":
                conn.respond(200, b"", req.keep_alive)
                return
        elif path in ("/metrics", "/version", "/get_server_info"):
            if method == "GET":
                body = (self.view.metrics() if path == "/metrics" else self.view.version_body()
                        if path == "/version" else self.view.server_info())
                if body is None:
                    conn.respond(404, b'{"detail":"Not Found"}', req.keep_alive)
                else:
                    ctype = b"text/plain; version=0.0.4; charset=utf-8" if path == "/metrics" else JSON_TYPE
                    conn.respond(200, body, req.keep_alive, ctype=ctype)
                return
        elif path == "/sim/config":
            if method == "GET":
                conn.respond(200, orjson.dumps(self.config.to_dict()), req.keep_alive)
                return
            if method == "PATCH":
                self._patch_config(conn, req)
                return
        elif path == "/sim/stats":
            if method == "GET":
                conn.respond(200, orjson.dumps(self.stats), req.keep_alive)
                return
        elif path == "/sim/requests":
            if method == "GET":
                kept = list(self._kept) if self.config.keep_requests else []
                conn.respond(200, orjson.dumps(kept), req.keep_alive)
                return
        else:
            conn.respond(404, b'{"detail":"Not Found"}', req.keep_alive)
            return
        conn.respond(405, b'{"detail":"Method Not Allowed"}', req.keep_alive)

    def _models_body(self) -> bytes:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": self._created,
            "owned_by": "synthwatch-sim",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [],
        }
        return orjson.dumps({"object": "list", "data": [card]})

    def _patch_config(self, conn: Conn, req: HttpRequest) -> None:
        try:
            changes = orjson.loads(req.body)
            if not isinstance(changes, dict):
                raise ValueError("send a JSON object of config fields")
            self.update_config(**changes)
        except (ValueError, TypeError) as exc:
            conn.respond(400, error_json(400, "BadRequestError", str(exc)), req.keep_alive)
            return
        conn.respond(200, orjson.dumps(self.config.to_dict()), req.keep_alive)

    def _bad_request(self, conn: Conn, req: HttpRequest, message: str, param: str | None = None) -> None:
        self.stats["bad_requests"] += 1
        conn.respond(400, error_json(400, "BadRequestError", message, param), req.keep_alive)

    def _draw_faults(self, stream: bool) -> Faults:
        """Draw every fault for one request (always the same number of draws, so runs repeat)."""
        cfg = self.config
        draws = {kind: self._fault_rng.random() < getattr(cfg, "rate_" + kind) for kind in FAULT_KINDS}
        faults = Faults(position=self._fault_rng.random())
        for kind in ("429", "500", "wrong_content_type", "error_body"):
            if draws[kind]:
                faults.status = kind
                return faults
        faults.empty_reasoning = draws["empty_reasoning"]
        if stream:
            faults.stall, faults.drop, faults.malformed = draws["stall"], draws["drop"], draws["malformed"]
        else:
            faults.truncated_json = draws["truncated_json"]
        if not (
            faults.empty_reasoning or faults.stall or faults.drop or faults.malformed or faults.truncated_json
        ):
            return NO_FAULTS
        return faults

    def _count_faults(self, faults: Faults) -> None:
        counts = self.stats["errors_injected"]
        if faults.status:
            counts[faults.status] += 1
        for kind in ("stall", "drop", "malformed", "truncated_json", "empty_reasoning"):
            if getattr(faults, kind):
                counts[kind] += 1

    # /v1/chat/completions
    def _chat(self, conn: Conn, req: HttpRequest) -> None:
        self.stats["chat_requests"] += 1
        raw = req.body
        cached = self._replies.get(raw)
        try:
            chat = cached.chat if cached is not None else ChatRequest.parse(raw, self.config.model)
            if self.config.refuse_response_format and b'"response_format"' in raw:
                raise bad_request("response_format is not supported by this server", "response_format")
            if self.config.keep_requests:
                self._kept.append(chat.messages)
            asked = self.stats["n_asked"]
            asked[str(chat.n)] = asked.get(str(chat.n), 0) + 1
            faults = NO_FAULTS
            if self._any_faults:
                faults = self._draw_faults(chat.stream)
                self._count_faults(faults)
            if faults.status is not None and self._send_fault(conn, req, faults, chat.stream):
                return
            if cached is not None and not faults.empty_reasoning:
                reply = cached
            else:
                reply = self._reply(chat, faults, raw)
        except RequestError as exc:
            if exc.status == 400:
                self.stats["bad_requests"] += 1
            conn.respond(exc.status, exc.body(), req.keep_alive)
            return
        stats = self.stats
        stats["in_flight"] += 1
        if stats["in_flight"] > stats["max_in_flight"]:
            stats["max_in_flight"] = stats["in_flight"]
        request_id = b"chatcmpl-%032x" % random.getrandbits(128)
        created = int(time.time())
        if chat.n > 1 and not self.config.ignore_n:
            try:
                multi.send(self, conn, req, chat, raw, request_id, created)
            except RequestError as exc:
                self._finished()
                conn.respond(exc.status, exc.body(), req.keep_alive)
            return
        stats["prefills"] += 1
        stats["prefill_tokens"] += reply.prompt_tokens
        if chat.stream:
            stats["streamed"] += 1
            self._send_stream(conn, req, reply, faults, request_id, created)
        else:
            self._send_json(conn, req, reply, faults, request_id, created)

    def _send_fault(self, conn: Conn, req: HttpRequest, faults: Faults, stream: bool) -> bool:
        """Send a whole-response fault; False when the fault happens inside the stream instead."""
        if faults.status == "429":
            body = error_json(429, "RateLimitError", "Too many requests (simulated)")
            conn.respond(429, body, req.keep_alive, extra=b"retry-after: %d\r\n" % self.config.retry_after_s)
        elif faults.status == "500":
            conn.respond(500, error_json(500, "InternalServerError", FAILURE_TEXT), req.keep_alive)
        elif faults.status == "wrong_content_type":
            conn.respond(200, b"<html>Bad gateway</html>", req.keep_alive, ctype=b"text/html; charset=utf-8")
        elif faults.status == "error_body" and not stream:
            conn.respond(200, error_json(500, "InternalServerError", FAILURE_TEXT), req.keep_alive)
        else:
            return False
        return True

    def build_reply(self, chat: ChatRequest, key: bytes) -> Reply:
        """The reply to ``chat`` without faults, cached under ``key`` (multi.py: one choice of n)."""
        return self._reply(chat, NO_FAULTS, key)

    def _reply(self, chat: ChatRequest, faults: Faults, raw_body: bytes) -> Reply:
        """Lay out the reply to a request body (cached per body unless a fault changes it)."""
        cfg = self.config
        gen = self._gen(chat, raw_body)
        ids = self._token_ids()
        spec = chat.logprobs
        plan_key = (cfg.reasoning_field, chat.with_ids, faults.empty_reasoning, chat.tool is not None, spec)
        plan = gen.plans.get(plan_key)
        if plan is None:
            # logprobs need every token's id, as token ids do
            events = plan_events(gen, cfg.reasoning_field, faults.empty_reasoning, ids,
                                 chat.with_ids or spec is not None, chat.tool)
            lp = logprob_entries(events, spec, ids) if spec is not None else None
            plan = gen.plans[plan_key] = Plan(events, cfg.reasoning_field, chat.with_ids, lp)
        prompt_text = gen.rendered_prompt
        if gen.thinking and (
            cfg.reasoning_field == "inline-no-open" or (cfg.token_ids == "deepseek" and cfg.reasoning_field in PARSER_MODES)
        ):
            # The template prefilled the think block, as DeepSeek-R1-style templates do and vLLM 0.32 reports
            # in prompt_token_ids (…<｜Assistant｜> 128804, <think> 128821, "\n" 201).
            prompt_text += "<think>\n"
        info = gen.prompt_info.get((prompt_text, chat.with_ids))
        if info is None:
            info = gen.prompt_info[(prompt_text, chat.with_ids)] = ids.prompt(prompt_text, chat.with_ids)
        prompt_tokens, prompt_ids = info
        budget = cfg.max_model_len - prompt_tokens
        if budget < 1:
            message = f"This model's maximum context length is {cfg.max_model_len} tokens."
            raise bad_request(message, "messages")
        stop_reason: str | None = None
        if chat.stops:
            events, stop_reason = apply_stop(plan.events, chat.stops)
            if stop_reason is not None:
                lp = logprob_entries(events, spec, ids) if spec is not None else None
                plan = Plan(events, plan.mode, chat.with_ids, lp)
        cut = plan.cut(budget if chat.max_tokens is None else min(chat.max_tokens, budget))
        finish = ("tool_calls" if chat.tool is not None else "stop") if cut == len(plan.events) else "length"
        reply = Reply(
            chat=chat,
            plan=plan,
            cut=cut,
            finish=finish,
            stop_reason=stop_reason if finish == "stop" else None,
            prompt_tokens=prompt_tokens,
            prompt_ids=prompt_ids,
            prompt_text=prompt_text if chat.with_prompt_text else None,
        )
        if not faults.empty_reasoning and len(raw_body) < 4096:
            self._charge_cache(len(plan.events))
            self._replies[raw_body] = reply
        return reply

    def _charge_cache(self, tokens: int) -> None:
        """Bound the reply caches by the tokens they hold (long replies cost MBs each)."""
        self._cached_tokens += tokens
        if self._cached_tokens > CACHE_TOKENS:
            self._replies.clear()
            self._gens.clear()
            self._cached_tokens = tokens

    def _gen(self, chat: ChatRequest, raw_body: bytes) -> Gen:
        # The raw body is a cheap cache key (it holds everything that decides the text).
        key = raw_body if len(raw_body) < 4096 else None
        gen = self._gens.get(key) if key is not None else None
        if gen is None:
            try:
                gen = generate_answer(chat.messages, self.config, chat.seed, chat.thinking)
            except (TypeError, ValueError) as exc:
                raise bad_request(f"cannot use these messages: {exc}", "messages") from None
            if key is not None:
                self._charge_cache(len(gen.reasoning) + len(gen.content))
                self._gens[key] = gen
        return gen
