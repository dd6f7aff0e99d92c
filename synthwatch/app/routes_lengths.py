"""Routes: length histograms (a run, or a records-table filter) and the page that compares two runs.

The compare page and its JSON share one data function (``compare_data``); charts.js draws the histograms
from the same JSON, so the page itself carries numbers only.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response

from ..repair.settings_diff import lines
from ..review import length_fold, lengths
from ..review.filters import Filters, ReviewError
from ..store.versions import diff
from . import run_stats, stats
from .deps import ReadConn, lean, render
from .launch import shown_url
from .routes_runs import request_limit_ms, run_or_404
from .words import check_label

router = APIRouter()


def _note(h: dict[str, Any]) -> str:
    n = h["records"]
    text = f"{n:,} record{'' if n == 1 else 's'} with token counts"
    if h["capped"]:
        text = f"the newest {h['cap']:,} records (by id) with token counts"
    if h["max_tokens"]:
        cut = lengths.at_limit(h)
        text += f"; {cut:,} at max_tokens = {h['max_tokens']:,}"
        if n:
            text += f" ({cut * 100 / n:.1f}%)"
    return text


def lengths_data(conn: Any, run: dict[str, Any], f: Filters) -> dict[str, Any]:
    """The histogram of a filter's records; the whole run's (no filter, a generate run) comes from the fold, so a
    live poll reads only the records finished since its last folded bucket (``rows_read`` says how many)."""
    mt = lengths.max_tokens_of(run)
    folded = length_fold.whole_run(conn, run["id"]) if not f.params() and run.get("kind") == "generate" else None
    if folded is not None:
        h = {**length_fold.histogram(folded[0], mt), "rows_read": folded[1].rows, "folded": True}
    else:
        h = {**lengths.histogram(conn, run["id"], f, max_tokens=mt), "rows_read": None, "folded": False}
    return {**h, "run_id": run["id"], "live": run["live"], "kinds": list(lengths.KINDS),
            "kind_labels": lengths.KIND_LABELS, "note": _note(h), "filters": f.params()}


@router.get("/api/runs/{run_id}/lengths", tags=["review"],
            summary="Histograms of reasoning, content and all output tokens (any records-table filter)")
def api_lengths(request: Request, conn: ReadConn, run_id: int) -> Any:
    """Counts per token-length bin. Bin 0 is exactly 0 tokens; with a max_tokens, the last bin is the
    records at the limit. Takes the records table's filter parameters (status, check, flag, q, ...)."""
    run = run_or_404(conn, run_id)
    try:
        f = Filters.from_params(request.query_params)
        with stats.time_limit(conn, request_limit_ms(request)):
            data = lengths_data(conn, run, f)
    except ReviewError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    except stats.StatsTimeout as exc:
        return JSONResponse({"detail": str(exc), "stale": True}, status_code=503)
    return lean(request, JSONResponse(data))


# ------------------------------------------------------------------ compare two runs

def _pct(n: float | None, d: float | None) -> float | None:
    return n * 100 / d if n is not None and d else None


def _summary(st: run_stats.RunStats) -> dict[str, Any]:
    run, lat, q = st.run, st.latency, st.quality
    totals = {r["kind"]: r["total"] for r in st.failures}
    finished = st.whole["finished"]
    dur = run.get("duration_s") or 0
    return {
        "ok": run["n_ok"], "finished": finished, "duration_s": dur,
        "ok_per_s_run": run["n_ok"] / dur if dur else None,
        "ok_per_s_now": st.recent.get("req_s") if st.recent.get("working") else None,  # req_s: ok records/s
        "tok_per_s_now": st.recent.get("tok_s") if st.recent.get("working") else None,
        "timeouts_pct": _pct(st.whole["timeouts"], finished), "errors_pct": _pct(st.whole["errors"], finished),
        # rates, not counts: a 300-record run and a 10k-record run compare per 100 finished records (#28 item 6)
        "retries_per_100": _pct(totals.get("retries", 0), finished),
        "http_429_per_100": _pct(totals.get("http_429", 0), finished),
        "empty_reasoning_pct": _pct(q.get("n_empty_all"), q.get("ok_all")),
        "cut_at_max_tokens_pct": _pct(q.get("n_length_all"), q.get("ok_all")),
        "latency_p50_s": lat.get("latency_s", {}).get("run_p50"), "latency_p95_s": lat.get("latency_s", {}).get("run_p95"),
        "ttft_p50_s": lat.get("ttft_s", {}).get("run_p50"), "ttft_p95_s": lat.get("ttft_s", {}).get("run_p95"),
        "stream_tok_s_p50": lat.get("tokens_per_s", {}).get("run_p50"),
        "checks": {c["check_name"]: {"rate": c["rate"], "n_fail": c["n_fail"], "n_total": c["n_total"]}
                   for c in st.checks},
    }


# (key, label, unit, lower is better)
ROWS = (
    ("ok", "ok records", "", None), ("finished", "finished records", "", None),
    ("duration_s", "duration", "s", None), ("ok_per_s_run", "ok records/s over the run", "/s", False),
    ("ok_per_s_now", "ok records/s now", "/s", False), ("tok_per_s_now", "output tokens/s now", "/s", False),
    ("timeouts_pct", "timeouts (% of finished)", "%", True), ("errors_pct", "errors (% of finished)", "%", True),
    ("retries_per_100", "retries per 100 finished records", "/100", True),
    ("http_429_per_100", "HTTP 429 answers per 100 finished records", "/100", True),
    ("empty_reasoning_pct", "empty reasoning (% of ok)", "%", True),
    ("cut_at_max_tokens_pct", "cut at max_tokens (% of ok)", "%", True),
    ("latency_p50_s", "latency p50", "s", True), ("latency_p95_s", "latency p95", "s", True),
    ("ttft_p50_s", "time to first token p50", "s", True), ("ttft_p95_s", "time to first token p95", "s", True),
    ("stream_tok_s_p50", "tokens/s per stream p50", "/s", False),
)


def _shared_histograms(conn: Any, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Both runs' histograms over the same bins: one max_tokens when they share it, else one range."""
    limits = [lengths.max_tokens_of(r) for r in runs]
    shared = limits[0] if limits[0] and limits[0] == limits[1] else None
    top = max(lengths.largest(conn, r["id"]) for r in runs)
    if shared is None:
        top = max([top] + [m for m in limits if m])
    hs = [lengths.histogram(conn, r["id"], max_tokens=shared, top=top) for r in runs]
    width, bins = hs[0]["bin_width"], hs[0]["bins"]
    marks = []  # each run's own max_tokens, where no shared limit bar shows it
    for label, m in zip(("A", "B"), limits, strict=True):
        if m and shared is None:
            marks.append([m, min((m - 1) // width + 1, len(bins) - 1) + 1, label])
    return {"max_tokens": shared, "bins": bins, "bin_width": width, "kinds": list(lengths.KINDS),
            "kind_labels": lengths.KIND_LABELS, "limits": marks if shared is None else None,
            "runs": [{"run_id": r["id"], "label": lab + " " + r["name"], "records": h["records"], "counts": h["counts"],
                      "capped": h["capped"], "max_tokens": m}
                     for lab, r, h, m in zip(("A", "B"), runs, hs, limits, strict=True)]}


def compare_data(conn: Any, a: dict[str, Any], b: dict[str, Any], limit_ms: int) -> dict[str, Any]:
    """Two runs side by side: whole-run rates, failures, latency, check rates and length histograms."""
    runs = [a, b]
    with stats.time_limit(conn, limit_ms):
        sums = [_summary(run_stats.run_stats(conn, r)) for r in runs]
        hist = _shared_histograms(conn, runs)
    rows = []
    for key, label, unit, lower in ROWS:
        va, vb = sums[0][key], sums[1][key]
        worse = None
        if lower is not None and va is not None and vb is not None and va != vb:
            worse = ("a" if va > vb else "b") if lower else ("a" if va < vb else "b")
        rows.append({"key": key, "label": label, "unit": unit, "a": va, "b": vb, "worse": worse})
    names = sorted(set(sums[0]["checks"]) | set(sums[1]["checks"]))
    checks = [{"name": n, "label": check_label(n), "a": sums[0]["checks"].get(n), "b": sums[1]["checks"].get(n)}
              for n in names]
    return {"runs": [{"id": r["id"], "name": r["name"], "status": r["status"], "live": r["live"], "side": side,
                      "max_tokens": lengths.max_tokens_of(r), "model": r["config"].get("model")}
                     for side, r in zip(("a", "b"), runs, strict=True)],
            "rows": rows, "checks": checks, "histograms": hist, "live": any(r["live"] for r in runs),
            "settings": settings_diff_of(a, b)}


def settings_diff_of(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where the two runs' current settings differ, "path: A -> B" (secret values never shown), names aside."""
    def shown(cfg: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in cfg.items() if k != "name"}
        if isinstance(out.get("endpoints"), list):  # a base URL's user:password@ is never shown (launch.shown_url)
            out["endpoints"] = [{**e, "base_url": shown_url(str(e.get("base_url") or ""))} if isinstance(e, dict) else e
                                for e in out["endpoints"]]
        return out

    def now(run: dict[str, Any]) -> dict[str, Any]:
        """The current config version with the controls as they are now: cap and concurrency set from the
        dashboard live in the run's columns, not in its config (#37: compare showed 5000/16 for 3000/8)."""
        cfg = dict(run.get("config") or {})
        for key in ("cap", "concurrency"):
            if key in run:
                cfg[key] = run[key]
        return cfg

    cfg_a, cfg_b = shown(now(a)), shown(now(b))
    return [line.replace(" -> ", " → ") for line in lines([c.as_dict() for c in diff(cfg_a, cfg_b)])]


def _pick(conn: Any, run: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The runs picked (?run=A&run=B); a blank choice is no choice."""
    picked = [v.strip() for v in run if v.strip()]
    if len(picked) > 2 or not all(v.isdigit() for v in picked):
        raise HTTPException(400, "pick two runs to compare, by id: ?run=A&run=B")
    ids = list(dict.fromkeys(int(v) for v in picked))
    found = [run_or_404(conn, i) for i in ids]
    return (found[0] if found else None), (found[1] if len(found) > 1 else None)


@router.get("/compare", include_in_schema=False)
def compare_page(request: Request, conn: ReadConn, run: Annotated[list[str], Query()] = []) -> Response:  # noqa: B006
    a, b = _pick(conn, run)
    ctx: dict[str, Any] = {"a": a, "b": b, "data": None, "stale": None, "choices": stats.list_runs(conn)}
    if a and b:
        try:
            ctx["data"] = compare_data(conn, a, b, request_limit_ms(request))
        except stats.StatsTimeout as exc:
            ctx["stale"] = str(exc)
    return render(request, "compare.html", ctx)


@router.get("/compare/numbers", include_in_schema=False)
def compare_numbers(request: Request, conn: ReadConn, run: Annotated[list[str], Query()] = []) -> Response:  # noqa: B006
    """The compare page's numbers, checks and settings: what it polls while either run is live."""
    a, b = _pick(conn, run)
    if a is None or b is None:
        raise HTTPException(400, "pick two runs to compare, by id: ?run=A&run=B")
    ctx: dict[str, Any] = {"a": a, "b": b, "data": None, "stale": None}
    try:
        ctx["data"] = compare_data(conn, a, b, request_limit_ms(request))
    except stats.StatsTimeout as exc:
        ctx["stale"] = str(exc)
    return render(request, "_compare_numbers.html", ctx)


@router.get("/api/compare", tags=["runs"], summary="Two runs side by side: rates, latency, checks, lengths")
def api_compare(request: Request, conn: ReadConn,
                run: Annotated[list[str], Query(description="two run ids: ?run=1&run=2")]) -> Any:
    a, b = _pick(conn, run)
    if a is None or b is None:
        return JSONResponse({"detail": "pick two runs to compare: ?run=A&run=B"}, status_code=400)
    try:
        return lean(request, JSONResponse(compare_data(conn, a, b, request_limit_ms(request))))
    except stats.StatsTimeout as exc:
        return JSONResponse({"detail": str(exc), "stale": True}, status_code=503)
