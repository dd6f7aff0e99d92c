"""`./dev bench` says when a benchmark misses (#39 item 4): every target is printed with its measured value and
met or MISSED, a figure that needs a core to itself with the machine's load beside it, and `--strict` exits
non-zero on a miss."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import TARGETS, target
from bench.__main__ import implied_targets

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\s+(met   |MISSED)  (\w+): (.+): (.+) \(target (.+)\)(  \[needs a core to itself; load average "
                  r"([\d.]+ [\d.]+ [\d.]+)\])?$")


def test_target_lines_say_met_or_missed_and_the_load_beside_a_core_bound_figure(capsys: pytest.CaptureFixture[str]) -> None:
    before = len(TARGETS)
    target("scale", "worker CPU per streamed token", "9.4 µs", "≤ 8 µs", False, needs_core=True)
    target("scale", "worker peak RSS", "300 MB", "< 500 MB", True)
    out = capsys.readouterr().out.splitlines()
    first, second = (LINE.match(x) for x in out)
    assert first and first[1] == "MISSED" and first[4] == "9.4 µs" and first[5] == "≤ 8 µs" and first[7]
    assert second and second[1] == "met   " and second[6] is None  # no load beside a figure that is not CPU-bound
    del TARGETS[before:]


def test_a_module_without_targets_of_its_own_gives_its_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    before = len(TARGETS)
    implied_targets("dashboard", 1)
    implied_targets("export", [{"title": "Export at scale", "passed": True}, {"title": "detail"}])
    got = TARGETS[before:]
    assert [(t.bench, t.met) for t in got] == [("dashboard", False), ("export", True)]
    del TARGETS[before:]


@pytest.mark.timeout(300)
def test_strict_exits_non_zero_exactly_when_a_target_is_missed() -> None:
    """The real quick scale benchmark (64 short streams): its targets are listed at the end, each met or MISSED,
    and the exit status under --strict is 1 exactly when one of them was missed (without --strict: 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHWATCH_")}
    p = subprocess.run([sys.executable, "-m", "bench", "--quick", "--strict", "scale"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=280)
    tail = p.stdout.split("== targets", 1)
    assert len(tail) == 2, p.stdout + p.stderr
    lines = [m for m in (LINE.match(x) for x in tail[1].splitlines()) if m]
    assert {m[3] for m in lines} >= {"worker CPU per streamed token", "worker peak RSS"}, tail[1]
    per_token = next(m for m in lines if m[3] == "worker CPU per streamed token")
    assert per_token[7], "the per-token figure needs a core to itself: the load average is printed beside it"
    missed = any(m[1] == "MISSED" for m in lines)
    assert p.returncode == (1 if missed else 0), p.stdout + p.stderr
