"""Run every benchmark module (bench/bench_*.py): `python -m bench [--quick] [--strict] [NAME ...]`.

Each target a benchmark checks is printed with its measured value and "met" or "MISSED" (and the machine's load
average beside a figure that needs a core to itself), then all of them again at the end. `--strict` exits 1 when
any target was missed; without it a miss is reported and the exit status is 0 (a benchmark that crashed exits 1
either way)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

from bench import TARGETS, load_average, target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: seconds, for CI and smoke checks")
    p.add_argument("--strict", action="store_true", help="exit 1 when any target was missed")
    p.add_argument("names", nargs="*", help="run only these (e.g. dashboard for bench_dashboard.py)")
    a = p.parse_args(argv)
    here = Path(__file__).resolve().parent
    mods = sorted(f.stem for f in here.glob("bench_*.py"))
    if a.names:
        mods = [m for m in mods if m.removeprefix("bench_") in a.names or m in a.names]
        if not mods:
            print(f"no benchmark named {', '.join(a.names)}", file=sys.stderr)
            return 2
    for name in mods:
        print(f"== {name} ({'quick' if a.quick else 'full'})", flush=True)
        t = time.perf_counter()
        mod = importlib.import_module(f"bench.{name}")
        before = len(TARGETS)
        out = mod.main(quick=a.quick)
        if len(TARGETS) == before:  # a module that names no target of its own: its overall verdict is one
            implied_targets(name.removeprefix("bench_"), out)
        bad = not all(x.met for x in TARGETS[before:])
        print(f"== {name} done in {time.perf_counter() - t:.1f} s{' (target missed)' if bad else ''}", flush=True)
    print(f"== targets ({sum(x.met for x in TARGETS)} met, {sum(not x.met for x in TARGETS)} missed; "
          f"load average now {load_average()})", flush=True)
    for x in TARGETS:
        print("  " + x.line(), flush=True)
    missed = any(not x.met for x in TARGETS)
    return 1 if a.strict and missed else 0


def implied_targets(bench: str, out: Any) -> None:
    """The verdict of a module that returns an exit code (non-zero: a target was missed) or result tables
    (each with "passed"), as targets."""
    if isinstance(out, int) and not isinstance(out, bool):
        target(bench, "all its targets (see its section in docs/benchmarks.md)", f"exit status {out}", "0",
               out == 0)
    elif isinstance(out, list):
        for t in out:
            if isinstance(t, dict) and "passed" in t:
                target(bench, str(t.get("title", t.get("id", "table"))), "passed" if t["passed"] else "not passed",
                       "every row within its target", bool(t["passed"]))
    elif isinstance(out, dict) and "met" in out:
        target(bench, "all its targets", "met" if out["met"] else "not met", "met", bool(out["met"]))


if __name__ == "__main__":
    sys.exit(main())
