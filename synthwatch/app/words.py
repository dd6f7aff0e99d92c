"""Words a person reads, in one place: counts with the right grammar.

The dashboard's templates reach these through Jinja filters (synthwatch/app/filters.py)."""

from __future__ import annotations

import re
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
    if rule:
        return rule.title
    # a configured name (user:Boxed, rule:x_y) is shown as written; a plain one (near_duplicate) as words
    return name if ":" in name else name.replace("_", " ").capitalize()


# Where a stored status message names a check by its id (store/queue.py pause_reason, quality/detection/open_items.py
# completion text): "alarm #3 field_mismatch: <title>", "failing empty_reasoning", "an open truncated problem",
# "queued for a re-run (empty_reasoning)". Only these places: a command in the message keeps its ids.
_STATUS_IDS = re.compile(r"(?P<alarm>alarm #\d+) (?P<aid>[a-z][a-z0-9_]*): (?P<title>[^.;(]*)"
                         r"|(?P<pre>failing |an open |queued for a re-run \()(?P<id>[a-z][a-z0-9_]*)(?=[ ,;.)]|$)")


def status_in_labels(message: str) -> str:
    """A stored status message as a page shows it (#37): each check id in words, its label. The stored text stays
    as written (the CLI, the API and the audit read it); an id that is no check is left as it is."""
    from ..check_catalog import DEFAULT_RULES  # noqa: PLC0415

    known = set(DEFAULT_RULES)

    def one(m: re.Match[str]) -> str:
        if m.group("alarm"):
            rid, title = m.group("aid"), m.group("title")
            if rid not in known:
                return m.group(0)
            return f"{m.group('alarm')}: {title}"  # the alarm's title says the check in words
        rid = m.group("id")
        return m.group("pre") + check_label(rid) if rid in known else m.group(0)

    return _STATUS_IDS.sub(one, message)


def check_help(name: str) -> str:
    """One line on what fails the check (the tooltip; docs/checks.md says the same)."""
    from ..check_catalog import CHECK_INFO  # noqa: PLC0415

    return CHECK_INFO.get(name, "")
