"""No private name crosses a module boundary (the project's rule): a ``_name`` that another synthwatch module needs
is public in its own module. An AST walk over every module finds ``from x import _name`` and ``module._name`` on a
module imported from synthwatch; dunder names are not private."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "synthwatch"


def _module(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _target(path: Path, root: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom reads from."""
    if not node.level:
        return node.module or ""
    pkg = _module(path, root) if path.name == "__init__.py" else _module(path, root)[:-1]
    base = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path = PKG) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        here = ".".join(_module(path, root))
        modules: set[str] = set()  # local names bound to synthwatch modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _target(path, root, node)
                if not target.startswith("synthwatch") or target == here:
                    continue
                for alias in node.names:
                    if _private(alias.name):
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno}: from {target} import {alias.name}")
                    elif (root.parent / target.replace(".", "/") / f"{alias.name}.py").exists():
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("synthwatch") and alias.asname:
                        modules.add(alias.asname)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in modules):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    found = private_imports()
    assert not found, "make these public (or move them) instead:\n" + "\n".join(found)


def test_the_walk_finds_each_kind(tmp_path: Path) -> None:
    """The walk is not blind: a package with each kind of crossing is caught, a module's own names are not."""
    pkg = tmp_path / "synthwatch"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("_x = 1\ndef _f(): return _x\n__all__ = ['_f']\n")
    (pkg / "sub" / "b.py").write_text("from .a import _f\nfrom . import a\nfrom .a import __all__\nprint(a._x)\n")
    (pkg / "c.py").write_text("from synthwatch.sub.a import _x\nimport synthwatch.sub.a as aa\naa._f()\n")
    got = private_imports(pkg)
    assert got == ["synthwatch/c.py:1: from synthwatch.sub.a import _x", "synthwatch/c.py:3: aa._f",
                   "synthwatch/sub/b.py:1: from synthwatch.sub.a import _f", "synthwatch/sub/b.py:4: a._x"], got
