"""Model text made safe to show: (kind, text) segments that templates escape one by one, invisible
characters shown as visible markers."""

from __future__ import annotations

import re
import unicodedata

# ----------------------------------------------------------------------------------------- display

# Characters that change how text looks without being seen: zero-width, bidi controls, C0/C1 controls.
_INVISIBLE = re.compile(
    "[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u00ad\u061c\u180e\u034f"
    "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufff9-\ufffb\U000e0000-\U000e007f]"
)
_INVISIBLE_WS = re.compile("(" + _INVISIBLE.pattern[:-1] + r" \t\r\n\u00a0\u2000-\u200a\u3000]+)")
_INVISIBLE_SPLIT = re.compile("(" + _INVISIBLE.pattern + "+)")
_WS_SHOW = {" ": "·", "\t": "→\t", "\n": "↵\n", "\r": "␍", "\u00a0": "⍽", "\u3000": "□"}


def _marker(ch: str) -> str:
    name = unicodedata.name(ch, "")
    abbrev = {
        "\u202e": "RLO", "\u202d": "LRO", "\u202a": "LRE", "\u202b": "RLE", "\u202c": "PDF",
        "\u2066": "LRI", "\u2067": "RLI", "\u2068": "FSI", "\u2069": "PDI", "\u200b": "ZWSP",
        "\u200c": "ZWNJ", "\u200d": "ZWJ", "\u200e": "LRM", "\u200f": "RLM", "\ufeff": "BOM", "\u00ad": "SHY",
    }.get(ch) or name
    return f"⟨U+{ord(ch):04X}{' ' + abbrev if abbrev else ''}⟩"


def segments(value: str, *, whitespace: bool = False) -> list[tuple[str, str]]:
    """Split text into ("t", text) and ("inv", marker) / ("ws", shown) segments for literal display.

    Invisible and bidi-control characters always become visible markers; with `whitespace`, spaces, tabs and
    newlines are shown as · → ↵ too. Templates escape every segment.
    """
    pattern = _INVISIBLE_WS if whitespace else _INVISIBLE
    parts = pattern.split(value) if pattern is _INVISIBLE_WS else _INVISIBLE_SPLIT.split(value)
    out: list[tuple[str, str]] = []
    append = out.append
    # re.split with one capturing group alternates text, match, text, ...
    for n, part in enumerate(parts):
        if not part:
            continue
        if n % 2 == 0:
            append(("t", part))
            continue
        buf: list[str] = []
        for ch in part:
            shown = _WS_SHOW.get(ch)
            if shown is None and "\u2000" <= ch <= "\u200a":
                shown = "␣"
            if shown is not None:
                buf.append(shown)
                continue
            if buf:
                append(("ws", "".join(buf)))
                buf = []
            append(("inv", _marker(ch)))
        if buf:
            append(("ws", "".join(buf)))
    return out


def emptiness(value: str | None) -> str | None:
    """Why a text field counts as empty (None when it has visible content)."""
    if value is None:
        return "EMPTY (null)"
    if value == "":
        return "EMPTY"
    stripped = _INVISIBLE.sub("", value).strip()
    if not stripped:
        return f"EMPTY (only {len(value)} whitespace/invisible characters)"
    return None


def count_invisible(value: str | None) -> int:
    return len(_INVISIBLE.findall(value)) if value else 0


TEXT_CHUNK_CHARS = 4_000
"""A long text is shown in blocks of about this many characters, each laid out only when it scrolls into view
(CSS content-visibility): a 32k-token answer renders its first screen without laying out the rest (#28)."""


def chunks(segs: list[tuple[str, str]], size: int = TEXT_CHUNK_CHARS) -> list[list[tuple[str, str]]]:
    """Cut display segments into runs of about `size` characters, a text segment preferably after a line end.

    Joined back in order the runs give the segments' text unchanged; markers are never cut.
    """
    out: list[list[tuple[str, str]]] = []
    cur: list[tuple[str, str]] = []
    n = 0
    for kind, s in segs:
        at = 0  # where the rest of s starts: cut by index, never by copying the rest (quadratic on a long text)
        while kind == "t" and n + len(s) - at > size:
            room = size - n
            cut = s.rfind("\n", at, at + room) + 1 - at  # after a line end within the room, else a hard cut
            if cut <= 0:
                cut = room if room > 0 else 0
            if cut:
                cur.append((kind, s[at:at + cut]))
            if cur:
                out.append(cur)
            cur, n, at = [], 0, at + cut
        if at:
            s = s[at:]
        if not s:
            continue
        cur.append((kind, s))
        n += len(s)
        if n >= size:
            out.append(cur)
            cur, n = [], 0
    if cur:
        out.append(cur)
    return out


VIEW_WINDOW_CHARS = 1_048_576
"""The record page shows at most this many characters of one field (#34; docs/limits.md): a 60 MB answer renders its
first window in well under a second; the rest is a "next" fragment away (the same size again) or downloaded whole."""


def window(value: str | None, at: int = 0, size: int = VIEW_WINDOW_CHARS) -> str:
    """The characters of ``value`` shown from ``at``: at most ``size`` of them."""
    return (value or "")[at: at + size]
