"""Reasoning capture from streamed chunks and full chat completions, wherever the server puts it.

Servers disagree on where the chain of thought goes (see docs: reasoning-fields.md):
``reasoning`` (vLLM >= 0.16, Ollama /v1, OpenRouter), ``reasoning_content`` (vLLM <= 0.15, SGLang,
llama.cpp, DeepSeek API), both with the same text (vLLM 0.11.1-0.15), ``reasoning_details``
(OpenRouter), ``thinking`` (Ollama native), or inline ``<think>...</think>`` in ``content``
(no reasoning parser, llama.cpp ``--reasoning-format none``), sometimes without the opening tag
because the chat template already wrote it.

``mode="auto"`` reads them all and picks one; an explicit mode reads one place only and reports
text found elsewhere in :attr:`Extracted.unread_fields` (the field-mismatch check uses it).

Decisions worth knowing:

- Streamed pieces are kept in lists and joined once in :meth:`stream.StreamAccumulator.result`, so inline
  tags split across chunks need no state machine: the joined content goes through
  :func:`split_inline` exactly like a non-streamed one.
- Unknown keys are kept verbatim in :attr:`Extracted.extra`, ``null`` values included (which keys a
  server sends identifies it). Streaming: unknown *delta* string values are concatenated (they are
  token pieces); every other unknown value (choice, top level, non-string delta) keeps its last
  non-null value, or ``None`` if it was only ever null; ``tool_calls`` delta items are appended to
  one list; ``logprobs`` lists (``content``, ``refusal``) are concatenated.
- Nothing malformed raises from :meth:`stream.StreamAccumulator.feed`; it is described in ``problems``.
- Only choice index 0 is read (n > 1 is not supported; other choices are noted in ``problems``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .safety import check_usage

__all__ = [
    "KNOWN_CHOICE_KEYS",
    "KNOWN_MESSAGE_KEYS",
    "KNOWN_TOP_KEYS",
    "MODES",
    "REASONING_FIELDS",
    "FIELD_SOURCES",
    "SOURCES",
    "Extracted",
    "ResponseShapeError",
    "extract_response",
    "looks_inline",
    "rederive",
    "split_inline",
]

REASONING_FIELDS = ("reasoning", "reasoning_content", "reasoning_details", "thinking")
# Where a run reads reasoning from (run setting reasoning.mode); the flags, the forms and the config take it from here.
ReasoningMode = Literal["auto", "reasoning", "reasoning_content", "reasoning_details", "thinking", "inline", "none"]
MODES: tuple[str, ...] = get_args(ReasoningMode)
SOURCES = (
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "thinking",
    "inline",
    "inline-no-open",
    "none",
)
# sources whose text came in a field of its own: a stream's chunks then say which of their ids are reasoning
FIELD_SOURCES = frozenset({"reasoning", "reasoning_content", "reasoning_details", "thinking"})

# Keys read into Extracted's own fields (or pure protocol boilerplate); everything else is "extra".
KNOWN_TOP_KEYS = frozenset(
    {"id", "object", "created", "model", "choices", "system_fingerprint", "usage", "prompt_token_ids"}
)
KNOWN_CHOICE_KEYS = frozenset({"index", "message", "delta", "finish_reason", "token_ids"})
KNOWN_MESSAGE_KEYS = frozenset({"role", "content", *REASONING_FIELDS})

MISSING: Any = object()
_MAX_PROBLEMS = 50


class ResponseShapeError(ValueError):
    """The body is not a chat.completion (an error object, no choices, no message, ...)."""


@dataclass(slots=True)
class Extracted:
    reasoning: str  # "" when none
    content: str  # "" when none (null content -> "")
    content_was_null: bool
    reasoning_source: str  # one of SOURCES
    finish_reason: str | None
    usage: dict[str, Any] | None  # as sent
    token_ids: list[int] | None  # choices[0].token_ids (concatenated when streaming)
    prompt_token_ids: list[int] | None
    response_id: str | None
    model: str | None
    system_fingerprint: str | None
    # unknown fields verbatim (nulls too): {"top": {...}, "choice": {...}, "message" | "delta": {...}},
    # only non-empty sections
    extra: dict[str, dict[str, Any]]
    # reasoning-like text the mode did not use: field name (or "inline") -> text
    unread_fields: dict[str, str]
    # fields that carried the chosen reasoning again (not counted twice); "inline" when content
    # repeated it inside think tags (and was cleaned)
    duplicate_fields: list[str]
    n_chunks: int  # streamed events parsed (0 for non-streaming)
    problems: list[str] = field(default_factory=list)  # malformed shapes seen, never raised
    # the content as the server sent it, when the reading changed it (inline think tags split off): with the
    # field texts (reasoning, unread_fields, duplicate_fields) it is what a re-derive reads again
    raw_content: str | None = None
    # reasoning tokens counted from the completion's ids (synthwatch.capture.token_count): the ids of a stream's
    # reasoning chunks, or the ids before the think-close token where the run's tokenizer names its id
    reasoning_ids: int | None = None
    # choices[0].logprobs packed (synthwatch.capture.logprobs, the record's logprobs_json); None when none were sent
    logprobs: str | None = None


# --------------------------------------------------------------------------------------------
# inline tags and field resolution (shared by streaming and non-streaming)


def split_inline(
    text: str,
    think_open: str = "<think>",
    think_close: str = "</think>",
    prefilled_open: bool = False,
    truncated: bool = False,
) -> tuple[str, str, str]:
    """Split ``text`` holding inline think tags into ``(reasoning, content, source)``.

    - ``<think>r</think>c`` -> ``(r, c, "inline")``; whitespace before ``<think>`` is allowed;
    - ``r</think>c`` (the template prefilled ``<think>``) -> ``(r, c, "inline-no-open")``;
    - ``<think>r`` (never closed: truncated) -> ``(r, "", "inline")``;
    - no tag, ``prefilled_open`` and ``truncated`` -> ``(text, "", "inline-no-open")``;
    - no tag otherwise -> ``("", text, "none")``.

    Only the first closing tag splits: a literal closing tag later in the answer stays in content.
    Leading ``\\n`` characters of the content are dropped (models write ``</think>\\n\\n``);
    vLLM's parsers keep them, SGLang strips all surrounding whitespace: we strip newlines only.
    The reasoning is returned verbatim.
    """
    opened = False
    body = text
    if think_open:
        stripped = text.lstrip()
        if stripped.startswith(think_open):
            body = stripped[len(think_open) :]
            opened = True
    i = body.find(think_close) if think_close else -1
    if i >= 0:
        return body[:i], body[i + len(think_close) :].lstrip("\n"), "inline" if opened else "inline-no-open"
    if opened:
        return body, "", "inline"
    if prefilled_open and truncated and text:
        return text, "", "inline-no-open"
    return "", text, "none"


def _same(a: str, b: str) -> bool:
    return a == b or a.strip() == b.strip()


def resolve(
    texts: dict[str, str],
    content: str,
    finish_reason: Any,
    mode: str,
    think_open: str,
    think_close: str,
    prefilled_open: bool,
) -> tuple[str, str, str, dict[str, str], list[str]]:
    """Pick the reasoning: returns (reasoning, content, source, unread_fields, duplicate_fields)."""
    unread: dict[str, str] = {}
    dups: list[str] = []
    chosen: str | None = None
    if mode == "auto":
        for name in REASONING_FIELDS:
            if texts.get(name):
                chosen = name
                break
    elif mode in REASONING_FIELDS:
        chosen = mode
    reasoning = texts.get(chosen, "") if chosen is not None else ""
    source = chosen if reasoning and chosen is not None else "none"
    for name in REASONING_FIELDS:
        if name == chosen:
            continue
        t = texts.get(name)
        if t:
            if reasoning and _same(t, reasoning):
                dups.append(name)
            else:
                unread[name] = t
    if mode == "inline" or (mode == "auto" and not reasoning):
        r, c, s = split_inline(content, think_open, think_close, prefilled_open, finish_reason == "length")
        if s != "none":
            return r, c, s, unread, dups
        return reasoning, content, source, unread, dups
    # A field was read (or nothing, in "none" / an explicit field mode): reasoning left inline?
    r, c, s = split_inline(content, think_open, think_close, False, False)
    if s != "none" and r.strip():
        if reasoning and _same(r, reasoning):
            dups.append("inline")  # deepseek-legacy: same text in the field and inline
            content = c
        elif reasoning or looks_inline(content, s, think_open, think_close):
            # Kept for a re-derive and shown by the probe. The field-mismatch check counts it only when the field
            # read is empty (synthwatch.quality.checks): a field that holds the reasoning was read right, and a
            # `</think>` in its content is the model's own text (vLLM 0.32: a model sampled a second `</think>`
            # after the parser had split at the first). With the field empty, a tag the answer quotes is no
            # evidence either.
            unread["inline"] = r
    return reasoning, content, source, unread, dups


# characters around a think tag that say it is quoted (`</think>`, "</think>", a code sample), not a delimiter
_QUOTE_BEFORE = frozenset("`'\"“‘\\/(<[")
_QUOTE_AFTER = frozenset("`'\"”’)]")


def looks_inline(content: str, source: str, think_open: str, think_close: str) -> bool:
    """Does ``content`` hold reasoning written inline (the server ran no reasoning parser), rather than a
    think tag the model mentions in its answer?

    A content that starts with the opening tag (``source == "inline"``) is inline reasoning. Without the
    opening tag (``inline-no-open``: a template that prefilled it), the closing tag must be a delimiter:
    not quoted (a backtick, a quote or a bracket right before or after it), not a word between spaces in a
    sentence, and not preceded by an opening tag further in (``wrap it in <think> ... </think>`` is prose
    about tags). Models close their reasoning with ``</think>`` at a line break or right after the last
    word (``...so 42.</think>The answer``), which all count.
    """
    if source == "inline":
        return True
    if source != "inline-no-open" or not think_close:
        return False
    i = content.find(think_close)
    if i <= 0:
        return False
    if think_open and think_open in content[:i]:
        return False
    before = content[i - 1]
    j = i + len(think_close)
    after = content[j] if j < len(content) else ""
    if before in (" ", "\t") and after in (" ", "\t"):  # a word in a sentence ("until it emits </think> and then")
        return False
    return before not in _QUOTE_BEFORE and after not in _QUOTE_AFTER


def details_text(items: Any, problems: Problems) -> str:
    """Text of OpenRouter ``reasoning_details``: reasoning.text / reasoning.summary items."""
    if type(items) is not list:
        problems.add(f"reasoning_details is {tname(items)}, not a list")
        return ""
    out: list[str] = []
    for item in items:
        if type(item) is not dict:
            problems.add(f"reasoning_details item is {tname(item)}, not an object")
            continue
        kind = item.get("type")
        if kind == "reasoning.text":
            t = item.get("text")
        elif kind == "reasoning.summary":
            t = item.get("summary")
        else:
            continue  # reasoning.encrypted and unknown kinds carry no readable text
        if type(t) is str:
            out.append(t)
        elif t is not None:
            problems.add(f"reasoning_details {kind} text is {tname(t)}, not a string")
    return "".join(out)


def thinking_text(v: Any, problems: Problems) -> str:
    if type(v) is str:
        return v
    if type(v) is dict:
        t = v.get("text", v.get("thinking"))
        if type(t) is str:
            return t
    problems.add(f"thinking is {tname(v)} without text")
    return ""


def content_parts(v: Any, problems: Problems, thinking: list[str]) -> str:
    """Content sent as a list of parts (Mistral style): text parts joined, thinking parts kept."""
    out: list[str] = []
    for part in v:
        if type(part) is str:
            out.append(part)
            continue
        if type(part) is not dict:
            problems.add(f"content part is {tname(part)}")
            continue
        kind = part.get("type")
        if kind == "text" and type(part.get("text")) is str:
            out.append(part["text"])
        elif kind == "thinking":
            inner = part.get("thinking")
            if type(inner) is str:
                thinking.append(inner)
            elif type(inner) is list:
                thinking.append(content_parts(inner, problems, thinking))
        else:
            problems.add(f"content part of type {kind!r} ignored")
    return "".join(out)


def tname(v: Any) -> str:
    return "null" if v is None else type(v).__name__


class Problems:
    """Distinct problem messages, capped."""

    __slots__ = ("dropped", "items")

    def __init__(self) -> None:
        self.items: dict[str, None] = {}
        self.dropped = 0

    def add(self, msg: str) -> None:
        if msg in self.items:
            return
        if len(self.items) >= _MAX_PROBLEMS:
            self.dropped += 1
            return
        self.items[msg] = None

    def as_list(self) -> list[str]:
        out = list(self.items)
        if self.dropped:
            out.append(f"... {self.dropped} more distinct problems")
        return out


def opt_str(v: Any, what: str, problems: Problems) -> str | None:
    if v is None or type(v) is str:
        return v
    problems.add(f"{what} is {tname(v)}, not a string")
    return str(v)


def int_list(v: Any, what: str, problems: Problems) -> list[int] | None:
    if v is None:
        return None
    if type(v) is list and all(type(x) is int for x in v):
        return v
    problems.add(f"{what} is not a list of integers")
    return None


def copy2(v: Any) -> Any:
    """Copy a dict and the lists directly inside it (the containers the accumulator extends)."""
    if type(v) is dict:
        return {k: (list(x) if type(x) is list else x) for k, x in v.items()}
    return v


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown reasoning mode {mode!r}; expected one of {', '.join(MODES)}")


# --------------------------------------------------------------------------------------------
# non-streaming


def _describe_error(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message")
        bits = [str(msg) if msg is not None else ""]
        bits += [f"{k}={err[k]}" for k in ("type", "code", "param") if err.get(k) is not None]
        text = " ".join(b for b in bits if b)
        return text or repr(err)[:500]
    return str(err)[:500]


def extract_response(
    body: Any,
    mode: str = "auto",
    think_open: str = "<think>",
    think_close: str = "</think>",
    prefilled_open: bool = False,
) -> Extracted:
    """Read a non-streaming ``chat.completion``. Raises :class:`ResponseShapeError` when it isn't one."""
    check_mode(mode)
    if not isinstance(body, dict):
        raise ResponseShapeError(f"response is {tname(body)}, not a JSON object")
    problems = Problems()
    choices = body.get("choices")
    if choices is None:
        err = body.get("error")
        if err is not None:
            raise ResponseShapeError(f"server returned an error object: {_describe_error(err)}")
        if isinstance(body.get("message"), dict) and "done" in body:
            raise ResponseShapeError(
                "response has no 'choices': it looks like an Ollama native /api/chat reply; "
                "use the OpenAI-compatible /v1/chat/completions endpoint"
            )
        keys = ", ".join(sorted(map(str, body))[:12]) or "none"
        raise ResponseShapeError(f"response has no 'choices' (keys: {keys}): not a chat.completion")
    if not isinstance(choices, list):
        raise ResponseShapeError(f"'choices' is {tname(choices)}, not a list")
    if not choices:
        raise ResponseShapeError("'choices' is empty: the response carries no message")
    if body.get("error") is not None:
        problems.add(f"response carries an error next to choices: {_describe_error(body['error'])}")
    choice = choices[0]
    if len(choices) > 1:
        for c in choices:
            if isinstance(c, dict) and c.get("index") == 0:
                choice = c
                break
        problems.add(f"{len(choices)} choices: only index 0 is read")
    if not isinstance(choice, dict):
        raise ResponseShapeError(f"choices[0] is {tname(choice)}, not an object")
    msg = choice.get("message")
    if not isinstance(msg, dict):
        if "text" in choice:
            raise ResponseShapeError("choices[0] has 'text' but no 'message': a text completion, not chat")
        if "delta" in choice:
            raise ResponseShapeError("choices[0] has 'delta': a stream chunk, not a chat.completion")
        raise ResponseShapeError(f"choices[0].message is {tname(msg)}, not an object")

    thinking_parts: list[str] = []
    raw_content = msg.get("content")
    content_was_null = raw_content is None
    if raw_content is None:
        content = ""
    elif type(raw_content) is str:
        content = raw_content
    elif type(raw_content) is list:
        content = content_parts(raw_content, problems, thinking_parts)
    else:
        problems.add(f"message.content is {tname(raw_content)}, not a string")
        content = ""

    texts: dict[str, str] = {}
    for name in ("reasoning", "reasoning_content"):
        v = msg.get(name)
        if type(v) is str:
            texts[name] = v
        elif v is not None:
            problems.add(f"message.{name} is {tname(v)}, not a string")
    v = msg.get("reasoning_details")
    if v is not None:
        texts["reasoning_details"] = details_text(v, problems)
    v = msg.get("thinking")
    if v is not None:
        thinking_parts.insert(0, thinking_text(v, problems))
    if thinking_parts:
        texts["thinking"] = "".join(thinking_parts)

    finish_reason = opt_str(choice.get("finish_reason"), "finish_reason", problems)
    sent_content = content
    reasoning, content, source, unread, dups = resolve(
        texts, content, finish_reason, mode, think_open, think_close, prefilled_open
    )
    usage = body.get("usage")
    if usage is not None and not isinstance(usage, dict):
        problems.add(f"usage is {tname(usage)}, not an object")
        usage = None
    if usage is not None:
        check_usage(usage, problems)

    extra: dict[str, dict[str, Any]] = {}
    for section, src, known in (
        ("top", body, KNOWN_TOP_KEYS),
        ("choice", choice, KNOWN_CHOICE_KEYS),
        ("message", msg, KNOWN_MESSAGE_KEYS),
    ):
        unknown = {k: v for k, v in src.items() if k not in known}
        if unknown:
            extra[section] = unknown

    return Extracted(
        reasoning=reasoning,
        content=content,
        content_was_null=content_was_null,
        reasoning_source=source,
        finish_reason=finish_reason,
        usage=usage,
        token_ids=int_list(choice.get("token_ids"), "choices[0].token_ids", problems),
        prompt_token_ids=int_list(body.get("prompt_token_ids"), "prompt_token_ids", problems),
        response_id=opt_str(body.get("id"), "id", problems),
        model=opt_str(body.get("model"), "model", problems),
        system_fingerprint=opt_str(body.get("system_fingerprint"), "system_fingerprint", problems),
        extra=extra,
        unread_fields=unread,
        duplicate_fields=dups,
        n_chunks=0,
        problems=problems.as_list(),
        raw_content=None if content == sent_content else sent_content,
    )


def rederive(
    texts: dict[str, str],
    sent_content: str,
    finish_reason: str | None,
    mode: str,
    think_open: str = "<think>",
    think_close: str = "</think>",
    prefilled_open: bool = False,
) -> tuple[str, str, str, dict[str, str], list[str]]:
    """Read a stored answer again under other reading settings: the field texts and the content as sent ->
    (reasoning, content, source, unread_fields, duplicate_fields), exactly as a live response would give."""
    check_mode(mode)
    return resolve(texts, sent_content, finish_reason, mode, think_open, think_close, prefilled_open)
