"""Length histograms binned in SQL (SQLite and PostgreSQL): zero and max_tokens bars, filters, the split."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_review import add_run

from synthwatch.review import lengths
from synthwatch.review import queries as review
from synthwatch.review.filters import Filters
from synthwatch.store import search_index


def _add(engine: Any, run_id: int, idx: int, reasoning: str, content: str, tokens: int | None,
         finish: str = "stop", status: str = "ok") -> None:
    from test_review import add_record

    add_record(engine, run_id, idx, reasoning=reasoning, content=content, completion_tokens=tokens,
               finish_reason=finish, status=status)


def test_bins_zero_limit_and_split(any_engine: Any) -> None:
    engine = any_engine
    rid = add_run(engine, config={"sampling": {"max_tokens": 400}})
    # 3 healthy: reasoning 3/4 of the text -> 75 of 100 tokens reasoning, 25 content
    for i in range(3):
        _add(engine, rid, i, "r" * 300, "c" * 100, 100)
    # 2 empty reasoning: all 80 tokens are content, 0 reasoning
    for i in range(3, 5):
        _add(engine, rid, i, "", "c" * 50, 80)
    # 4 truncated inside the reasoning: 400 tokens of reasoning, no content
    for i in range(5, 9):
        _add(engine, rid, i, "r" * 999, "", 400, finish="length")
    _add(engine, rid, 9, "r", "c", None)  # no token counts: left out
    _add(engine, rid, 10, "", "", None, status="error")

    with engine.connect() as conn:
        h = lengths.histogram(conn, rid, max_tokens=400)
    assert h["records"] == 9 and not h["capped"]
    assert h["bin_width"] == 10 and len(h["bins"]) == 42  # 0 | 40 bins over 1..399 | 400 and up
    assert h["bins"][0] == {"lo": 0, "hi": 0} and h["bins"][-1] == {"lo": 400, "hi": None}
    assert h["bins"][1] == {"lo": 1, "hi": 10} and h["bins"][40] == {"lo": 391, "hi": 399}
    r, c, o = h["counts"]["reasoning"], h["counts"]["content"], h["counts"]["output"]
    assert r[0] == 2 and r[-1] == 4 and r[8] == 3  # 75 tokens: bin 8 (71..80)
    assert c[0] == 4 and c[3] == 3 and c[8] == 2  # 25 -> bin 3 (21..30); 80 -> bin 8
    assert o[-1] == 4 and o[10] == 3 and o[8] == 2
    assert sum(r) == sum(c) == sum(o) == 9
    assert lengths.at_limit(h) == 4

    with engine.connect() as conn:  # the histogram follows a records-table filter
        h = lengths.histogram(conn, rid, Filters(finish_reason="length"), max_tokens=400)
        assert h["records"] == 4 and h["counts"]["output"][-1] == 4 and sum(h["counts"]["output"][:-1]) == 0
        h = lengths.histogram(conn, rid, Filters.from_params({"reasoning_len_max": "0"}), max_tokens=400)
        assert h["records"] == 2 and h["counts"]["reasoning"][0] == 2
        # without max_tokens: the range is the selection's largest output, no limit bar
        h = lengths.histogram(conn, rid)
        assert h["max_tokens"] is None and h["bins"][-1]["hi"] == 400 and len(h["counts"]["output"]) == len(h["bins"])
        assert h["counts"]["output"][-1] == 4  # 400 falls in the last bin, not a limit bar
        # a cap keeps the newest records by id
        h = lengths.histogram(conn, rid, max_tokens=400, cap=4)
        assert h["records"] == 4 and h["capped"] and h["counts"]["output"][-1] == 4  # the 4 truncated are newest


def test_histogram_follows_a_search(engine: Any) -> None:
    rid = add_run(engine, config={"sampling": {"max_tokens": 100}})
    _add(engine, rid, 0, "wombat thoughts", "answer", 100, finish="length")
    _add(engine, rid, 1, "other thoughts", "answer", 30)
    search_index.catch_up(engine, 1000, 100)
    with engine.connect() as conn:
        h = lengths.histogram(conn, rid, Filters(q="wombat"), max_tokens=100)
        assert h["records"] == 1 and lengths.at_limit(h) == 1
        assert review.count(conn, rid, Filters(q="wombat")) == (1, False)  # count reads the same selection


@given(st.integers(0, 10**9), st.one_of(st.none(), st.integers(1, 10**9)))
def test_bin_widths_are_round_and_the_bins_cover_the_range(top: int, max_tokens: int | None) -> None:
    width, n, hi, limit = lengths.layout(top, max_tokens)
    mantissa = width // 10 ** (len(str(width)) - 1)
    assert mantissa in (1, 2, 5) and width == mantissa * 10 ** (len(str(width)) - 1)  # 1/2/5 x 10^k
    assert (n - 1) * width < hi <= n * width and n <= lengths.BINS  # every length up to hi has a bin, no empty tail
    assert lengths.round_step(-(-hi // lengths.BINS)) == width  # the smallest round step that fits


def test_layout() -> None:
    assert lengths.layout(0, None) == (1, 1, 1, 2)
    assert lengths.layout(1000, None) == (50, 20, 1000, 1001)
    assert lengths.layout(9000, 8192) == (500, 17, 8191, 8192)  # cut records: the bins reach the limit
    assert lengths.layout(300, 8192) == (10, 30, 300, 8192)  # short outputs keep their detail, the limit bar stays
    assert lengths.layout(0, 5) == (1, 1, 1, 5)


def test_short_outputs_keep_detail_below_a_far_limit(engine: Any) -> None:
    rid = add_run(engine)
    for i, n in enumerate((40, 80, 120)):
        _add(engine, rid, i, "r" * n, "c" * n, n)
    with engine.connect() as conn:
        h = lengths.histogram(conn, rid, max_tokens=8192)
    assert h["bin_width"] == 5 and h["bins"][-2]["hi"] == 120 and h["bins"][-1] == {"lo": 8192, "hi": None}
    assert h["counts"]["output"][-1] == 0 and h["counts"]["output"][-2] == 1  # 120 in the last regular bin
    assert h["counts"]["reasoning"][-1] == 0 and sum(h["counts"]["reasoning"]) == 3


def test_compare_data_puts_two_runs_side_by_side(any_engine: Any) -> None:
    from sqlalchemy import text

    from synthwatch.app import run_stats as stats
    from synthwatch.app.routes_lengths import compare_data

    engine = any_engine
    a = add_run(engine, "run-a", config={"sampling": {"max_tokens": 100}, "model": "m"})
    b = add_run(engine, "run-b", config={"sampling": {"max_tokens": 200}, "model": "m"})
    for i in range(4):
        _add(engine, a, i, "r" * 30, "c" * 10, 40)
    for i in range(3):
        _add(engine, b, i, "", "c" * 10, 200, finish="length")  # cut at its limit, no reasoning
    with engine.connect() as conn, conn.begin():  # the counters the writer keeps, and a check's totals
        conn.execute(text("UPDATE run SET n_ok = 4 WHERE id = :a"), {"a": a})
        conn.execute(text("UPDATE run SET n_ok = 3 WHERE id = :b"), {"b": b})
        conn.execute(text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, updated_at)"
                          " VALUES (:b, 'empty_reasoning', 3, 3, 3, 3, 0)"), {"b": b})
    with engine.connect() as conn:
        d = compare_data(conn, stats.get_run(conn, a), stats.get_run(conn, b), 2000)  # type: ignore[arg-type]
    assert [r["name"] for r in d["runs"]] == ["run-a", "run-b"]
    assert [r["max_tokens"] for r in d["runs"]] == [100, 200]
    rows = {r["key"]: r for r in d["rows"]}
    assert (rows["ok"]["a"], rows["ok"]["b"], rows["ok"]["worse"]) == (4, 3, None)  # a count is not better or worse
    [check] = d["checks"]
    assert check["name"] == "empty_reasoning" and check["a"] is None and check["b"]["rate"] == 1.0
    h = d["histograms"]
    # different max_tokens: one range over both (up to the larger limit), each run's own limit marked
    assert h["max_tokens"] is None and h["bins"][-1]["hi"] == 200
    assert [m[0] for m in h["limits"]] == [100, 200] and [m[2] for m in h["limits"]] == ["A", "B"]
    ra, rb = h["runs"]
    assert (ra["records"], rb["records"]) == (4, 3)
    assert sum(ra["counts"]["output"]) == 4 and rb["counts"]["output"][-1] == 3 and rb["counts"]["reasoning"][0] == 3
    assert ra["label"] == "A run-a" and rb["label"] == "B run-b"
