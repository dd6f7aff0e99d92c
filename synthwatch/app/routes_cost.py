"""Routes: tokens and cost of a run (per endpoint, per config version, whole run) with a projection.

Tokens come from the time series (per endpoint, always up to date) and, per config version, from the records
(one grouped scan: the JSON API and a stopped run's page, never polled). The cost counts every billed token:
those of ok records and of failed, timed-out and retried attempts (``billed_*``; docs/metrics.md says which part
is estimated). An endpoint's optional prices per million prompt and completion tokens
(``endpoints[].price_in_per_mtok`` / ``price_out_per_mtok``: TOML, the same-named flags, the start form) give the
cost so far and a projection at the cap, or at the end of the dataset: the cost per ok record so far times the
records still to come.
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


def _prices(cfg: Any) -> dict[str, tuple[float | None, float | None]]:
    """Endpoint label -> (price per million prompt tokens, per million completion tokens) of one config."""
    eps = cfg.get("endpoints") if isinstance(cfg, dict) else None
    return {_label(e): (e.get("price_in_per_mtok"), e.get("price_out_per_mtok"))
            for e in (eps or []) if isinstance(e, dict)}


def _cost(prices: tuple[float | None, float | None], prompt: int, completion: int) -> float | None:
    pin, pout = prices
    if pin is None and pout is None:
        return None
    return prompt * (pin or 0) / 1e6 + completion * (pout or 0) / 1e6


_TOKEN_KEYS = ("prompt", "completion", "reasoning", "content", "reasoning_estimated", "billed_prompt",
               "billed_completion", "billed_estimated")


def cost_context(conn: Connection, run_id: int, *, by_version: bool = False) -> dict[str, Any]:
    try:
        run = store.run_row(conn, run_id)
    except store.NotFound:
        raise HTTPException(404, f"no run {run_id}") from None
    try:
        cfg = orjson.loads(run["config_json"] or "{}")
    except orjson.JSONDecodeError:
        cfg = {}
    prices = _prices(cfg)
    endpoints = []
    total: dict[str, Any] = dict.fromkeys(_TOKEN_KEYS, 0)
    total["cost"] = None
    cost = 0.0
    priced = False
    for ep, p, c, r, ct, r_est, bp, bc, be in conn.execute(text(
            "SELECT endpoint, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), SUM(content_tokens),"
            " SUM(reasoning_estimated), SUM(billed_prompt_tokens), SUM(billed_completion_tokens),"
            " SUM(billed_estimated)"
            " FROM series WHERE run_id = :r AND endpoint != '' GROUP BY endpoint ORDER BY endpoint"), {"r": run_id}):
        row: dict[str, Any] = {"endpoint": ep, "prompt": int(p or 0), "completion": int(c or 0),
                               "reasoning": int(r or 0), "content": int(ct or 0),
                               "reasoning_estimated": int(r_est or 0),
                               # every attempt's tokens; a run written before they were counted (or a watched
                               # one, whose failed attempts are not known): its ok records' at least
                               "billed_prompt": max(int(bp or 0), int(p or 0)),
                               "billed_completion": max(int(bc or 0), int(c or 0)),
                               "billed_estimated": int(be or 0)}
        row["cost"] = _cost(prices.get(ep, (None, None)), row["billed_prompt"], row["billed_completion"])
        if row["cost"] is not None:
            cost += row["cost"]
            priced = True
        for k in _TOKEN_KEYS:
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
        out["by_config_version"] = versions_cost(conn, run_id, cfg)
    return out


def versions_cost(conn: Connection, run_id: int, current_cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Per config version: the ok records' tokens, and the tokens billed for every attempt of the outputs made
    under it (records and the earlier outputs a re-run replaced, record_history) at that version's prices and
    the endpoint each output ended on. One grouped scan of the run's records: the API and a stopped run's page."""
    versions: dict[int, dict[str, Any]] = {}
    for v, n, p, c, r, r_est in conn.execute(text(
            "SELECT gen_version, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens),"
            " SUM(CASE WHEN reasoning_tokens_source = 'estimate' THEN reasoning_tokens ELSE 0 END)"
            " FROM record WHERE run_id = :r AND status = 'ok' GROUP BY gen_version ORDER BY gen_version"),
            {"r": run_id}):
        versions[v] = {"config_version": v, "records": int(n), "prompt": int(p or 0), "completion": int(c or 0),
                       "reasoning": int(r or 0), "reasoning_estimated": int(r_est or 0), "billed_prompt": 0,
                       "billed_completion": 0, "billed_estimated": 0, "cost": None}
    configs = {int(v): orjson.loads(j) for v, j in conn.execute(
        text("SELECT version, config_json FROM config_version WHERE run_id = :r"), {"r": run_id})}
    for v, ep, bp, bc, be in conn.execute(text(
            "SELECT gen_version, endpoint, SUM(bp), SUM(bc), SUM(be) FROM ("
            " SELECT gen_version, endpoint, COALESCE(billed_prompt_tokens, prompt_tokens, 0) AS bp,"
            " COALESCE(billed_completion_tokens, completion_tokens, 0) AS bc, COALESCE(billed_estimated, 0) AS be"
            " FROM record WHERE run_id = :r AND status IN ('ok', 'error', 'timeout')"
            " UNION ALL SELECT gen_version, endpoint, COALESCE(billed_prompt_tokens, prompt_tokens, 0),"
            " COALESCE(billed_completion_tokens, completion_tokens, 0), COALESCE(billed_estimated, 0)"
            " FROM record_history WHERE run_id = :r AND status IN ('ok', 'error', 'timeout')"
            ") AS billed GROUP BY gen_version, endpoint"), {"r": run_id}):
        row = versions.setdefault(v, {"config_version": v, "records": 0, "prompt": 0, "completion": 0,
                                      "reasoning": 0, "reasoning_estimated": 0, "billed_prompt": 0,
                                      "billed_completion": 0, "billed_estimated": 0, "cost": None})
        row["billed_prompt"] += int(bp or 0)
        row["billed_completion"] += int(bc or 0)
        row["billed_estimated"] += int(be or 0)
        c = _cost(_prices(configs.get(v, current_cfg)).get(ep or "", (None, None)), int(bp or 0), int(bc or 0))
        if c is not None:
            row["cost"] = (row["cost"] or 0.0) + c
    return [versions[v] for v in sorted(versions, key=lambda x: (x is None, x or 0))]


@router.get("/runs/{run_id}/cost", include_in_schema=False)
def cost_fragment(request: Request, run_id: int, conn: ReadConn) -> Response:
    return render(request, "_run_cost.html", {"cost": run_page_cost(conn, run_id)})


def run_page_cost(conn: Connection, run_id: int) -> dict[str, Any]:
    """The Tokens card's data: per endpoint always; per config version once the run is not live (a scan of its
    records, never polled)."""
    ctx = cost_context(conn, run_id)
    if not ctx["live"]:
        ctx["by_config_version"] = versions_cost(conn, run_id, _config(conn, run_id))
    return ctx


def _config(conn: Connection, run_id: int) -> dict[str, Any]:
    raw = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
    try:
        cfg = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


@router.get("/api/runs/{run_id}/tokens", tags=["runs"],
            summary="Tokens per endpoint and per config version, the cost so far and its projection")
def api_tokens(run_id: int, conn: ReadConn) -> Any:
    return cost_context(conn, run_id, by_version=True)
