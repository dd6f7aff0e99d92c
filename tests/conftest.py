"""Shared fixtures: a real SQLite file per test, the simulator on a real port, CLI subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, why: str) -> None:
    """Skip locally when a requirement is missing; under CI fail instead (never a quiet skip)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"requirement missing under CI: {why}")
    pytest.skip(why)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "synthwatch.db"


@pytest.fixture
def engine(db_path: Path) -> Any:
    from synthwatch.db import open_engine

    eng = open_engine(str(db_path))
    yield eng
    eng.dispose()


@pytest.fixture
def sim() -> Iterator[Callable[..., str]]:
    """Start simulators: sim(reasoning_field="reasoning", ...) -> base_url. All stop at teardown."""
    from contextlib import ExitStack

    from synthwatch.workers.simulator import SimConfig, running_in_thread

    with ExitStack() as stack:

        def start(**kw: Any) -> str:
            return stack.enter_context(running_in_thread(SimConfig(**kw)))

        yield start


def write_prompts(path: Path, n: int, *, start: int = 0) -> Path:
    with path.open("w") as fh:
        for i in range(start, start + n):
            a, b = 3 + i % 97, 5 + (i * 7) % 89
            fh.write(json.dumps({"id": f"p{i}", "messages": [
                {"role": "user", "content": f"What is {a} + {b}?"}]}) + "\n")
    return path


@pytest.fixture
def prompts(tmp_path: Path) -> Callable[[int], Path]:
    def make(n: int, name: str = "prompts.jsonl") -> Path:
        return write_prompts(tmp_path / name, n)

    return make


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHWATCH_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 120, check: bool = False, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "synthwatch", *args], capture_output=True, text=True, timeout=timeout,
        env=env or cli_env(), cwd=cwd or ROOT,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"synthwatch {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def popen_cli(*args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "synthwatch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env or cli_env(), cwd=ROOT, **kw,
    )
