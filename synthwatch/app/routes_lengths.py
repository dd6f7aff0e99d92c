"""Routes: length histograms (a run, or a records-table filter), drawn by charts.js from this JSON.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .. import lengths, review, stats
from .deps import ReadConn, lean
from .routes_runs import _limit_ms, _run_or_404

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


def lengths_data(conn: Any, run: dict[str, Any], f: review.Filters) -> dict[str, Any]:
    h = lengths.histogram(conn, run["id"], f, max_tokens=lengths.max_tokens_of(run))
    return {**h, "run_id": run["id"], "live": run["live"], "kinds": list(lengths.KINDS),
            "kind_labels": lengths.KIND_LABELS, "note": _note(h), "filters": f.params()}


@router.get("/api/runs/{run_id}/lengths", tags=["review"],
            summary="Histograms of reasoning, content and all output tokens (any records-table filter)")
def api_lengths(request: Request, conn: ReadConn, run_id: int) -> Any:
    """Counts per token-length bin. Bin 0 is exactly 0 tokens; with a max_tokens, the last bin is the
    records at the limit. Takes the records table's filter parameters (status, check, flag, q, ...)."""
    run = _run_or_404(conn, run_id)
    try:
        f = review.Filters.from_params(request.query_params)
        with stats.time_limit(conn, _limit_ms(request)):
            data = lengths_data(conn, run, f)
    except review.ReviewError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    except stats.StatsTimeout as exc:
        return JSONResponse({"detail": str(exc), "stale": True}, status_code=503)
    return lean(request, JSONResponse(data))
