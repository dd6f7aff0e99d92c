"""Benchmarks: `python -m bench` runs every bench/bench_*.py module's main(quick)."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(name: str, markdown: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace this benchmark's section of docs/benchmarks.md (between its markers), or append it."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
