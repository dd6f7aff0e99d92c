"""Every link of the README and docs/ resolves (#37): the file it names exists and so does the heading its anchor
names (GitHub's anchors: the heading in lower case, punctuation dropped, spaces as hyphens, -1, -2 for repeats);
every source path the docs name (`synthwatch/...py`, `tests/...py`) exists."""

from __future__ import annotations

import re

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(markdown: str) -> str:
    """The markdown without its fenced code blocks (a `# comment` in one is not a heading, a `](x)` not a link)."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def github_anchors(markdown: str) -> set[str]:
    text = prose(markdown)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_github_anchors_follow_githubs_rule() -> None:
    assert github_anchors("## Selection per prompt (`--select`)\n## A\n## A\n") == {
        "selection-per-prompt---select", "a", "a-1"}


def test_every_link_and_anchor_in_the_docs_resolves() -> None:
    broken = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
                continue
            if anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{doc.name}: {target} (no such heading in {file.name})")
    assert not broken, "\n".join(broken)


def test_every_source_path_the_docs_name_exists() -> None:
    missing = []
    for doc in DOCS:
        for path in set(re.findall(r"`((?:synthwatch|tests|bench)/[\w/.-]+\.(?:py|html|css|js|json|toml))`",
                                   doc.read_text(encoding="utf-8"))):
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, "\n".join(sorted(missing))


def test_no_command_the_docs_name_is_missing_from_the_cli() -> None:
    from synthwatch.cli import build_parser

    names = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    named = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        named |= set(re.findall(r"`synthwatch ([a-z]+)\b", text))
        # "shared with `export` and `probe`": flags shared with other commands are named by the command alone
        named |= set(re.findall(r"shared with `([a-z]+)` and `([a-z]+)`", text)[0]
                     if re.search(r"shared with `([a-z]+)` and `([a-z]+)`", text) else ())
    assert named - names == set(), f"commands the docs name that do not exist: {sorted(named - names)}"
