"""The import graph keeps the shape docs/architecture.md draws: no cycles, stages import only downwards, the web
app never imports the CLI, the product never imports the simulator. The contracts are [tool.importlinter] in
pyproject.toml; import-linter checks them against the real imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the `synthwatch` package found in `tree`, with the project's contracts."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", "--config", str(ROOT / "pyproject.toml")],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_import_contracts() -> None:
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 kept, 0 broken" in r.stdout, r.stdout


def _copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "synthwatch", tmp_path / "synthwatch", ignore=shutil.ignore_patterns(
        "static", "templates", "data", "__pycache__"))
    return tmp_path


def _add_import(tree: Path, module: str, line: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}\n")


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    tree = _copy_of_the_package(tmp_path)
    _add_import(tree, "synthwatch/store/queue.py", "from ..review import queries as _upward  # noqa")
    r = lint_imports(tree)
    assert r.returncode == 1, r.stdout
    assert "Stages import only downwards BROKEN" in r.stdout
    assert "synthwatch.store.queue -> synthwatch.review.queries" in r.stdout, r.stdout


def test_a_cycle_inside_a_stage_is_found(tmp_path: Path) -> None:
    tree = _copy_of_the_package(tmp_path)
    _add_import(tree, "synthwatch/export/plan.py", "from . import stream as _cycle  # noqa")
    r = lint_imports(tree)
    assert r.returncode == 1, r.stdout
    assert "No import cycles between sibling packages or modules, at any depth BROKEN" in r.stdout, r.stdout


def test_the_app_importing_the_cli_or_the_product_importing_the_simulator_is_refused(tmp_path: Path) -> None:
    tree = _copy_of_the_package(tmp_path)
    _add_import(tree, "synthwatch/app/stats.py", "from ..commands import run as _cli  # noqa")
    _add_import(tree, "synthwatch/workers/engine.py", "from ..simulator import server as _sim  # noqa")
    r = lint_imports(tree)
    assert r.returncode == 1
    assert "The web app does not import the CLI BROKEN" in r.stdout, r.stdout
    assert "The product's stages do not import the simulator BROKEN" in r.stdout, r.stdout
