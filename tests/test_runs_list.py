"""The runs list's filter, sort and sparkline points (synthwatch/app/runs_list.py; the page: test_runs_list_browser)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from synthwatch.app.runs_list import SORTS, STATES, filter_runs, read_filter, spark_points


def _run(i: int, name: str, status: str, n_ok: int, alarms: int) -> dict[str, object]:
    return {"id": i, "name": name, "status": status, "n_ok": n_ok, "target": 100, "req_s": n_ok / 10,
            "alarms": alarms, "alarm_errors": 0, "open_items": 0, "n_error": 0, "n_timeout": 0}


RUNS = st.lists(st.builds(_run, st.integers(1, 10_000), st.text(min_size=1, max_size=8),
                          st.sampled_from(["running", "paused", "completed", "failed", "stopped"]),
                          st.integers(0, 100), st.integers(0, 3)), max_size=20, unique_by=lambda r: r["id"])


@given(RUNS, st.text(max_size=4), st.sampled_from(["", *STATES, "bogus"]), st.sampled_from([*SORTS, "bogus"]),
       st.sampled_from(["asc", "desc", "bogus"]))
def test_filter_keeps_exactly_the_matching_runs_in_order(runs, q, state, sort, order) -> None:  # type: ignore[no-untyped-def]
    f = read_filter({"q": q, "state": state, "sort": sort, "order": order})
    assert f["sort"] in SORTS and f["order"] in ("asc", "desc") and f["state"] in ("", *STATES)
    got = filter_runs(runs, f)
    assert all(f["q"].lower() in r["name"].lower() for r in got)
    if f["state"] == "alarm":
        assert all(r["alarms"] for r in got)
    elif f["state"] == "live":
        assert all(r["status"] in ("created", "running", "paused", "stopping") for r in got)
    elif f["state"]:
        assert all(r["status"] == f["state"] for r in got)
    assert len(got) == sum(1 for r in runs if r in got)  # nothing invented, nothing doubled
    keys = [SORTS[f["sort"]][1](r) for r in got]
    assert keys == sorted(keys, reverse=f["order"] == "desc")


def test_spark_points_fit_the_box() -> None:
    assert spark_points([]) == ""
    pts = [tuple(map(float, p.split(","))) for p in spark_points([0, 2, 4, 1], 90, 20).split()]
    assert [x for x, _ in pts] == [0, 30, 60, 90]
    assert all(0 <= y <= 20 for _, y in pts) and min(y for _, y in pts) == pts[2][1]  # the peak is highest
    assert {y for _, y in (tuple(map(float, p.split(","))) for p in spark_points([0, 0], 10, 10).split())} == {9.0}
