"""Routes: the streams in flight of a run (#36), as each worker last published them (workers/inflight.py).

Each running worker writes a bounded snapshot of its streams to its ``worker`` row every
``live_streams_refresh_ms`` (the oldest ``live_streams_max``, the last ``live_stream_tail_chars`` characters of
reasoning and of content each); this reads those rows only, never the records, so it works across workers and on
PostgreSQL. The text is model text: every value is re-typed and bounded here, and the templates escape it.

- ``GET /api/runs/{id}/streams`` (``?record=N``: that stream only): JSON;
- ``GET /runs/{id}/streams``: the run page's panel (polled only while it is open and the run is live);
- ``GET /runs/{id}/streams/{record_id}``: one stream, watched as it is written (polled while it is in flight).
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store.models import LIVE_STATUSES
from . import run_stats
from .deps import ReadConn, render

router = APIRouter()

MAX_WORKERS = 200
STALL_S = 5.0  # a stream silent this long is shown as stalled
PANEL_POLL_MS = 5000  # the panel's list, while open
ONE_POLL_MS = 1000  # one stream, while open
# special tokens as the token view marks them: think tags, chat-template markers (<|im_end|>, <｜Assistant｜>)
_SPECIAL = re.compile(r"</?think>|<\|[^|<>\s]{1,40}\|>|<｜[^｜<>\s]{1,40}｜>|\[/?INST\]")
_TEXT_KEYS = ("endpoint", "field", "reasoning_field", "reasoning", "content")
_NUM_KEYS = ("age_s", "since_token_s", "tokens_per_s")


def _run(conn: Connection, run_id: int) -> dict[str, Any]:
    run = run_stats.get_run(conn, run_id)
    if run is None:
        raise HTTPException(404, f"no run with id {run_id} in this database")
    return run


def _clean(row: Any, worker_id: int, tail_chars: int, behind_s: float) -> dict[str, Any] | None:
    """One published stream, re-typed and bounded (a worker row is data, not trusted structure)."""
    if not isinstance(row, dict):
        return None
    rid = row.get("record_id")
    if type(rid) is not int:
        return None
    out: dict[str, Any] = {"record_id": rid, "worker_id": worker_id}
    for k in _TEXT_KEYS:
        v = row.get(k)
        v = v if isinstance(v, str) else ""
        out[k] = v[-tail_chars:] if k in ("reasoning", "content") else v[:200]
    for k in _NUM_KEYS:
        v = row.get(k)
        out[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0
    tok = row.get("tokens")
    out["tokens"] = tok if type(tok) is int else 0
    # as of now, not of the snapshot: the time since it was written is added
    out["age_s"] = round(out["age_s"] + behind_s, 1)
    out["since_token_s"] = round(out["since_token_s"] + behind_s, 1)
    out["stalled"] = out["since_token_s"] >= STALL_S
    return out


def streams_data(conn: Connection, st: Any, run_id: int, record: int | None = None) -> dict[str, Any]:
    """The run's streams in flight as its running workers last published them (the API, the panel, and
    `synthwatch watch-streams`). ``st``: the Settings (refresh, tail size, when a worker is dead)."""
    run = _run(conn, run_id)
    refresh_s = max(st.live_streams_refresh_ms / 1000, 0.1)
    tail = int(st.live_stream_tail_chars)
    fresh_s = max(3 * refresh_s, float(st.dead_worker_after_s))
    now = time.time()
    live = run["status"] in LIVE_STATUSES
    streams: list[dict[str, Any]] = []
    n = 0
    workers = 0
    if live:
        for wid, data, at in conn.execute(text(
                "SELECT id, streams_json, streams_at FROM worker WHERE run_id = :r AND status = 'running'"
                " AND streams_json IS NOT NULL AND streams_at >= :since ORDER BY id LIMIT :n"),
                {"r": run_id, "since": now - fresh_s, "n": MAX_WORKERS}):
            try:
                snap = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(snap, dict):
                continue
            workers += 1
            c = snap.get("n")
            n += c if type(c) is int and c >= 0 else 0
            rows = snap.get("streams")
            for row in rows if isinstance(rows, list) else ():
                s = _clean(row, int(wid), tail, max(0.0, now - float(at)))
                if s is not None and (record is None or s["record_id"] == record):
                    streams.append(s)
    streams.sort(key=lambda s: -s["age_s"])
    return {"run_id": run_id, "live": live, "workers": workers, "n_in_flight": n, "shown": len(streams),
            "streams": streams, "refresh_ms": st.live_streams_refresh_ms, "tail_chars": tail, "stall_s": STALL_S}


def segments(s: str) -> list[tuple[str, bool]]:
    """Text split into (piece, is a special token) for highlighting; the template escapes each piece."""
    out: list[tuple[str, bool]] = []
    at = 0
    for m in _SPECIAL.finditer(s):
        if m.start() > at:
            out.append((s[at:m.start()], False))
        out.append((m.group(0), True))
        at = m.end()
    if at < len(s):
        out.append((s[at:], False))
    return out


@router.get("/api/runs/{run_id}/streams", tags=["runs"], summary="The streams in flight: record, endpoint, age,"
            " tokens, tokens/s, field, time since the last token, the last characters of reasoning and content")
def api_streams(conn: ReadConn, request: Request, run_id: int, record: int | None = None) -> dict[str, Any]:
    return streams_data(conn, request.app.state.settings, run_id, record)


@router.get("/runs/{run_id}/streams", include_in_schema=False)
def streams_panel(conn: ReadConn, request: Request, run_id: int) -> Any:
    data = streams_data(conn, request.app.state.settings, run_id)
    return render(request, "_run_streams_list.html", {**data, "poll_ms": PANEL_POLL_MS, "segments": segments})


@router.get("/runs/{run_id}/streams/{record_id}", include_in_schema=False)
def stream_one(conn: ReadConn, request: Request, run_id: int, record_id: int) -> Any:
    data = streams_data(conn, request.app.state.settings, run_id, record_id)
    stream = data["streams"][0] if data["streams"] else None
    return render(request, "_run_stream_one.html", {"run_id": run_id, "record_id": record_id, "s": stream,
                                                     "live": data["live"], "poll_ms": ONE_POLL_MS,
                                                     "segments": segments})
