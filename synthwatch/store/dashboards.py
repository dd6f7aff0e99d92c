"""Where the dashboard is: every link the CLI prints and every alarm's example link uses this, never a guessed port.

The address comes from, in order: ``SYNTHWATCH_DASHBOARD_URL`` (settings.dashboard_url, for a dashboard behind a
proxy or on another machine), then a dashboard running on this database (`synthwatch serve` and `synthwatch demo`
record their address in the ``dashboard`` table while they run and remove it when they stop). A row left behind
by a dashboard that was killed is ignored when its process is gone (same host); none known -> None, and the
caller says how to start one instead of printing a guess."""

from __future__ import annotations

import os
import socket
import time

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..settings import get_settings


def record_dashboard(engine: Engine, url: str) -> int:
    """Note that a dashboard listens at ``url`` (until forget_dashboard); returns its row id."""
    from .queue import write_begin

    with engine.connect() as conn, write_begin(conn):
        row = conn.execute(
            text("INSERT INTO dashboard (url, host, pid, started_at) VALUES (:u, :h, :p, :t) RETURNING id"),
            {"u": url.rstrip("/"), "h": socket.gethostname(), "p": os.getpid(), "t": time.time()},
        ).scalar_one()
    return int(row)


def forget_dashboard(engine: Engine, row_id: int) -> None:
    from .queue import write_begin

    with engine.connect() as conn, write_begin(conn):
        conn.execute(text("DELETE FROM dashboard WHERE id = :i"), {"i": row_id})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        return True
    return True


def running_dashboard(conn: Connection) -> str | None:
    """The newest dashboard recorded on this database whose process still runs (or runs on another host)."""
    # (every command migrates the database when it opens it: the table is there)
    rows = conn.execute(text("SELECT url, host, pid FROM dashboard ORDER BY started_at DESC, id DESC")).all()
    here = socket.gethostname()
    for url, host, pid in rows:
        if host != here or _alive(int(pid)):
            return str(url)
    return None


def dashboard_url(where: Engine | Connection | None = None) -> str | None:
    """The dashboard's base URL (no trailing slash), or None when none is known."""
    configured = get_settings().dashboard_url
    if configured:
        return configured.rstrip("/")
    if where is None:
        return None
    if isinstance(where, Engine):
        with where.connect() as conn:
            found = running_dashboard(conn)
            conn.rollback()
            return found
    return running_dashboard(where)


def run_link(where: Engine | Connection | None, run_id: int, start_hint: str) -> str:
    """``dashboard: URL/runs/N``, or how to start a dashboard (``start_hint``, e.g. `synthwatch serve --db X`)."""
    base = dashboard_url(where)
    if base:
        return f"dashboard: {base}/runs/{run_id}"
    return f"dashboard: none running; start one with `{start_hint}`, then open its /runs/{run_id}"

