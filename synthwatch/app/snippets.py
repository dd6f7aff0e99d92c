"""Search snippets for the records table: the words of a search, highlighted, from the field that matched.

A snippet is a list of (text, marked) pieces; templates print each piece escaped and wrap the marked
ones in <mark>, so model output never reaches the page as markup."""

from __future__ import annotations

import re
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store.queue import int_lists

FIELDS = ("prompt", "reasoning", "content")
READ_CHARS = 200_000  # a match further into a field than this shows no snippet
CONTEXT_CHARS = 70
_WS = re.compile(r"\s+")


def terms(q: str) -> list[re.Pattern[str]]:
    """The search's words as case-insensitive patterns: whole words, or prefixes for `word*` (as the search)."""
    out = []
    for word in q.split():
        prefix = word.endswith("*") and len(word) > 1
        word = word.rstrip("*") if prefix else word
        if word:
            out.append(re.compile(r"(?<!\w)" + re.escape(word) + (r"\w*" if prefix else r"(?!\w)"), re.IGNORECASE))
    return out


def _prompt_text(prompt_json: str) -> str:
    try:
        messages = orjson.loads(prompt_json)
    except orjson.JSONDecodeError:
        return prompt_json
    parts = []
    for m in messages if isinstance(messages, list) else []:
        c = m.get("content", m.get("value", "")) if isinstance(m, dict) else ""
        if isinstance(c, list):
            c = " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
        parts.append(str(c))
    return " · ".join(parts)


def snippet(value: str, pats: list[re.Pattern[str]]) -> list[tuple[str, bool]] | None:
    """Pieces around the first match in value, every match in that window marked; None without a match."""
    hits = sorted((m.start(), m.end()) for p in pats for m in p.finditer(value))
    if not hits:
        return None
    start = max(0, hits[0][0] - CONTEXT_CHARS)
    end = min(len(value), hits[0][1] + 2 * CONTEXT_CHARS)
    pieces: list[tuple[str, bool]] = [("…", False)] if start else []
    pos = start
    for a, b in hits:
        if a < pos or a >= end:
            continue
        b = min(b, end)
        pieces.append((value[pos:a], False))
        pieces.append((value[a:b], True))
        pos = b
    pieces.append((value[pos:end], False))
    if end < len(value):
        pieces.append(("…", False))
    return [(_WS.sub(" ", t), marked) for t, marked in pieces if t]


def for_rows(conn: Connection, ids: list[int], q: str, field_name: str = "all") -> dict[int, dict[str, Any]]:
    """record id -> {"field": where it matched, "pieces": snippet} for the rows of one page."""
    pats = terms(q)
    if not ids or not pats:
        return {}
    fields = FIELDS if field_name not in FIELDS else (field_name,)
    out: dict[int, dict[str, Any]] = {}
    for chunk in int_lists(ids):
        rows = conn.execute(text(
            f"SELECT id, substr(prompt_json, 1, {READ_CHARS}), substr(reasoning, 1, {READ_CHARS}),"
            f" substr(content, 1, {READ_CHARS}) FROM record WHERE id IN ({chunk})"))
        for rid, prompt, reasoning, content in rows:
            values = {"prompt": _prompt_text(prompt or ""), "reasoning": reasoning or "", "content": content or ""}
            # the field holding the most of the words (ties: prompt, reasoning, content)
            best = max(fields, key=lambda f: sum(1 for p in pats if p.search(values[f])))
            pieces = snippet(values[best], pats)
            if pieces:
                out[int(rid)] = {"field": best, "pieces": pieces}
    return out
