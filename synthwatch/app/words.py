"""Words a person reads, in one place: counts with the right grammar.

The dashboard's templates reach these through Jinja filters (synthwatch/app/filters.py)."""

from __future__ import annotations

from typing import Any


def plural(n: Any, word: str, many: str | None = None) -> str:
    """``plural(3, "error")`` -> "3 errors", ``plural(1, "error")`` -> "1 error", with thousands separators."""
    k = n or 0
    text = f"{k:,}" if isinstance(k, int) else f"{round(k):,}"
    return f"{text} {word if k == 1 else (many or word + 's')}"


def check_label(name: str) -> str:
    """The human label of a check, the same everywhere: the title of its alarm rule."""
    from ..check_catalog import DEFAULT_RULES  # noqa: PLC0415 - words is imported by low-level modules

    rule = DEFAULT_RULES.get(name)
    return rule.title if rule else name.replace("_", " ").capitalize()


def check_help(name: str) -> str:
    """One line on what fails the check (the tooltip; docs/checks.md says the same)."""
    from ..check_catalog import CHECK_INFO  # noqa: PLC0415

    return CHECK_INFO.get(name, "")
