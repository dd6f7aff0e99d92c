"""The worker benchmarks run end to end in their quick mode, so that they never rot.

Quick mode is tiny (dozens of requests): it proves every client completes every request with
its reasoning captured, and that the tables are complete; the figures themselves are only
meaningful in the full run (`./dev bench`, docs/benchmarks.md).
"""

from __future__ import annotations

import pytest

from tests.conftest import require


def _cpu_ok() -> bool:
    import os

    return hasattr(os, "sched_setaffinity")


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_worker_benchmark_quick() -> None:
    require(_cpu_ok(), "os.sched_setaffinity (Linux) is needed to pin the simulator and the clients")
    from bench import bench_worker

    tables = bench_worker.main(quick=True)
    summary, detail = tables
    assert summary["id"] == "worker_vs_ceiling"
    assert len(summary["rows"]) == len(bench_worker.QUICK)
    assert len(detail["rows"]) == sum(len(c.kinds) for c in bench_worker.QUICK)
    assert any(row[1].startswith("`synthwatch run` process") for row in detail["rows"])  # the whole process, once
    for row in detail["rows"]:
        assert len(row) == len(detail["columns"])
        assert float(row[5].replace(",", "")) > 0, row  # requests per CPU-second
    for t in tables:
        assert t["markdown"].startswith("### ")
        assert t["markdown"].count("\n|") == len(t["rows"]) + 2
    assert "checks on" in detail["text"]  # the worker ran with the checks' writer hooks


@pytest.mark.timeout(240)
def test_scale_benchmark_quick() -> None:
    require(_cpu_ok(), "os.sched_setaffinity (Linux) is needed to pin the simulator and the clients")
    from bench import bench_scale

    [table] = bench_scale.main(quick=True)
    values = {row[0]: row[1] for row in table["rows"]}
    n = bench_scale.QUICK["streams"]
    assert values["records ok"] == str(n)
    assert values["records failed (spurious idle timeouts, errors)"] == "0"
    assert values["records unfinished when stopped (worker fell behind)"] == "0"
    assert values["streams the simulator had open at once (max)"] == str(n)
    assert table["passed"] is True


# Over 30 s (~100 s here): the benchmark itself, six real `synthwatch run` processes against paced simulators
# (two server shapes, fixed and auto), each given 20 s of traffic so that the tuner takes several steps; shorter
# runs would not show a tuning step at all. It is `slow`: the quick loop leaves it out.
@pytest.mark.timeout(240)
@pytest.mark.slow
def test_autotune_benchmark_quick() -> None:
    """The knee benchmark runs end to end (a fixed and an auto run against the capacity model); its numbers are
    the full run's to judge, so only what it measured is checked here."""
    from bench import bench_autotune

    r = bench_autotune.main(quick=True)
    for run in (r["fixed"], r["auto"], *r["flat_fixed"], r["flat_auto"]):
        assert run["finished"] > 0 and run["ok"] > 0, run
    assert r["auto"]["steps"] and r["auto"]["steps"][0][2].startswith("self-tuning concurrency starts at")
    assert "| auto |" in bench_autotune.markdown(r)
    assert "A server whose queue never grows" in bench_autotune.markdown(r)


@pytest.mark.timeout(240)
def test_process_benchmark_quick_reports_the_bound_beside_the_ratio() -> None:
    """The whole-process bench measures, in the same sitting, what no process on this design can go below (SQLite's
    own statements, a bare interpreter's imports) and reports the bound and the budget they leave beside the ratio."""
    require(_cpu_ok(), "os.sched_setaffinity (Linux) is needed to pin the simulator and the clients")
    from bench import bench_process

    [table] = bench_process.main(quick=True)
    cols = table["columns"]
    assert len(table["rows"]) == 2  # both modes
    for row in table["rows"]:
        assert len(row) == len(cols)
        cell = dict(zip(cols, row, strict=True))
        ratio = float(cell["median"].rstrip("×"))
        bound = float(cell["bound"].rstrip("×"))
        floor, claims = cell["SQLite floor µs/record (claims)"].rstrip(")").split(" (")
        assert 0 < float(claims) <= float(floor), cell
        assert float(cell["start-up floor CPU-s"]) > 0, cell
        assert 0 < ratio < bound <= 1, cell  # the process does all the floor's work and more
        spent = float(cell["spent µs/record"])
        assert spent > float(cell["of it, loading the dataset µs/record"]) > 0, cell
        assert (cell["target ≥ 0.6×"] == "met") == (ratio >= bench_process.TARGET), cell
    assert table["markdown"].count("\n|") == len(table["rows"]) + 2
