"""Routes: tokens and cost of a run (per endpoint, per config version, whole run) with a projection.

Tokens come from the time series (per endpoint, always up to date) and, per config version, from the records
(one grouped scan: the JSON API only, never polled). An endpoint's optional prices per million prompt and
completion tokens (``endpoints[].price_in_per_mtok`` / ``price_out_per_mtok``) give the cost so far and a
projection at the cap, or at the end of the dataset: the cost per ok record so far times the records still to
come.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store import queue as store
from ..store.models import LIVE_STATUSES
from .deps import ReadConn, render

router = APIRouter()


def _label(ep: dict[str, Any]) -> str:
    from urllib.parse import urlparse

    return str(ep.get("name") or urlparse(str(ep.get("base_url", ""))).netloc)


def cost_context(conn: Connection, run_id: int, *, by_version: bool = False) -> dict[str, Any]:
    try:
        run = store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None
    try:
        cfg = orjson.loads(run["config_json"] or "{}")
    except orjson.JSONDecodeError:
        cfg = {}
    prices = {_label(e): (e.get("price_in_per_mtok"), e.get("price_out_per_mtok"))
              for e in (cfg.get("endpoints") or []) if isinstance(e, dict)}
    endpoints = []
    total: dict[str, Any] = {"prompt": 0, "completion": 0, "reasoning": 0, "content": 0, "reasoning_estimated": 0,
                             "cost": None}
    cost = 0.0
    priced = False
    for ep, p, c, r, ct, r_est in conn.execute(text(
            "SELECT endpoint, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), SUM(content_tokens),"
            " SUM(reasoning_estimated)"
            " FROM series WHERE run_id = :r AND endpoint != '' GROUP BY endpoint ORDER BY endpoint"), {"r": run_id}):
        row: dict[str, Any] = {"endpoint": ep, "prompt": int(p or 0), "completion": int(c or 0),
                               "reasoning": int(r or 0), "content": int(ct or 0),
                               "reasoning_estimated": int(r_est or 0), "cost": None}
        pin, pout = prices.get(ep, (None, None))
        if pin is not None or pout is not None:
            row["cost"] = row["prompt"] * (pin or 0) / 1e6 + row["completion"] * (pout or 0) / 1e6
            cost += row["cost"]
            priced = True
        for k in ("prompt", "completion", "reasoning", "content", "reasoning_estimated"):
            total[k] += row[k]
        endpoints.append(row)
    n_ok = int(run["n_ok"] or 0)
    target = run["cap"] if run["cap"] is not None else run["total"]
    projection = None
    if priced:
        total["cost"] = cost
        if n_ok and target:
            projection = cost / n_ok * max(int(target), n_ok)
    out: dict[str, Any] = {"run": {"id": run["id"], "name": run["name"], "status": run["status"]},
                           "live": run["status"] in LIVE_STATUSES, "endpoints": endpoints, "total": total,
                           "priced": priced, "n_ok": n_ok, "target": target, "projected_cost": projection,
                           "tokens_per_ok": (total["completion"] / n_ok) if n_ok else None}
    if by_version:
        out["by_config_version"] = [
            {"config_version": v, "records": int(n), "prompt": int(p or 0), "completion": int(c or 0),
             "reasoning": int(r or 0), "reasoning_estimated": int(r_est or 0)}
            for v, n, p, c, r, r_est in conn.execute(text(
                "SELECT gen_version, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens),"
                " SUM(CASE WHEN reasoning_tokens_source = 'estimate' THEN reasoning_tokens ELSE 0 END)"
                " FROM record WHERE run_id = :r AND status = 'ok' GROUP BY gen_version ORDER BY gen_version"),
                {"r": run_id})]
    return out


@router.get("/runs/{run_id}/cost", include_in_schema=False)
def cost_fragment(request: Request, run_id: int, conn: ReadConn) -> Response:
    return render(request, "_run_cost.html", {"cost": cost_context(conn, run_id)})


@router.get("/api/runs/{run_id}/tokens", tags=["runs"],
            summary="Tokens per endpoint and per config version, the cost so far and its projection")
def api_tokens(run_id: int, conn: ReadConn) -> Any:
    return cost_context(conn, run_id, by_version=True)
