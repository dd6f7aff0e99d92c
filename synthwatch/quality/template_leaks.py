"""Template text in a record's text (#35): what the checks ``template_tokens_in_text`` and ``think_tags_in_content``
look for, and how they tell a marker the model *emitted* from text that *discusses* one.

A chat template's control strings (``<｜end▁of▁sentence｜>``, ``<|im_end|><|im_start|>user``, ``<|eot_id|>``, Kimi's
``<|im_middle|>``...) never belong in the text a model wrote: when one shows up there, the server's detokenizer
printed a special token (``skip_special_tokens`` off), the model ran past its end of turn and started the next
one, or a template was applied twice. Trained on, the model learns to write them. The markers are:

- a built-in list for the known template families (ChatML/Qwen, Llama 3, Kimi, DeepSeek, Gemma, Phi, gpt-oss's
  harmony), and every ``<｜...｜>`` / ``<|...|>`` marker of the chat templates shipped in synthwatch/data; any
  ``<｜...｜>`` (full-width bars: DeepSeek's shape, which no prose uses) counts, listed or not;
- when the run names a tokenizer, its added tokens of a template marker's shape (read from tokenizer.json and
  tokenizer_config.json, without loading transformers), and the markers its chat template file names.

A marker is *discussed*, not emitted, when it sits in a code span (```` `<|im_end|>` ````), a fenced code block, or
between quotes (``"</think>"``, ``'</think>'``, ``“</think>”``): an answer that explains a format quotes it. A bare
marker in prose counts (the trainer's tokenizer reads it as the special token whatever was meant).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger("synthwatch.checks")

# the control strings of the chat templates people generate with (their tokenizers' special tokens)
BUILTIN_MARKERS: frozenset[str] = frozenset({
    # ChatML (Qwen, many fine-tunes)
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_sep|>",
    # Llama 3
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>",
    # Kimi K2
    "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    # DeepSeek (V3, R1, V4: the shipped template adds its own below)
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    # Gemma
    "<start_of_turn>", "<end_of_turn>",
    # Phi-3 / Phi-4
    "<|user|>", "<|assistant|>", "<|system|>", "<|end|>",
    # gpt-oss (harmony)
    "<|start|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>", "<|constrain|>",
})  # fmt: skip
# a marker's shape: <|...|> or <｜...｜> (full-width bars, DeepSeek); the rest (<start_of_turn>) is listed
BAR_MARKER = re.compile(r"<[|｜][^<>\s|｜]{1,80}[|｜]>")
_OTHER_SHAPE = re.compile(r"^<[A-Za-z][\w▁]*_[\w▁]*>$")  # <start_of_turn>: an underscore, no HTML tag has one
_QUOTES = {'"': '"', "'": "'", "“": "”", "‘": "’", "«": "»", "„": "“"}
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def markers_in(text: str) -> set[str]:
    """The template markers a chat template (or any text) names."""
    return set(BAR_MARKER.findall(text)) | {m for m in BUILTIN_MARKERS if not BAR_MARKER.fullmatch(m) and m in text}


@functools.cache
def shipped_markers() -> frozenset[str]:
    """The built-in list plus the markers of the chat templates shipped in synthwatch/data/chat_templates."""
    found: set[str] = set(BUILTIN_MARKERS)
    for f in resources.files("synthwatch").joinpath("data", "chat_templates").iterdir():
        if f.name.endswith(".jinja"):
            found |= markers_in(f.read_text(encoding="utf-8"))
    return frozenset(found)


MAX_FILE_BYTES = 64 * 1024 * 1024  # a tokenizer.json of a 200k vocabulary is ~10 MB; a bigger file is not read


def _read(path: str | Path) -> str | None:
    """A tokenizer or template file's text, or None (logged) when it cannot be read or is too big to be one."""
    p = Path(path).expanduser()
    try:
        if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
            log.warning("template_tokens_in_text: %s is not read (not a file, or over %d MB)", p.name,
                        MAX_FILE_BYTES >> 20)
            return None
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("template_tokens_in_text: %s not read: %s", p.name, exc)
        return None


def _marker_like(s: str) -> bool:
    return bool(BAR_MARKER.fullmatch(s) or _OTHER_SHAPE.match(s))


@functools.cache
def tokenizer_markers(name_or_path: str, chat_template: str | None = None) -> frozenset[str]:
    """The added tokens of a tokenizer that have a template marker's shape, and the markers its chat template file
    names; empty when it cannot be read (logged: the built-in list still applies)."""
    from ..tokens.tokenizer import TokenizerError, tokenizer_files  # noqa: PLC0415 - only runs with a tokenizer

    found: set[str] = set()
    try:
        files = tokenizer_files(name_or_path)
    except TokenizerError as exc:
        log.warning("template_tokens_in_text: the tokenizer's special tokens are not read (%s); the built-in list "
                    "applies", exc)
        files = {}
    for name, path in files.items():
        raw = _read(path)
        try:
            data: Any = json.loads(raw) if raw is not None else None
        except ValueError as exc:
            log.warning("template_tokens_in_text: %s not read: %s", name, exc)
            continue
        if not isinstance(data, dict):
            continue
        if name == "tokenizer.json":
            found |= {t.get("content", "") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
        elif name == "tokenizer_config.json":
            found |= {t.get("content", "") for t in (data.get("added_tokens_decoder") or {}).values()
                      if isinstance(t, dict)}
            for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
                tok = data.get(key)
                found.add(tok.get("content", "") if isinstance(tok, dict) else tok if isinstance(tok, str) else "")
            if isinstance(data.get("chat_template"), str):
                found |= markers_in(data["chat_template"])
    template = _read(chat_template) if chat_template and Path(chat_template).expanduser().is_file() else None
    if template is not None:
        found |= markers_in(template)
    return frozenset(m for m in found if isinstance(m, str) and _marker_like(m))


def run_markers(tokenizer: dict[str, Any] | None, exclude: Iterable[str] = ()) -> frozenset[str]:
    """The markers a run's check looks for: the shipped ones and its tokenizer's; minus ``exclude`` (the think tags,
    which think_tags_in_content owns)."""
    found = set(shipped_markers())
    if tokenizer and tokenizer.get("name_or_path"):
        found |= tokenizer_markers(str(tokenizer["name_or_path"]), tokenizer.get("chat_template"))
    return frozenset(found - set(exclude))


def _code_ranges(text: str) -> list[tuple[int, int]]:
    """Where text is code: fenced blocks, then inline spans outside them (Markdown's rules, simplified)."""
    ranges = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    pos = 0
    for a, b in [*ranges, (len(text), len(text))]:
        ranges += [(pos + m.start(), pos + m.end()) for m in _SPAN.finditer(text[pos:a])]
        pos = b
    return ranges


def _quoted(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    return before in _QUOTES and after == _QUOTES[before]


def emitted(text: str, found: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Of the (start, end) spans of markers found in text, those the model emitted: not in code, not quoted."""
    spans = list(found)
    if not spans:
        return []
    code = _code_ranges(text) if "`" in text or "~~~" in text else []
    return [(a, b) for a, b in spans
            if not _quoted(text, a, b) and not any(c0 <= a and b <= c1 for c0, c1 in code)]


def find_tags(text: str, tags: Iterable[str]) -> list[str]:
    """The think tags emitted in text (think_tags_in_content): each tag once, in the order given."""
    out = []
    for t in tags:
        if t and t[0] in text and t in text:
            spans, i = [], text.find(t)
            while i >= 0:
                spans.append((i, i + len(t)))
                i = text.find(t, i + 1)
            if emitted(text, spans):
                out.append(t)
    return out


class MarkerFinder:
    """template_tokens_in_text on one text: the markers emitted in it, first ones first (at most ``limit``)."""

    def __init__(self, markers: frozenset[str]) -> None:
        self.markers = markers
        others = sorted((m for m in markers if not BAR_MARKER.fullmatch(m)), key=len, reverse=True)
        self.rx = re.compile(BAR_MARKER.pattern + "".join("|" + re.escape(m) for m in others))

    def find(self, text: str, limit: int = 5) -> list[str]:
        if "<" not in text:  # one memchr: most texts stop here
            return []
        # <｜...｜> (full-width bars) is DeepSeek's marker shape and nothing else's: each one counts, listed or not
        spans = [(m.start(), m.end()) for m in self.rx.finditer(text)
                 if m.group() in self.markers or m.group().startswith("<｜")]
        out: list[str] = []
        for a, b in emitted(text, spans):
            if text[a:b] not in out:
                out.append(text[a:b])
                if len(out) >= limit:
                    break
        return out
