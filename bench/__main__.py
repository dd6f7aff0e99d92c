"""Run every benchmark module (bench/bench_*.py): `python -m bench [--quick] [NAME ...]`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: seconds, for CI and smoke checks")
    p.add_argument("names", nargs="*", help="run only these (e.g. dashboard for bench_dashboard.py)")
    a = p.parse_args(argv)
    here = Path(__file__).resolve().parent
    mods = sorted(f.stem for f in here.glob("bench_*.py"))
    if a.names:
        mods = [m for m in mods if m.removeprefix("bench_") in a.names or m in a.names]
        if not mods:
            print(f"no benchmark named {', '.join(a.names)}", file=sys.stderr)
            return 2
    failed = 0
    for name in mods:
        print(f"== {name} ({'quick' if a.quick else 'full'})", flush=True)
        t = time.perf_counter()
        mod = importlib.import_module(f"bench.{name}")
        out = mod.main(quick=a.quick)
        # a module returns an exit code (non-zero: a target was missed) or its result tables
        bad = isinstance(out, int) and not isinstance(out, bool) and out != 0
        failed += bad
        print(f"== {name} done in {time.perf_counter() - t:.1f} s{' (target missed)' if bad else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
