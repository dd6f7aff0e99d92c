"""The token view's chips as the page draws them (#28 item 8): in blocks the browser lays out only when they scroll
into view, and only the first differences from the server's ids outlined, each with a jump link.

A 32k-token record is 32k chips: drawn at once they cost seconds of layout; an outline on 8,743 of them says no more
than "almost all differ" and hides where the first one is.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..review import display as review_display

CHIP_CHUNK = 400
"""Chips per block; a block ends early after a line end once it holds a quarter of this (lines stay whole)."""
MAX_HOVER_ALTERNATIVES = 5
"""Alternatives a token's hover lists (the most likely first)."""
DIFF_OUTLINE = 20
"""Differences from the server's ids outlined (with jump links); the count says how many there are in all."""

_CHIP_WS = str.maketrans({" ": "·", "\n": "↵", "\t": "→", "\r": "␍"})
# Per loaded tokenizer: token id -> (shown text, hover title). A token looks the same in every record.
_CHIP_CACHE: weakref.WeakKeyDictionary[Any, dict[int, tuple[str, str]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ChipView:
    shown: str
    classes: str
    title: str
    anchor: str  # the element id of an outlined difference ("" for the others)
    lp: str = ""  # the token's logprobs, shown on hover (data-lp; "" without)


@dataclass(frozen=True)
class Outline:
    anchors: list[tuple[str, int]]  # (element id, token index) of the outlined differences
    total: int  # tokens that differ in all
    jumps: tuple[tuple[str, str, int], ...] = ()  # (label, element id, token index) of the record's landmarks


KIND_LABELS = {"think": "first think token", "role": "first role/turn token", "bos_eos": "first BOS/EOS token",
               "special": "first special token", "added": "first added token"}
"""The first token of every special kind gets a jump link (#37: a 30k-token record is 38,000 px long)."""


def landmarks(chips: list[Any]) -> list[tuple[str, int]]:
    """(label, token index) of where a long record's reader wants to go: `</think>`, the answer (the first trained
    text token after it), EOS (the last BOS/EOS token of the trained part), the first difference from the server's
    ids and the first token of every special kind; in token order, each index once."""
    out: dict[str, int] = {}
    end_think = next((i for i, c in enumerate(chips) if c.kind == "think" and "/" in (c.text or "")), None)
    if end_think is not None:
        out["</think>"] = end_think
    start = end_think + 1 if end_think is not None else 0
    answer = next((i for i in range(start, len(chips)) if chips[i].in_assistant and chips[i].kind == "text"), None)
    if answer is not None:
        out["the answer"] = answer
    eos = [i for i, c in enumerate(chips) if c.kind == "bos_eos" and c.in_assistant] or \
        [i for i, c in enumerate(chips) if c.kind == "bos_eos"][-1:]
    if eos:
        out["EOS"] = eos[-1]
    first_diff = next((i for i, c in enumerate(chips) if c.differs), None)
    if first_diff is not None:
        out["first difference"] = first_diff
    for kind, label in KIND_LABELS.items():
        i = next((i for i, c in enumerate(chips) if c.kind == kind), None)
        if i is not None:
            out[label] = i
    return sorted(out.items(), key=lambda kv: kv[1])


def logprob_hovers(lt: Any, rec: Mapping[str, Any], chips: list[Any], prompt_len: int) -> dict[int, str]:
    """Chip index -> what its hover adds (#38 item 5): the chosen token's p and logprob, and the top alternatives
    with theirs, from the record's logprobs aligned to its completion tokens (export/logprobs.py). Plain text: the
    template escapes it like all model text."""
    if not rec.get("logprobs_json"):
        return {}
    from ..export.logprobs import aligned

    got = aligned(rec, [c.id for c in chips[prompt_len:]], lt, with_text=True)
    lps = got.get("completion_logprobs") or []
    top_ids, top_lps = got.get("completion_top_ids") or [], got.get("completion_top_logprobs") or []
    top_text = got.get("completion_top_text") or []
    out: dict[int, str] = {}
    for j, lp in enumerate(lps):
        if lp is None:
            continue
        text = f"p {math.exp(lp):.3f} (logprob {lp:.3f})"
        if j < len(top_ids) and top_ids[j]:
            texts = top_text[j] if j < len(top_text) and top_text[j] else [None] * len(top_ids[j])
            alts = [f"{(s if s is not None else _piece(lt, t))[:40]!r} {math.exp(v):.3f}"
                    for t, v, s in zip(top_ids[j], top_lps[j], texts, strict=False)
                    if v is not None][:MAX_HOVER_ALTERNATIVES]
            text += " · top: " + ", ".join(alts)
        out[prompt_len + j] = text
    return out


def _piece(lt: Any, tid: int) -> str:
    if tid < 0:
        return "?"
    try:
        return str(lt.tok.decode([tid]))[:40]
    except Exception:  # an id the tokenizer does not know
        return f"id {tid}"


def chip_views(lt: Any, chips: list[Any], hovers: Mapping[int, str] | None = None
               ) -> tuple[list[ChipView], Outline]:
    """One view per chip (the template escapes every field), and the outline of the first differences; ``hovers``:
    chip index -> text its hover adds (the token's logprobs)."""
    cache = _CHIP_CACHE.setdefault(lt, {})
    out = []
    anchors: list[tuple[str, int]] = []
    total = 0
    marks = landmarks(chips)
    marked = {i for _, i in marks}
    for i, c in enumerate(chips):
        seen = cache.get(c.id)
        if seen is None:
            shown = "".join(m if k != "t" else m.translate(_CHIP_WS) for k, m in review_display.segments(c.text)) or "∅"
            seen = cache[c.id] = (shown, f"id {c.id} · {c.kind} · bytes {c.raw_bytes or '–'} · piece {c.piece!r}")
        classes = f"chip k-{c.kind}" + (" asst" if c.in_assistant else "")
        anchor = f"tok-{i}" if i in marked else ""
        if c.differs:
            total += 1
            if len(anchors) < DIFF_OUTLINE:
                anchor = f"tok-{i}"
                anchors.append((anchor, i))
                classes += " differs"
        lp = hovers.get(i, "") if hovers else ""
        if lp:
            classes += " has-lp"
        out.append(ChipView(seen[0], classes, seen[1] + (" · trained" if c.in_assistant else " · not trained"),
                            anchor, lp))
    return out, Outline(anchors, total, tuple((label, f"tok-{i}", i) for label, i in marks))


def chunked(views: list[ChipView], size: int = CHIP_CHUNK) -> list[list[ChipView]]:
    """Blocks of at most `size` chips, cut after a line end once a block holds size // 4."""
    out: list[list[ChipView]] = []
    cur: list[ChipView] = []
    for v in views:
        cur.append(v)
        if len(cur) >= size or (len(cur) >= size // 4 and v.shown.endswith("↵")):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out
