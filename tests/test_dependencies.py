"""Every runtime dependency pyproject.toml declares is imported by synthwatch itself (pip install synthwatch
pulls nothing it never uses); test- and benchmark-only packages live in the dev extra."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions

from conftest import ROOT


def _runtime_dists() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0] for d in data["project"]["dependencies"]]


# used at run time through another package, not imported by name
INDIRECT = {"python-multipart": "Starlette parses the dashboard's forms with it (request.form())",
            "latex2sympy2-extended": "math-verify parses LaTeX answers with it (pinned with math-verify, #30)"}


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "synthwatch").rglob("*.py"))
    by_dist: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for d in dists:
            by_dist.setdefault(d.lower().replace("_", "-"), set()).add(module)
    unused = []
    for dist in _runtime_dists():
        modules = by_dist.get(dist.lower().replace("_", "-"), set())
        assert modules, f"{dist} is declared but not installed"
        used = any(re.search(rf"^\s*(import|from)\s+{re.escape(m)}\b|find_spec\(\"{re.escape(m)}\"\)", source, re.M)
                   for m in modules)
        if not used and dist not in INDIRECT:
            unused.append(dist)
    assert not unused, f"declared runtime dependencies synthwatch never imports: {unused}"


def test_the_benchmark_and_test_only_packages_are_not_runtime_dependencies() -> None:
    runtime = {d.lower() for d in _runtime_dists()}
    assert not runtime & {"openai", "tokenizers", "datasets", "httpx", "pytest"}
    assert "aiohttp" in runtime  # the worker's HTTP client
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(data["project"]["optional-dependencies"]) == {"postgres", "dev"}
