"""One chat request: its parsed body, the reply built for it, the faults it draws, its stream's chunks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from .config import PARSER_MODES, SimConfig
from .http import error_json
from .logprobs import MAX_LOGPROBS, LogprobSpec
from .plan import Plan

# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class StreamChunks:
    """The chunks of one stream, one per token, built on demand from the reply's shared parts.

    Chunk 0 carries the role chunk too; the last one carries the usage chunk and ``[DONE]``.
    A paced stream holds only this (a prefix and a reference), not a copy of its whole body.
    """

    __slots__ = ("prefix", "parts", "usage", "n", "override", "preempt_at", "running_usage")

    def __init__(self, prefix: bytes, parts: list[bytes], include_usage: bool, running_usage: int = -1) -> None:
        self.prefix = prefix
        self.parts = parts
        self.usage = include_usage
        # vLLM's stream_options.continuous_usage_stats: every token chunk carries the usage so far (the prompt's
        # tokens given here; -1: off)
        self.running_usage = running_usage
        self.n = len(parts) - 1 - include_usage
        self.override: dict[int, bytes] = {}  # chunks replaced by faults
        self.preempt_at = -1  # the chunk before which the server preempts this stream (-1: never)

    def __len__(self) -> int:
        return self.n

    def role_chunk(self) -> bytes:
        return self.prefix + self.parts[0]

    def tail(self, k: int) -> bytes:
        """What follows token chunk k within its item: usage and [DONE] after the last one."""
        if k != len(self.parts) - 2 - self.usage:
            return b""
        return (self.prefix + self.parts[-1] if self.usage else b"") + DONE_EVENT

    def chunk(self, k: int) -> bytes:
        hit = self.override.get(k)
        if hit is not None:
            return hit
        part = self.parts[k + 1]
        p = self.running_usage
        if p >= 0 and part.endswith(b"}\n\n"):
            part = part[:-3] + b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
                p, p + k + 1, k + 1)
        out = self.prefix + part + self.tail(k)
        return self.role_chunk() + out if k == 0 else out

    def join(self, start: int, end: int) -> bytes:
        return b"".join([self.chunk(k) for k in range(start, end)])


FAILURE_TEXT = "Simulated engine failure"
CACHE_TOKENS = 300_000  # tokens held by the reply caches before they are emptied (~100 MB)
DONE_EVENT = b"data: [DONE]\n\n"


class RequestError(Exception):
    """A request the simulator refuses, answered with a vLLM-style JSON error."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param

    def body(self) -> bytes:
        return error_json(self.status, self.kind, self.message, self.param)


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, "BadRequestError", message, param)


@dataclass(slots=True)
class ChatRequest:
    """The parts of a ``/v1/chat/completions`` body the simulator uses; everything else is ignored."""

    messages: list[Any]
    seed: Any = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM): the usage in every chunk
    max_tokens: int | None = None
    stops: list[str] = field(default_factory=list)
    with_ids: bool = False
    logprobs: LogprobSpec | None = None  # logprobs / top_logprobs / return_tokens_as_token_ids (vLLM)
    with_prompt_text: bool = False
    thinking: bool = True
    n: int = 1  # choices asked for (synthwatch/simulator/multi.py)
    tool: dict[str, Any] | None = None
    """The function the reply calls: the first of ``tools`` when the last message is the user's (not a tool
    result) and ``tool_choice`` is not "none"."""

    @classmethod
    def parse(cls, raw: bytes, served_model: str) -> ChatRequest:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != served_model:
            raise RequestError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise bad_request("messages must be a non-empty list of objects", "messages")
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise bad_request("max_tokens must be an integer >= 1", "max_tokens")
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
        n = body.get("n")
        if n is None:
            n = 1
        if type(n) is not int or not 1 <= n <= 128:
            raise bad_request("n must be an integer from 1 to 128", "n")
        stream = body.get("stream") is True
        options = body.get("stream_options")
        kwargs = body.get("chat_template_kwargs")
        thinking_off = isinstance(kwargs, dict) and (
            kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False
        )
        return cls(
            messages=messages,
            seed=body.get("seed"),
            stream=stream,
            include_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
            continuous_usage=stream and isinstance(options, dict) and options.get("continuous_usage_stats") is True,
            max_tokens=max_tokens,
            stops=[s for s in stops if isinstance(s, str) and s],
            with_ids=body.get("return_token_ids") is True,
            logprobs=_logprobs(body),
            with_prompt_text=body.get("return_prompt_text") is True,
            thinking=not thinking_off,
            n=n,
            tool=_tool_to_call(body.get("tools"), body.get("tool_choice"), messages),
        )


def _logprobs(body: dict[str, Any]) -> LogprobSpec | None:
    """The request's logprobs, refused as vLLM refuses them (its ChatCompletionRequest validators)."""
    top = body.get("top_logprobs")
    want = body.get("logprobs")
    if want is not None and type(want) is not bool:
        raise bad_request("logprobs must be a boolean", "logprobs")
    if top is not None:
        if type(top) is not int:
            raise bad_request("top_logprobs must be an integer", "top_logprobs")
        if not want:
            raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        if top < 0:
            raise bad_request("`top_logprobs` must be a positive value.", "top_logprobs")
        if top > MAX_LOGPROBS:
            raise bad_request(f"Requested top logprobs of {top}, which is greater than max allowed: {MAX_LOGPROBS}",
                              "top_logprobs")
    if not want:
        return None
    return LogprobSpec(top or 0, body.get("return_tokens_as_token_ids") is True)


def _tool_to_call(tools: Any, choice: Any, messages: list[Any]) -> dict[str, Any] | None:
    if not isinstance(tools, list) or not tools or choice == "none" or messages[-1].get("role") != "user":
        return None
    fn = tools[0].get("function") if isinstance(tools[0], dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request("tools[0].function.name must be a string", "tools")
    return fn


@dataclass(slots=True)
class Reply:
    """One reply laid out, without its id and timestamp; cached per request body."""

    chat: ChatRequest
    plan: Plan
    cut: int  # events[:cut] are sent
    finish: str
    stop_reason: str | None
    prompt_tokens: int
    prompt_ids: list[int] | None
    prompt_text: str | None
    stream_parts: list[bytes] | None = None  # rendered once, see Simulator._stream_parts
    json_tail: bytes | None = None  # the completion JSON after its "created" key


@dataclass(slots=True)
class Faults:
    status: str | None = None  # "429", "500", "wrong_content_type", "error_body"
    stall: bool = False
    drop: bool = False
    malformed: bool = False
    truncated_json: bool = False
    empty_reasoning: bool = False
    position: float = 0.5  # where in the stream a drop / malformed chunk happens, 0..1


NO_FAULTS = Faults()


def completion_body(reply: Reply, config: SimConfig) -> dict[str, Any]:
    """The ``chat.completion`` object after its id, object and created keys, as vLLM sends it."""
    mode = reply.plan.mode
    events = reply.plan.events[: reply.cut]
    reasoning_parts = [e[1] for e in events if e[0] == mode] if mode in PARSER_MODES else []
    content_parts = [e[1] for e in events if e[0] == "content"]
    reasoning = "".join(reasoning_parts) if reasoning_parts else None
    content: str | None = "".join(content_parts)
    if mode in PARSER_MODES and not content_parts:
        content = None
    tool_calls = []
    heads = [e[1] for e in events if e[0] == "tool_head"]
    if heads:  # vLLM's tool parser: the call replaces the content (null)
        name, call_id = heads[0].split("\x00", 1)
        arguments = "".join(e[1] for e in events if e[0] == "tool_args")
        tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        content = None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": tool_calls,
    }
    if mode in ("reasoning_content", "both"):
        message["reasoning_content"] = reasoning
    if mode != "reasoning_content":
        message["reasoning"] = reasoning
    lp = reply.plan.logprobs
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": [e for row in lp[: reply.cut] for e in row]} if lp is not None else None,
        "finish_reason": reply.finish,
        "stop_reason": reply.stop_reason,
        "token_ids": [i for e in events for i in e[2]] if reply.chat.with_ids else None,
    }
    return {
        "model": config.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": config.fingerprint,
        "usage": usage_body(reply, exclude_none=False),
        "prompt_logprobs": None,
        "prompt_token_ids": reply.prompt_ids,
        "prompt_text": reply.prompt_text,
        "kv_transfer_params": None,
    }

def usage_body(reply: Reply, exclude_none: bool) -> dict[str, Any]:
    """vLLM's UsageInfo; reasoning_tokens only where a reasoning parser runs (parser modes)."""
    completion, reasoning = reply.plan.tokens(reply.cut)
    usage: dict[str, Any] = {
        "prompt_tokens": reply.prompt_tokens,
        "total_tokens": reply.prompt_tokens + completion,
        "completion_tokens": completion,
    }
    if not exclude_none:
        usage["prompt_tokens_details"] = None
    if reply.plan.mode in PARSER_MODES:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    elif not exclude_none:
        usage["completion_tokens_details"] = None
    return usage

# streamed replies
