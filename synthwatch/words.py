"""Words a person reads, in one place: counts with the right grammar.

The dashboard's templates reach these through Jinja filters (synthwatch/app/filters.py)."""

from __future__ import annotations

from typing import Any


def plural(n: Any, word: str, many: str | None = None) -> str:
    """``plural(3, "error")`` -> "3 errors", ``plural(1, "error")`` -> "1 error", with thousands separators."""
    k = n or 0
    text = f"{k:,}" if isinstance(k, int) else f"{round(k):,}"
    return f"{text} {word if k == 1 else (many or word + 's')}"
