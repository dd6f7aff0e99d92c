"""The re-derive benchmark runs end to end in its quick mode, so that it never rots.

Quick mode (2,000 records, seconds) proves the whole setup holds together: the story's run is filled
(bench/fill.py fill_field_mismatch), a real `synthwatch serve` answers a polling reader the whole time, and the
re-derive leaves every record with exactly the reasoning the server sent, nothing failing field_mismatch or
empty_reasoning, in the database and on the dashboard. Timing targets are judged by the full run only
(`python -m bench repair`, docs/benchmarks.md).
"""

from __future__ import annotations

import pytest


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_repair_benchmark_quick() -> None:
    from bench import bench_repair

    r = bench_repair.main(quick=True)
    n = bench_repair.QUICK_RECORDS
    assert r["problems"] == [], r["problems"]  # verify(): every record re-derived, checks and dashboard at 0
    assert r["reader_problems"] == [] and r["dashboard_errors"] == [], (r["reader_problems"], r["dashboard_errors"])
    assert r["preview"] == {"selected": n, "changed": n, "unchanged": 0, "cannot": 0}
    assert r["rederive"] == {"selected": n, "changed": n, "unchanged": 0, "cannot": 0}
    f = r["facts"]
    assert f["matches_history"] == n and f["with_reasoning"] == n and f["failing_field_mismatch"] == 0
    assert f["dashboard_field_mismatch"] == 0 and f["dashboard_empty_reasoning"] == 0
    for page in r["pages"]:
        assert page["baseline"]["n"] >= 3, page  # the reader polled every page before the re-derive
    assert r["rederive_s"] > 0 and r["preview_s"] > 0
    text = bench_repair.markdown(r)
    assert "| `/api/runs/{id}/stats` |" in text and "| `/runs/{id}` |" in text
