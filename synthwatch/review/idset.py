"""A set of record ids as short text: the set a bulk preview pinned, carried to the request that applies it (#37).

"3-7,9,12-40": ascending ranges, so a filter's thousands of mostly-consecutive ids stay a few bytes in a form field
or a JSON body. A max id cannot pin a set: records still pending at the preview already have ids below it.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_IDS = 1_000_000
"""Ids one pinned set may hold (a bigger selection is refused, not cut)."""
MAX_TEXT = 4_000_000
"""Characters of the text form accepted back."""


class IdSetError(ValueError):
    """The text is not a set of ids this module wrote."""


def encode(ids: Iterable[int]) -> str:
    """The ids (any order, repeats ignored) as ascending ranges."""
    parts: list[str] = []
    run_start: int | None = None
    prev = 0
    for i in sorted(set(ids)):
        if run_start is None:
            run_start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
            run_start = prev = i
    if run_start is not None:
        parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
    return ",".join(parts)


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit() and len(s) <= 19


def decode(raw: str) -> list[int]:
    """The ascending ids of a text `encode` wrote; IdSetError (with what is wrong) for anything else."""
    if len(raw) > MAX_TEXT:
        raise IdSetError(f"ids: longer than {MAX_TEXT:,} characters")
    out: list[int] = []
    last = 0
    for part in filter(None, raw.strip().split(",")):
        lo_s, dash, hi_s = part.partition("-")
        if not _digits(lo_s) or (dash and not _digits(hi_s)):
            raise IdSetError(f"ids: {part[:40]!r} is not an id or a range of ids")
        lo, hi = int(lo_s), int(hi_s or lo_s)
        if lo < 1 or hi < lo or lo <= last:
            raise IdSetError(f"ids: {part[:40]!r} is not ascending after the ids before it")
        if len(out) + hi - lo + 1 > MAX_IDS:
            raise IdSetError(f"ids: more than {MAX_IDS:,} ids")
        out.extend(range(lo, hi + 1))
        last = hi
    return out
