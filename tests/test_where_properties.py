"""Property tests of the dashboard's `check` and `where` (#38): whatever text comes in, the records listing, its
count, the page and a bulk preview answer 200 or a 400 naming the parameter, never a 500; and for drawn expressions
the records the API lists (alone, with search, on the page's SQL with its aliases) are exactly those the expression
selects, evaluated in Python on the same verdicts. Real SQLite, a real dashboard over real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st
from test_where_dashboard import RECORDS, SAME, verdict_run

from synthwatch.quality import selection

NAMES = ["user:boxed", "language", "judge", "rule:has_boxed", "verify_math", "verify:math", "truncated",
         "empty_reasoning"]
OUTCOMES = ["pass", "fail", "error", "pending"]


@st.composite
def atom(draw: Any) -> str:
    name = draw(st.sampled_from(NAMES))
    form = draw(st.sampled_from(["eq", "ne", "bare"]))
    if form == "bare":
        return name
    builtin = name in ("truncated", "empty_reasoning")
    outcome = draw(st.sampled_from(OUTCOMES[:2] if builtin else OUTCOMES))
    return f"{name}{'=' if form == 'eq' else '!='}{outcome}"


EXPRS = st.recursive(
    atom(),
    lambda inner: st.one_of(
        inner.map(lambda e: f"not ({e})"),
        st.tuples(st.sampled_from([" and ", " or ", " AND ", " Or "]), st.lists(inner, min_size=2, max_size=3)).map(
            lambda t: "(" + t[0].join(t[1]) + ")")),
    max_leaves=6)


_SERVED: dict[int, tuple[int, list[int], Any]] = {}


def _served(engine: Any, live_app: Any) -> tuple[int, list[int], Any]:
    """One run and one dashboard per test function (Hypothesis runs every example with the same fixtures)."""
    if id(live_app) not in _SERVED:
        run_id, ids = verdict_run(engine)
        _SERVED[id(live_app)] = (run_id, ids, live_app())
    return _SERVED[id(live_app)]


def _states(i: int) -> dict[str, str]:
    return {name: seq[-1] for name, seq in RECORDS[i][2].items()}


@given(data=st.data())
def test_drawn_expressions_list_exactly_what_they_select(engine: Any, live_app: Any, data: Any) -> None:
    run_id, ids, srv = _served(engine, live_app)
    expr = data.draw(EXPRS)
    with engine.connect() as conn:
        where = selection.parse_where(expr, selection.catalogue(conn, run_id))
    want = sorted(rid for i, rid in enumerate(ids) if where.evaluate(RECORDS[i][1], _states(i)))
    needle = sorted(rid for i, rid in enumerate(ids) if rid in want and "needle" in RECORDS[i][0])
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        got = c.get(f"/api/runs/{run_id}/records", params={"where": expr, "limit": "100"})
        assert got.status_code == 200, (expr, got.text)
        assert sorted(r["id"] for r in got.json()["records"]) == want, expr
        found = c.get(f"/api/runs/{run_id}/records", params={"where": expr, "q": "needle", "limit": "100"}).json()
        assert sorted(r["id"] for r in found["records"]) == needle, expr
        assert c.get(f"/api/runs/{run_id}/records/count", params={"where": expr}).json()["count"] == len(want)


@given(where=st.text(max_size=60) | st.text(alphabet="()=! andortnuserboxedlaguj:_", max_size=40),
       check=st.none() | st.text(max_size=30))
def test_any_text_is_a_200_or_a_400_never_a_500(engine: Any, live_app: Any, where: str, check: str | None) -> None:
    run_id, _ids, srv = _served(engine, live_app)
    params = {"where": where, **({"check": check} if check is not None else {})}
    with httpx.Client(base_url=srv.url, timeout=30, headers={**SAME, "Origin": srv.url}) as c:
        for r in (c.get(f"/api/runs/{run_id}/records", params=params),
                  c.get(f"/api/runs/{run_id}/records/count", params=params),
                  c.get(f"/runs/{run_id}/records", params=params),
                  c.post(f"/api/runs/{run_id}/flags/bulk", json={"filters": params, "verdict": "bad"})):
            assert r.status_code in (200, 400), (params, r.status_code, r.text[:300])
            if r.status_code == 400 and r.request.url.path.startswith("/api/"):
                detail = r.json()["detail"]
                assert isinstance(detail, str) or r.json().get("problems"), r.text[:300]
