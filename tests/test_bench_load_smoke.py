"""The load benchmark runs end to end in its quick mode, so that it never rots.

Quick mode polls for 3 s per phase on a machine shared with other work: it proves the whole setup (simulator,
worker, dashboard and 20 readers, each a real process or connection) holds together, that the worker really
writes during the loaded phase and not during the baseline, and that no reader ever gets a 5xx or a
"database is locked" (nor any status >= 400). The p95 target itself is judged by the full run (`python -m bench load`).
"""

from __future__ import annotations

import math

import pytest


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_load_benchmark_quick() -> None:
    from bench import bench_load

    results = bench_load.main(quick=True)
    # the writer wrote while the readers polled (a count, not a rate: timings are the full run's to judge)
    assert results["writes_per_s"] > 0, results["writes_per_s"]
    assert results["writes_during_baseline"] <= 64  # paused: at most the in-flight requests landed
    assert results["problems_load"] == [] and results["problems_idle"] == []
    names = [r["fragment"] for r in results["rows"]]
    assert "stats" in names and len(names) >= 3, names  # the run page's polled fragments, read from its HTML
    for r in results["rows"]:
        assert r["n"] >= bench_load.READERS, r  # every reader polled every fragment at least once
        assert all(math.isfinite(r[k]) for k in ("load_p50_ms", "load_p95_ms", "idle_p95_ms")), r
    assert "| stats |" in bench_load.markdown(results)
