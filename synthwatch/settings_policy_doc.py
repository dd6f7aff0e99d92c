"""The settings policy (synthwatch.settings_policy) as the table of docs/security.md, generated from it (#34).

``python -m synthwatch.settings_policy_doc`` prints the table; ``--write`` rewrites it between the markers in
docs/security.md. tests/test_docs.py checks the document holds what this generates.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from .config import RunConfig
from .settings_policy import POLICY, join_key, shape

DOC_BEGIN = "<!-- settings-policy:begin (generated: python -m synthwatch.settings_policy_doc --write) -->"
DOC_END = "<!-- settings-policy:end -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"


def models_of(model: type[BaseModel] = RunConfig, path: str = "") -> Iterator[tuple[str, type[BaseModel], str]]:
    """(dotted key, model, field) of every field reachable from ``model``; list items are ``key[]``, table
    entries ``key.*``."""
    for name in model.model_fields:
        p = join_key(path, name)
        kind, sub, _ = shape(model, name)
        yield p, model, name
        if sub is not None:
            yield from models_of(sub, p + ("[]" if kind == "list" else ".*" if kind == "dict" else ""))


def table() -> str:
    """The policy as the Markdown table of docs/security.md."""
    lines = ["| Key | From the dashboard |", "|---|---|"]
    for key, model, name in models_of():
        _kind, sub, _ = shape(model, name)
        rule = POLICY.get(model, {}).get(name)
        if sub is not None:
            cell = "its fields below" if sub in POLICY else "**never** (not in the policy)"
        elif rule is None or model not in POLICY:
            cell = "**never** (not in the policy)"
        else:
            cell = rule.describe.replace("|", "\\|")
        lines.append(f"| `{key}` | {cell} |")
    return "\n".join(lines) + "\n"


def documented(text: str) -> str:
    """The table between the markers of a document's text ("" when it has none)."""
    _, found, rest = text.partition(DOC_BEGIN)
    return rest.partition(DOC_END)[0].strip("\n") + "\n" if found else ""


def main(argv: list[str]) -> int:
    if argv[1:] == ["--write"]:
        text = DOC.read_text(encoding="utf-8")
        head, _, rest = text.partition(DOC_BEGIN)
        _, _, tail = rest.partition(DOC_END)
        DOC.write_text(f"{head}{DOC_BEGIN}\n{table()}{DOC_END}{tail}", encoding="utf-8")
        sys.stdout.write(f"wrote the settings policy table to {DOC}\n")
        return 0
    sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
