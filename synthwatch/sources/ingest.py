"""Reading another program's generation output: shape detection and line -> record mapping.

Shared by ``synthwatch watch`` (a file being written) and ``synthwatch import`` (finished files).
Each line is classified on its own, so a file mixing shapes still ingests; a line that matches
no shape raises :class:`LineError` with a readable reason (the caller stores it with file:line).

Answers are read through :func:`synthwatch.capture.reasoning.extract_response`, even for flat records: the
record's fields are placed into a one-choice ``chat.completion`` so that reasoning-field
resolution, inline ``<think>`` splitting and duplicate/unread detection behave exactly as for
generated runs (the checks rely on ``reasoning_source`` and ``unread_fields``).
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..capture.reasoning import REASONING_FIELDS, Extracted, ResponseShapeError, extract_response
from ..capture.safety import MAX_JSON_DEPTH, too_deep

SHAPES: dict[str, str] = {
    "chat.completion": "raw OpenAI chat.completion objects, one response per line (the prompt is not in them)",
    "openai-batch": "OpenAI Batch API output lines (custom_id + response.body = chat.completion)",
    "script": "hand-written generation-script records {question, reasoning, content, finish_reason, "
              "prompt_tokens, ...}: `question` is the prompt",
    "record": "reasoning records {prompt|messages, reasoning|reasoning_content, content, finish_reason, usage}",
    "specforge": "SpecForge regenerate output {id, conversations, status/error}",
    "conversations": "training conversations {id, conversations: [...assistant turn]} (SpecForge/ShareGPT, "
                     "synthwatch export)",
    "messages": "OpenAI messages ending with the assistant answer (synthwatch export, TRL)",
    "synthwatch-raw": "synthwatch's raw export (one stored record per line: prompt_json, reasoning, content, ...)",
    "mapped": "fields picked with --map",
}
MAP_KEYS = ("prompt", "messages", "reasoning", "content", "finish_reason", "id", "prompt_tokens",
            "completion_tokens", "latency_s", "timestamp", "model", "error")

_ID_KEYS = ("id", "idx", "custom_id", "uid", "uuid", "index", "sample_id")
_TIME_KEYS = ("timestamp", "finished_at", "ts", "time", "t", "created_at", "end_time")
_LATENCY_KEYS = ("latency_s", "latency", "duration_s", "elapsed_s", "elapsed", "duration")
_LATENCY_MS_KEYS = ("latency_ms", "duration_ms", "elapsed_ms")
_ERROR_STATUSES = frozenset({"error", "failed", "failure", "fail", "errored", "timeout"})
_ROLE_OF = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
            "system": "system", "tool": "tool", "function": "tool"}
_MISSING: Any = object()
# columns of synthwatch's own record table (its raw export writes them all)
_RAW_COLUMNS = frozenset({
    "id", "run_id", "idx", "source_id", "source_line", "rnd", "prompt_json", "status", "reasoning", "content",
    "content_null", "reasoning_source", "reasoning_len", "content_len", "finish_reason", "prompt_tokens",
    "completion_tokens", "reasoning_tokens", "reasoning_tokens_source", "usage_json", "token_ids_json",
    "latency_s", "ttft_s", "n_chunks",
    "attempts", "attempts_json", "error_kind", "error", "endpoint", "model", "system_fingerprint", "response_id",
    "extra_json", "worker_id", "lease_until", "claimed_at", "finished_at", "check_flags", "check_json", "review",
    "review_reason", "reviewed_at", "billed_prompt_tokens", "billed_completion_tokens", "billed_estimated",
})


class LineError(ValueError):
    """A line no shape matches; the message says why (it is shown with file:line)."""


class MapError(ValueError):
    """A bad --map / --shape option."""


@dataclass(slots=True)
class Parsed:
    shape: str
    status: str  # ok | error
    messages: list[dict[str, Any]]
    extracted: Extracted | None
    source_id: str | None = None
    latency_s: float | None = None
    timestamp: float | None = None  # when the record finished, Unix seconds, if the line says
    error: str | None = None
    error_kind: str | None = None


def parse_map(items: list[str] | None) -> dict[str, str]:
    """``["reasoning=msg.reasoning", ...]`` -> ``{"reasoning": "msg.reasoning"}``."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, path = item.partition("=")
        key, path = key.strip(), path.strip()
        if not sep or not key or not path:
            raise MapError(f"--map {item!r}: expected KEY=dotted.path, e.g. reasoning=msg.reasoning")
        if key not in MAP_KEYS:
            raise MapError(f"--map {item!r}: unknown key {key!r}; expected one of {', '.join(MAP_KEYS)}")
        if key in out:
            raise MapError(f"--map {key} given twice")
        out[key] = path
    return out


def lookup(obj: Any, path: str) -> Any:
    """Dotted path with list indexes (``choices.0.message.content``); ``_MISSING`` when absent."""
    value = obj
    for part in path.split("."):
        if isinstance(value, dict):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            i = int(part)
            if not -len(value) <= i < len(value):
                return _MISSING
            value = value[i]
        else:
            return _MISSING
    return value


def _keys(obj: dict[str, Any]) -> str:
    ks = sorted(map(str, obj))
    return ", ".join(ks[:12]) + (f", ... ({len(ks)} keys)" if len(ks) > 12 else "") if ks else "none"


_TYPE_NAMES: dict[type, str] = {dict: "object", list: "array", str: "string"}


def _tname(v: Any) -> str:
    return "null" if v is None else _TYPE_NAMES.get(type(v), type(v).__name__)


# ----------------------------------------------------------------------------- field helpers


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def parse_time(v: Any) -> float | None:
    """Unix seconds (or milliseconds), or an ISO 8601 string -> Unix seconds."""
    x = _num(v)
    if x is not None:
        if x > 1e14:  # microseconds
            return x / 1e6
        if x > 1e11:  # milliseconds
            return x / 1e3
        return x if x > 0 else None
    if isinstance(v, str) and v:
        try:
            d = _dt.datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.UTC)
        return d.timestamp()
    return None


def _source_id(v: Any) -> str | None:
    if v is None or isinstance(v, bool) or isinstance(v, dict | list):
        return None
    return str(v)


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = obj.get(k)
        if v is not None:
            return v
    return None


def _latency(obj: dict[str, Any]) -> float | None:
    for k in _LATENCY_KEYS:
        x = _num(obj.get(k))
        if x is not None and x >= 0:
            return x
    for k in _LATENCY_MS_KEYS:
        x = _num(obj.get(k))
        if x is not None and x >= 0:
            return x / 1000
    return None


def _timestamp(obj: dict[str, Any]) -> float | None:
    for k in _TIME_KEYS:
        t = parse_time(obj.get(k))
        if t is not None:
            return t
    return None


def _usage(obj: dict[str, Any]) -> dict[str, Any] | None:
    u = obj.get("usage")
    usage: dict[str, Any] = dict(u) if isinstance(u, dict) else {}
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        v = _int(obj.get(k))
        if v is not None and k not in usage:
            usage[k] = v
    rt = _int(obj.get("reasoning_tokens"))
    if rt is not None and not isinstance(usage.get("completion_tokens_details"), dict):
        usage["completion_tokens_details"] = {"reasoning_tokens": rt}
    return usage or None


def _error_text(v: Any) -> str | None:
    if v is None or v is False or v == "" or v == {} or v == []:
        return None
    if isinstance(v, dict):
        msg = v.get("message")
        return str(msg) if msg else orjson.dumps(v).decode()[:2000]
    return str(v)[:2000]


def _is_error(obj: dict[str, Any]) -> str | None:
    """The line's own error message when it records a failure, else None."""
    status = obj.get("status")
    err = _error_text(obj.get("error"))
    if isinstance(status, str) and status.strip().lower() in _ERROR_STATUSES:
        return err or f"status {status!r}"
    return err


def _turns(value: Any, label: str) -> list[dict[str, Any]]:
    """OpenAI messages or ShareGPT/SpecForge conversations -> messages (turns kept with their extra keys)."""
    if not isinstance(value, list):
        raise LineError(f"{label} is {_tname(value)}, not an array")
    out: list[dict[str, Any]] = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise LineError(f"{label}[{i}] is {_tname(turn)}, not an object")
        speaker = turn.get("role", turn.get("from"))
        role = _ROLE_OF.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise LineError(f"{label}[{i}] has role {speaker!r}: expected system/user/assistant (or human/gpt)")
        content = turn.get("content", turn.get("value"))
        m = {"role": role, "content": content}
        m.update((k, v) for k, v in turn.items() if k not in ("role", "from", "value", "content"))
        out.append(m)
    return out


def _prompt_messages(v: Any, label: str) -> list[dict[str, Any]]:
    if isinstance(v, str):
        return [{"role": "user", "content": v}]
    if isinstance(v, list):
        return _turns(v, label)
    if isinstance(v, dict) and isinstance(v.get("messages"), list):  # a prompt stored with its tools
        return _turns(v["messages"], label)
    raise LineError(f"{label} is {_tname(v)}, not a string or a messages array")


# ----------------------------------------------------------------------------- detection


def detect(obj: Any) -> str:
    """The shape name of one parsed line; raises LineError when none fits."""
    if not isinstance(obj, dict):
        raise LineError(f"line is a JSON {_tname(obj)}, not an object")
    if isinstance(obj.get("choices"), list):
        return "chat.completion"
    resp = obj.get("response")
    if isinstance(resp, dict) and (isinstance(resp.get("choices"), list)
                                   or isinstance((resp.get("body") or {}).get("choices"), list)
                                   or "custom_id" in obj):
        return "openai-batch"
    if "custom_id" in obj and obj.get("error") is not None:
        return "openai-batch"
    if isinstance(obj.get("prompt_json"), str) and "reasoning_source" in obj:
        return "synthwatch-raw"
    if isinstance(obj.get("conversations"), list):
        return "specforge" if ("status" in obj or "error" in obj) else "conversations"
    has_answer = "content" in obj or any(k in obj for k in REASONING_FIELDS)
    if "question" in obj and (has_answer or _is_error(obj)):
        return "script"
    if has_answer:
        return "record"
    msgs = obj.get("messages")
    if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict) and \
            msgs[-1].get("role", msgs[-1].get("from")) in ("assistant", "gpt"):
        return "messages"
    if ("prompt" in obj or "messages" in obj or "question" in obj) and _is_error(obj):
        return "record"
    if obj.get("object") == "error" or (set(obj) <= {"error", "id", "object"} and "error" in obj):
        raise LineError(f"an error object with no record around it: {_error_text(obj.get('error')) or obj}")
    if isinstance(msgs, list):
        raise LineError("messages has no assistant turn: this looks like a prompt, not generated output")
    raise LineError(f"no known shape (keys: {_keys(obj)}); pick fields with --map, e.g. --map content=answer")


# ----------------------------------------------------------------------------- parser


@dataclass
class LineParser:
    """Turns raw JSONL lines into :class:`Parsed`; counts what it recognised."""

    shape: str | None = None  # force one shape (lines of another shape are errors)
    mapping: dict[str, str] = field(default_factory=dict)
    reasoning_mode: str = "auto"
    think_open: str = "<think>"
    think_close: str = "</think>"
    prefilled_open: bool = False
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.shape is not None and self.shape not in SHAPES:
            raise MapError(f"--shape {self.shape!r}: expected one of {', '.join(SHAPES)}")
        if self.mapping and self.shape not in (None, "mapped"):
            raise MapError("--map and --shape cannot be combined (a mapping defines its own shape)")
        if self.mapping:
            self.shape = "mapped"
        if self.shape == "mapped" and not self.mapping:
            raise MapError("--shape mapped needs at least one --map KEY=path")

    def parse(self, raw: bytes | str) -> Parsed:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            if text.lstrip().startswith(("{", "[")):
                raise LineError(f"not valid JSON ({exc}); an incomplete or corrupted line") from None
            raise LineError(f"not valid JSON ({exc})") from None
        raw_bytes = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        if too_deep(raw_bytes, obj):  # what is parsed must be storable (orjson writes at most 254 levels)
            raise LineError(f"JSON nested more than {MAX_JSON_DEPTH} levels: more than a record can store")
        if self.shape == "mapped":
            shape = "mapped"
            if not isinstance(obj, dict):
                raise LineError(f"line is a JSON {_tname(obj)}, not an object")
        else:
            shape = detect(obj)
            if self.shape is not None and shape != self.shape:
                raise LineError(f"line looks like {shape!r}, not the forced shape {self.shape!r}")
        p = getattr(self, "_" + shape.replace(".", "_").replace("-", "_"))(obj)
        self.counts[shape] += 1
        return p

    def describe(self) -> str:
        """What was recognised so far: 'script ×24 (hand-written ...)'."""
        if not self.counts:
            return "no records yet"
        return "; ".join(f"{name} ×{n} — {SHAPES[name]}" for name, n in self.counts.most_common())

    @property
    def dominant(self) -> str | None:
        return self.counts.most_common(1)[0][0] if self.counts else None

    # ------------------------------------------------------------------ helpers

    def _extract(self, body: dict[str, Any]) -> Extracted:
        return extract_response(body, self.reasoning_mode, self.think_open, self.think_close, self.prefilled_open)

    def _flat(self, shape: str, obj: dict[str, Any], messages: list[dict[str, Any]], known: set[str],
              *, reasoning: dict[str, Any], content: Any, finish_reason: Any, usage: dict[str, Any] | None,
              model: Any, rid: Any, error: str | None, latency: float | None, ts: float | None) -> Parsed:
        msg: dict[str, Any] = {"role": "assistant", "content": content, **reasoning}
        body: dict[str, Any] = {"id": None, "choices": [{"index": 0, "message": msg, "finish_reason": finish_reason}],
                                "usage": usage, "model": model if isinstance(model, str) else None}
        try:
            ex = self._extract(body)
        except ResponseShapeError as exc:  # cannot happen for a body built here; keep the line anyway
            raise LineError(str(exc)) from None
        unknown = {k: v for k, v in obj.items() if k not in known}
        ex.extra = {"top": unknown} if unknown else {}
        return Parsed(shape, "error" if error else "ok", messages, ex, _source_id(rid), latency, ts,
                      error, "source_error" if error else None)

    # ------------------------------------------------------------------ shapes

    def _chat_completion(self, obj: dict[str, Any], shape: str = "chat.completion",
                         outer: dict[str, Any] | None = None) -> Parsed:
        try:
            ex = self._extract(obj)
        except ResponseShapeError as exc:
            raise LineError(str(exc)) from None
        src = outer if outer is not None else obj
        messages: list[dict[str, Any]] = []
        for key in ("messages", "prompt"):
            v = src.get(key)
            if v is None and isinstance(src.get("request"), dict):
                v = src["request"].get(key)
            if v is not None:
                messages = _prompt_messages(v, key)
                break
        latency = _latency(src)
        ts = _timestamp(src)
        created = parse_time(obj.get("created"))
        if ts is None and created is not None:
            ts = created + (latency or 0.0)
        rid = _first(src, ("custom_id", "id")) if outer is not None else obj.get("id")
        return Parsed(shape, "ok", messages, ex, _source_id(rid), latency, ts)

    def _openai_batch(self, obj: dict[str, Any]) -> Parsed:
        resp: dict[str, Any] = obj["response"] if isinstance(obj.get("response"), dict) else {}
        body: dict[str, Any] = resp["body"] if isinstance(resp.get("body"), dict) else resp
        err = _error_text(obj.get("error"))
        code = resp.get("status_code")
        if err is None and isinstance(code, int) and code >= 400:
            err = f"HTTP {code}: {_error_text(body.get('error')) or ''}".strip()
        if err is not None or not isinstance(body.get("choices"), list):
            return Parsed("openai-batch", "error", [], None, _source_id(obj.get("custom_id")), None,
                          _timestamp(obj), err or "response has no choices", "source_error")
        return self._chat_completion(body, "openai-batch", outer=obj)

    def _script(self, obj: dict[str, Any]) -> Parsed:
        messages = _prompt_messages(obj["question"], "question") if obj.get("question") is not None else []
        return self._record_like("script", obj, messages, {"question"})

    def _record(self, obj: dict[str, Any]) -> Parsed:
        messages: list[dict[str, Any]] = []
        for key in ("messages", "prompt", "question"):
            if obj.get(key) is not None:
                messages = _prompt_messages(obj[key], key)
                break
        return self._record_like("record", obj, messages, {"messages", "prompt", "question"})

    def _record_like(self, shape: str, obj: dict[str, Any], messages: list[dict[str, Any]],
                     known: set[str]) -> Parsed:
        reasoning = {k: obj[k] for k in REASONING_FIELDS if k in obj and obj[k] is not None}
        known = known | set(REASONING_FIELDS) | {
            "content", "finish_reason", "usage", "model", "prompt_tokens", "completion_tokens", "total_tokens",
            "reasoning_tokens", "status", "error", *_LATENCY_KEYS, *_LATENCY_MS_KEYS}
        rid = _first(obj, _ID_KEYS)
        known |= {k for k in _ID_KEYS if obj.get(k) is not None and obj.get(k) is rid}
        ts = _timestamp(obj)
        if ts is not None:
            known |= {k for k in _TIME_KEYS if k in obj}
        return self._flat(shape, obj, messages, known, reasoning=reasoning, content=obj.get("content"),
                          finish_reason=obj.get("finish_reason"), usage=_usage(obj), model=obj.get("model"),
                          rid=rid, error=_is_error(obj), latency=_latency(obj), ts=ts)

    def _synthwatch_raw(self, obj: dict[str, Any]) -> Parsed:
        try:
            messages = _prompt_messages(orjson.loads(obj["prompt_json"]), "prompt_json")
        except orjson.JSONDecodeError as exc:
            raise LineError(f"prompt_json is not valid JSON ({exc})") from None
        usage = None
        if isinstance(obj.get("usage_json"), str):
            try:
                usage = orjson.loads(obj["usage_json"])
            except orjson.JSONDecodeError:
                usage = None
        flat = {k: v for k, v in obj.items() if k not in _RAW_COLUMNS}
        p = self._flat("synthwatch-raw", flat, messages, set(), reasoning={"reasoning": obj.get("reasoning") or ""},
                       content=obj.get("content"), finish_reason=obj.get("finish_reason"),
                       usage=usage if isinstance(usage, dict) else _usage(obj), model=obj.get("model"),
                       rid=obj.get("source_id", obj.get("idx")), error=_is_error(obj),
                       latency=_num(obj.get("latency_s")), ts=parse_time(obj.get("finished_at")))
        if p.extracted is not None:
            p.extracted.system_fingerprint = obj.get("system_fingerprint")
            p.extracted.response_id = obj.get("response_id")
        return p

    def _split_answer(self, turns: list[dict[str, Any]], label: str) -> tuple[list[dict[str, Any]],
                                                                              dict[str, Any] | None]:
        if turns and turns[-1]["role"] == "assistant":
            return [{"role": t["role"], "content": t["content"]} for t in turns[:-1]], turns[-1]
        return [{"role": t["role"], "content": t["content"]} for t in turns], None

    def _conversational(self, shape: str, obj: dict[str, Any], key: str) -> Parsed:
        turns = _turns(obj[key], key)
        prompt, answer = self._split_answer(turns, key)
        error = _is_error(obj)
        rid = _first(obj, _ID_KEYS)
        known = {key, "status", "error", *(k for k in _ID_KEYS if obj.get(k) is rid)}
        if answer is None:
            if error is None:
                status = obj.get("status")
                if shape == "specforge" and status is not None:
                    error = f"status {status!r} and no assistant turn"
                else:
                    raise LineError(f"{key} has no assistant turn at the end: a prompt, not generated output")
            return Parsed(shape, "error", prompt, None, _source_id(rid), _latency(obj), _timestamp(obj), error,
                          "source_error")
        reasoning = {k: answer[k] for k in REASONING_FIELDS if answer.get(k) is not None}
        return self._flat(shape, obj, prompt, known | set(_LATENCY_KEYS) | set(_TIME_KEYS), reasoning=reasoning,
                          content=answer.get("content"), finish_reason=obj.get("finish_reason"),
                          usage=_usage(obj), model=obj.get("model"), rid=rid, error=error,
                          latency=_latency(obj), ts=_timestamp(obj))

    def _specforge(self, obj: dict[str, Any]) -> Parsed:
        return self._conversational("specforge", obj, "conversations")

    def _conversations(self, obj: dict[str, Any]) -> Parsed:
        return self._conversational("conversations", obj, "conversations")

    def _messages(self, obj: dict[str, Any]) -> Parsed:
        return self._conversational("messages", obj, "messages")

    def _mapped(self, obj: dict[str, Any]) -> Parsed:
        m = self.mapping

        def get(key: str, default_keys: tuple[str, ...] = ()) -> Any:
            if key in m:
                v = lookup(obj, m[key])
                return None if v is _MISSING else v
            return _first(obj, default_keys) if default_keys else None

        if "content" in m and lookup(obj, m["content"]) is _MISSING and \
                ("reasoning" not in m or lookup(obj, m["reasoning"]) is _MISSING):
            raise LineError(f"--map content={m['content']} not found in this line (keys: {_keys(obj)})")
        if "content" not in m and "reasoning" in m and lookup(obj, m["reasoning"]) is _MISSING:
            raise LineError(f"--map reasoning={m['reasoning']} not found in this line (keys: {_keys(obj)})")
        messages: list[dict[str, Any]] = []
        if "messages" in m and get("messages") is not None:
            messages = _prompt_messages(get("messages"), m["messages"])
        elif "prompt" in m and get("prompt") is not None:
            messages = _prompt_messages(get("prompt"), m["prompt"])
        else:
            for key in ("messages", "prompt", "question"):
                if obj.get(key) is not None:
                    messages = _prompt_messages(obj[key], key)
                    break
        reasoning: dict[str, Any] = {}
        if "reasoning" in m:
            v = get("reasoning")
            leaf = m["reasoning"].rsplit(".", 1)[-1]
            if v is not None:
                reasoning[leaf if leaf in REASONING_FIELDS else "reasoning"] = v
        else:
            reasoning = {k: obj[k] for k in REASONING_FIELDS if obj.get(k) is not None}
        usage = _usage(obj) or {}
        for key in ("prompt_tokens", "completion_tokens"):
            if key in m and _int(get(key)) is not None:
                usage[key] = _int(get(key))
        latency = _num(get("latency_s")) if "latency_s" in m else _latency(obj)
        ts = parse_time(get("timestamp")) if "timestamp" in m else _timestamp(obj)
        error = _error_text(get("error")) if "error" in m else _is_error(obj)
        roots = {p.split(".", 1)[0] for p in m.values()}
        known = roots | {"content", "finish_reason", "usage", "model", "status", "error", *REASONING_FIELDS}
        return self._flat("mapped", obj, messages, known, reasoning=reasoning,
                          content=get("content", ("content",)), finish_reason=get("finish_reason", ("finish_reason",)),
                          usage=usage or None, model=get("model", ("model",)), rid=get("id", _ID_KEYS), error=error,
                          latency=latency, ts=ts)
