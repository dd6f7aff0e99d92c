"""Preflight before a long run: a few requests to an OpenAI-compatible endpoint, and what they tell.

:func:`probe` sends a non-streamed request (asking for token ids), the same request streamed, and a
request offering one tool, then reports:

- the server's kind and version (``system_fingerprint``, ``GET /version``), and where the reasoning
  arrives (which field, streamed and not; inline ``<think>`` text; nothing);
- whether token ids come back (vLLM's ``return_token_ids``), whether the prompt ends with a prefilled
  ``<think>`` and whether the completion ends with EOS when the reply stopped;
- whether tool calls come back and parse (a function name and JSON arguments);
- whether the server answers ``n`` choices in one request (a tiny request with n = 2: a server that ignores ``n``
  answers one), which ``samples_in_one_request`` needs;
- with a tokenizer: what its chat template does to the probe's answer (the trained span, whether the
  reasoning survives, whether the template's prompt is the server's prompt id for id).

It ends with a one-line verdict and the settings to use (run config and export).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from .capture.reasoning import ResponseShapeError, extract_response
from .capture.stream import StreamAccumulator
from .outbound import OutboundError, Reply, env_proxy, fetch, register, run_sync, session
from .redact import add_secret, clip, redact, secret_problem

KNOWN_THINK_IDS = {128821: "DeepSeek-V4", 128798: "DeepSeek-R1", 151667: "Qwen3", 163606: "Kimi-K2"}
"""``<think>`` ids of common reasoning vocabularies: without a tokenizer, a prompt ending with one is taken as
prefilled (reference/training-formats.md)."""
PROBE_MAX_TOKENS = 2048
"""The probe's default max_tokens. A reasoning model thinks before it answers, often for several hundred tokens
even on the probe's one-line sum; at 512 (the old default) a real DeepSeek-R1-style model was cut while thinking,
the content came back empty, and the probe could not say where content arrives. 2048 leaves room for the
reasoning and the short answer, and is still a few seconds of decoding on a GPU server."""
PROBE_OWN_KEYS = ("model", "messages", "stream", "stream_options")
"""Request keys --extra-body may not set: the probe sends its own question, non-streamed and streamed."""
MAX_REPLY_BYTES = 8 * 2**20
"""The most of one reply the probe reads (decoded): its answers are a few kB; a reply is untrusted."""
QUESTION = "What is 17 + 25? Think it through, then answer in one short sentence."
TOOL_QUESTION = "What is the weather in Paris right now? Use the get_weather tool."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class ProbeOptions:
    base_url: str
    model: str
    api_key: str | None = None
    max_tokens: int = PROBE_MAX_TOKENS
    timeout_s: float = 60.0  # each request's deadline, connect to the end of its reply
    deadline_s: float | None = None  # the whole probe's (the dashboard's button: PROBE_BUTTON_DEADLINE_S)
    # merged into every probe request, as a run's sampling.extra_body (e.g. chat_template_kwargs); sent only to
    # the probed endpoint, and only its keys are reported (a value may hold a secret)
    extra_body: dict[str, Any] | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    trust_remote_code: bool = False


@dataclass
class ProbeReport:
    server: dict[str, Any] = field(default_factory=dict)
    reasoning: dict[str, Any] = field(default_factory=dict)
    token_ids: dict[str, Any] = field(default_factory=dict)
    tool_calls: dict[str, Any] = field(default_factory=dict)
    n_choices: dict[str, Any] = field(default_factory=dict)  # n in one request: supported, choices, detail
    tokenizer: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the output says about the settings (empty content)
    verdict: str = ""
    ready: bool = False
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("verdict", "ready", "settings", "server", "reasoning", "token_ids",
                                              "tool_calls", "n_choices", "tokenizer", "problems", "warnings")}


class ProbeError(Exception):
    """The endpoint cannot be probed at all (unreachable, not OpenAI-compatible); the message says why."""


def probe(options: ProbeOptions) -> ProbeReport:
    """The report, every string in it redacted; ProbeError (redacted) when the endpoint cannot be probed.

    A key is registered for redaction before the first request, so that a server echoing it back (in an
    error, a model list, a fingerprint) never gets it printed, shown on a page or returned by the API."""
    return run_sync(probe_async(options))


async def probe_async(options: ProbeOptions) -> ProbeReport:
    """:func:`probe` on the caller's event loop (the dashboard's probe button): its requests go through the
    outbound client (synthwatch/outbound.py), each within ``options.timeout_s`` in all and MAX_REPLY_BYTES decoded;
    the whole probe within ``options.deadline_s`` when set. Cancelling it cancels its requests."""
    if options.api_key:
        add_secret(options.api_key)
        why = secret_problem(options.api_key)
        if why is not None:
            raise ProbeError(f"the API key holds {why}, which cannot be used as a key (the value is not shown)")
    try:
        async with asyncio.timeout(options.deadline_s):
            report = await _probe(options)
    except ProbeError as exc:
        raise ProbeError(redact(str(exc))) from None
    except TimeoutError:
        raise ProbeError(f"the probe did not end within its deadline of {options.deadline_s:g} s (the server "
                         "answers too slowly or never ends its reply)") from None
    except Exception as exc:  # a reply nobody foresaw: a clear, redacted line instead of a traceback
        raise ProbeError(clip(f"the probe failed: {type(exc).__name__}: {exc}", 500)) from None
    return _redacted(report)


def _redacted(report: ProbeReport) -> ProbeReport:
    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return redact(value)
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    for name, value in vars(report).items():
        setattr(report, name, clean(value))
    return report


async def _probe(options: ProbeOptions) -> ProbeReport:
    base = options.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    proxy, proxy_headers = env_proxy(base + "/chat/completions")  # as the run's requests (outbound.env_proxy)
    if proxy_headers and not base.startswith("https:"):
        headers.update(proxy_headers)
        proxy_headers = None
    report = ProbeReport()
    async with session("probe", headers=headers) as sess:
        client = _Client(sess, options.timeout_s, proxy, proxy_headers)
        report.server = await _server(client, base, options.model)
        body = {"model": options.model, "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": options.max_tokens, "return_token_ids": True, **(options.extra_body or {})}
        started = time.monotonic()
        reply = await _post(client, base, body)
        if reply.status == 400 and b"return_token_ids" in reply.body:
            report.problems.append("the server refused return_token_ids; probing without it")
            body.pop("return_token_ids")
            reply = await _post(client, base, body)
        if reply.status != 200:
            raise ProbeError(f"POST {base}/chat/completions answered {reply.status}: "
                             f"{reply.quoted(300)}")
        try:
            data = orjson.loads(reply.body)
        except ValueError:
            raise ProbeError(f"POST {base}/chat/completions answered 200 with a body that is not JSON: "
                             f"{reply.quoted(300)}") from None
        try:
            ex = extract_response(data)
        except ResponseShapeError as exc:
            raise ProbeError(f"the reply is not a chat completion: {exc}") from None
        report.server["latency_s"] = round(time.monotonic() - started, 3)
        if not report.server.get("kind") and ex.system_fingerprint:
            report.server.update(_kind_from_fingerprint(ex.system_fingerprint))
        streamed = await _stream(client, base, {**body, "stream": True, "stream_options": {"include_usage": True}})
        report.reasoning = {
            "non_streamed": ex.reasoning_source, "streamed": streamed.reasoning_source if streamed else None,
            "reasoning_chars": len(ex.reasoning), "content_chars": len(ex.content),
            "finish_reason": ex.finish_reason, "other_fields_with_reasoning": sorted(ex.unread_fields),
            "duplicated_in": ex.duplicate_fields, "extra_body_keys": sorted(options.extra_body or {}),
        }
        if not ex.content.strip():
            report.warnings.append(_empty_content(ex, options))
        report.problems += ex.problems
        report.token_ids = {"returned": bool(ex.prompt_token_ids and ex.token_ids),
                            "prompt_tail": (ex.prompt_token_ids or [])[-3:], "completion_tail": (ex.token_ids or [])[-3:],
                            "finish_reason": ex.finish_reason}
        report.tool_calls = await _tools(client, base, options)
        report.n_choices = await _n_support(client, base, options)
    tail = (ex.prompt_token_ids or [])[-2:]
    known = next((KNOWN_THINK_IDS[i] for i in tail if i in KNOWN_THINK_IDS), None)
    if known is not None:
        report.token_ids["prompt_prefilled_think"] = True
        report.token_ids["prefill_evidence"] = f"the prompt ends with {known}'s <think> id"
    if options.tokenizer:  # loading and rendering is CPU work: off the event loop
        await asyncio.to_thread(_tokenizer_part, options, report, ex)
    _verdict(report, options)
    return report


# ------------------------------------------------------------------------------------------ requests


class _Client:
    """The probe's requests: one outbound session, each request within ``timeout_s`` in all, replies capped."""

    def __init__(self, sess: Any, timeout_s: float, proxy: str | None, proxy_headers: dict[str, str] | None) -> None:
        self.sess, self.timeout_s, self.proxy, self.proxy_headers = sess, timeout_s, proxy, proxy_headers

    async def request(self, method: str, url: str, body: bytes | None = None) -> Reply:
        return await fetch(self.sess, method, url, cap=MAX_REPLY_BYTES, deadline_s=self.timeout_s, body=body,
                           headers={"Content-Type": "application/json"} if body is not None else None,
                           proxy=self.proxy, proxy_headers=self.proxy_headers)


async def _post(client: _Client, base: str, body: dict[str, Any]) -> Reply:
    try:
        return await client.request("POST", f"{base}/chat/completions", orjson.dumps(body))
    except OutboundError as exc:
        raise ProbeError(f"cannot reach {base}: {exc.message}") from None


def _json_field(reply: Reply, key: str) -> Any:
    try:
        data = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    return data.get(key) if isinstance(data, dict) else None


async def _server(client: _Client, base: str, model: str) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": None, "version": None, "evidence": None}
    try:
        r = await client.request("GET", f"{base}/models")
        data = _json_field(r, "data") if r.status == 200 else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    except OutboundError:
        ids = []
    out["models"] = ids
    out["model_listed"] = model in ids
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    try:
        r = await client.request("GET", f"{root}/version")
        version = _json_field(r, "version") if r.status == 200 else None
    except OutboundError:
        version = None
    if isinstance(version, str):
        out.update(kind="vLLM", version=version, evidence=f"GET {root}/version")
    return out


def _kind_from_fingerprint(fp: str) -> dict[str, Any]:
    if fp.startswith("vllm-"):
        return {"kind": "vLLM", "version": fp.split("-")[1], "evidence": f"system_fingerprint {fp!r}"}
    return {"kind": None, "evidence": f"system_fingerprint {fp!r}"}


async def _stream(client: _Client, base: str, body: dict[str, Any]) -> Any:
    acc = StreamAccumulator()
    try:
        r = await client.request("POST", f"{base}/chat/completions", orjson.dumps(body))
        if r.status != 200:
            return None
        for line in r.body.splitlines():
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunk = orjson.loads(line[6:])
                if isinstance(chunk, dict):
                    acc.feed(chunk)
    except (OutboundError, orjson.JSONDecodeError):
        return None
    return acc.result()


async def _tools(client: _Client, base: str, options: ProbeOptions) -> dict[str, Any]:
    from .capture import tool_calls

    body = {"model": options.model, "messages": [{"role": "user", "content": TOOL_QUESTION}],
            "max_tokens": options.max_tokens, "tools": [WEATHER_TOOL], "tool_choice": "auto",
            **(options.extra_body or {})}
    r = await _post(client, base, body)
    if r.status != 200:
        return {"parsed": False,
                "detail": f"the server refused a request with tools ({r.status}): {r.quoted(200)}"}
    try:
        data = orjson.loads(r.body)
        ex = extract_response(data)
    except (ValueError, ResponseShapeError):
        return {"parsed": False, "detail": "the reply to a request with tools is not a chat completion"}
    calls = tool_calls.from_extracted(ex)
    if not calls:
        inline = "<tool_call>" in ex.content or "tool▁call" in ex.content
        return {"parsed": False, "detail": "no tool_calls came back" + (
            " (a tool call is inline in the content: start the server with a tool-call parser)" if inline else
            " (the server has no tool-call parser, or the model answered without calling)")}
    streamed = await _stream(client, base, {**body, "stream": True})
    merged = tool_calls.from_extracted(streamed) if streamed else []
    wrong = tool_calls.problems(calls, [WEATHER_TOOL]) + tool_calls.problems(merged, [WEATHER_TOOL])
    same = [c["function"] for c in merged] == [c["function"] for c in calls]
    good = not wrong and same
    detail = ("tool calls parse, streamed and not (name known, arguments JSON)" if good else
              "; ".join(wrong) or "the streamed tool calls differ from the non-streamed ones")
    return {"parsed": good, "calls": [c["function"] for c in calls], "streamed_calls": [c["function"] for c in merged],
            "finish_reason": ex.finish_reason, "detail": detail}


N_QUESTION = "Say OK."


async def _n_support(client: _Client, base: str, options: ProbeOptions) -> dict[str, Any]:
    """Does the server answer n choices in one request? A tiny request with n = 2 (``samples_in_one_request``)."""
    body = {"model": options.model, "messages": [{"role": "user", "content": N_QUESTION}], "max_tokens": 8,
            **(options.extra_body or {}), "n": 2}
    try:
        r = await _post(client, base, body)
    except ProbeError as exc:
        return {"supported": None, "choices": 0, "detail": f"not known: {exc}"}
    if r.status != 200:
        return {"supported": False, "choices": 0,
                "detail": f"the server refused a request with n = 2 ({r.status}): {r.quoted(200)}; leave "
                          "samples_in_one_request off"}
    try:
        data = orjson.loads(r.body)
    except ValueError:
        return {"supported": False, "choices": 0, "detail": "the reply to a request with n = 2 is not JSON"}
    choices = data.get("choices") if isinstance(data, dict) else None
    got = len(choices) if isinstance(choices, list) else 0
    indexes = sorted(int(c["index"]) for c in choices if isinstance(c, dict) and type(c.get("index")) is int) \
        if isinstance(choices, list) else []
    if got == 2 and indexes == [0, 1]:
        return {"supported": True, "choices": 2, "detail": "n = 2 answered 2 choices (index 0 and 1): set "
                "samples_in_one_request = true to ask for a prompt's k samples in one request"}
    return {"supported": False, "choices": got,
            "detail": f"n = 2 answered {got} choice{'s' if got != 1 else ''}: the server ignores n; leave "
                      "samples_in_one_request off (with it on, the samples it does not answer are asked one by one)"}


# ----------------------------------------------------------------------------------------- tokenizer


def _tokenizer_part(options: ProbeOptions, report: ProbeReport, ex: Any) -> None:
    lt = _tokenizer(options, report)
    if lt is not None:
        _token_facts(lt, report, ex)
        report.tokenizer = _template_facts(lt, ex)


def _tokenizer(options: ProbeOptions, report: ProbeReport) -> Any:
    if not options.tokenizer:
        return None
    from .tokens.tokenizer import TokenizerError, TokenizerSpec, load_tokenizer

    try:
        return load_tokenizer(TokenizerSpec(options.tokenizer, chat_template=options.chat_template,
                                            trust_remote_code=options.trust_remote_code))
    except TokenizerError as exc:
        report.problems.append(str(exc))
        return None


def _token_facts(lt: Any, report: ProbeReport, ex: Any) -> None:
    ids = report.token_ids
    ids["think_open_id"], ids["think_close_id"] = lt.think_open_id, lt.think_close_id
    ids["think_single_ids"] = lt.think_open_id is not None and lt.think_close_id is not None
    if not ids["returned"]:
        return
    prompt, completion = ex.prompt_token_ids, ex.token_ids
    ids["prompt_tail_text"] = lt.decode(list(prompt[-3:]))
    ids["prompt_prefilled_think"] = lt.think_open_id is not None and lt.think_open_id in prompt[-2:]
    ids["prefill_evidence"] = f"the tokenizer's <think> id {lt.think_open_id}"
    eos = lt.tok.eos_token_id
    ids["completion_ends_with_eos"] = bool(completion) and completion[-1] == eos
    ids["completion_think_close"] = lt.think_close_id in completion if lt.think_close_id is not None else None


def _template_facts(lt: Any, ex: Any) -> dict[str, Any]:
    from .export.training_rows import Unusable, retokenized_row
    from .tokens.tokenizer import TokenizerError

    messages = [{"role": "user", "content": QUESTION}]
    out: dict[str, Any] = {"name": lt.spec.name_or_path, "template": lt.template_source}
    try:
        row = retokenized_row(lt, messages, ex.reasoning, ex.content, finish_reason=ex.finish_reason)
        out["problem"] = None
        out["trained_span"] = _clip(lt.decode(row.completion_ids))
        out["reasoning_survives"] = not ex.reasoning.strip() or ex.reasoning.strip() in lt.decode(row.completion_ids)
    except Unusable as exc:
        out.update(problem=exc.reason, detail=str(exc), reasoning_survives=exc.reason != "template_drops_reasoning")
    except TokenizerError as exc:
        out.update(problem="tokenize_failed", detail=str(exc), reasoning_survives=None)
        return out
    generated = retokenized_row(lt, messages, ex.reasoning, ex.content, as_generated=True,
                                finish_reason=ex.finish_reason)
    out["as_generated_span"] = _clip(lt.decode(generated.completion_ids))
    if ex.prompt_token_ids:
        out["prompt_matches_server"] = generated.prompt_ids == list(ex.prompt_token_ids)
    return out


def _clip(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n // 2] + " … " + text[-n // 2 :]


# ------------------------------------------------------------------------------------------- verdict


def _empty_content(ex: Any, options: ProbeOptions) -> str:
    """What an empty answer means, and what to do about it."""
    limit = (options.extra_body or {}).get("max_completion_tokens") or (options.extra_body or {}).get(
        "max_tokens") or options.max_tokens
    if ex.finish_reason == "length":
        return (f"the content came back empty: the reply was cut at max_tokens = {limit} "
                f"({'while thinking, after ' + str(len(ex.reasoning)) + ' reasoning characters' if ex.reasoning else 'before any answer'}); "
                f"probe again with a larger --max-tokens (e.g. --max-tokens {max(4 * int(limit), 8192)}), and give "
                f"the run a max_tokens (--max-tokens) that leaves room for the answer")
    return (f"the content came back empty (finish_reason {ex.finish_reason!r}"
            f"{', reasoning ' + str(len(ex.reasoning)) + ' characters' if ex.reasoning else ''}): the reasoning "
            "parser or the chat template may hold the answer back; check the server's --reasoning-parser, or pass "
            "the template's switches with --extra-body '{\"chat_template_kwargs\": {...}}'")


def _verdict(report: ProbeReport, options: ProbeOptions) -> None:
    r, ids, tok = report.reasoning, report.token_ids, report.tokenizer
    settings: dict[str, Any] = {}
    blockers: list[str] = []
    caveats: list[str] = []
    source = r.get("non_streamed")
    if source in (None, "none"):
        blockers.append("no reasoning arrives (no reasoning field, no <think> text): start the server with a "
                        "reasoning parser or check include_reasoning/separate_reasoning")
    elif source == "inline-no-open":
        settings["reasoning.mode"] = "inline"
        settings["reasoning.prefilled_open"] = True
    else:
        settings["reasoning.mode"] = source
    if r.get("streamed") not in (None, source):
        caveats.append(f"streamed reasoning arrives in {r.get('streamed')!r}, not {source!r}")
    if ids.get("returned"):
        settings["request_token_ids"] = True
        settings["export"] = "--for speculators (the server's ids, exact); --for specforge for SpecForge"
    else:
        settings["request_token_ids"] = False
        caveats.append("no token ids come back: exports re-tokenize (give --tokenizer, or [tokenizer] name_or_path)")
    if report.n_choices.get("supported") is not None:
        settings["samples_in_one_request"] = bool(report.n_choices.get("supported"))
    if ids.get("think_single_ids") is False:
        blockers.append("the tokenizer does not encode <think>/</think> to single ids (wrong tokenizer?)")
    if options.tokenizer:
        settings["tokenizer.name_or_path"] = options.tokenizer
        if options.chat_template:
            settings["tokenizer.chat_template"] = options.chat_template
    if tok is not None:
        if tok.get("problem") == "template_drops_reasoning":
            caveats.append("the chat template drops the answer's reasoning")
            settings["export --format tokens"] = "--template-drops-past-reasoning"
            settings["SpecForge"] = ("the tokenizer's template drops reasoning: give SpecForge a tokenizer whose "
                                     "chat template keeps the last turn's reasoning_content")
        elif tok.get("problem"):
            caveats.append(f"re-tokenizing through the template fails: {tok['problem']}")
        if tok.get("prompt_matches_server") is False:
            caveats.append("the tokenizer/template's prompt ids differ from the server's: not the server's template")
    caveats += report.warnings
    if not report.tool_calls.get("parsed"):
        caveats.append("tool calls: " + str(report.tool_calls.get("detail")))
    server = report.server
    who = f"{server.get('kind') or 'unknown server'}" + (f" {server['version']}" if server.get("version") else "")
    where = {None: "nowhere", "none": "nowhere"}.get(source, f"in {source!r}")
    facts = (f"{who}; reasoning {where}; token ids {'returned' if ids.get('returned') else 'not returned'}"
             + (f" (prompt prefilled with <think>: {'yes' if ids['prompt_prefilled_think'] else 'no'})"
                if "prompt_prefilled_think" in ids else "")
             + ("; tool calls parse" if report.tool_calls.get("parsed") else ""))
    if blockers:
        report.verdict = f"NOT READY: {blockers[0]} ({facts})"
    elif caveats:
        report.verdict = f"READY WITH CAVEATS: {facts}; {'; '.join(caveats)}"
    else:
        report.verdict = f"READY: {facts}"
    report.ready = not blockers
    report.settings = settings


@register("probe", "synthwatch probe (probe.py): /models, /version, a request non-streamed, streamed, with a tool"
          " and with n = 2",
          12.0)
def _drive_probe(base_url: str, key_env: str) -> str:
    from .redact import secret_from_env

    try:
        report = probe(ProbeOptions(base_url, "m", api_key=secret_from_env(key_env), max_tokens=8, timeout_s=2.0,
                                    deadline_s=10.0))
    except ProbeError as exc:
        return str(exc)
    return orjson.dumps(report.as_dict(), default=str).decode()
