"""`synthwatch watch-streams RUN`: the streams in flight in a terminal (#36), redrawn in place like the progress line.

It reads what the run's workers publish (the same data as the run page's panel and GET /api/runs/{id}/streams:
synthwatch.app.routes_streams.streams_data), so it works from any host that reaches the database, for every worker.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import Any

from ..cli import CliError
from ._common import add_db_arg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "watch-streams", help="print the streams in flight of a run, redrawn in place: record, endpoint, age, tokens,"
        " tokens/s, field, silence, the last characters of reasoning and content",
        description="Reads the snapshots the run's workers publish (settings live_streams_refresh_ms, "
                    "live_stream_tail_chars, live_streams_max); ends when the run is no longer live.",
    )
    add_db_arg(p)
    p.add_argument("run", help="run name or id")
    p.add_argument("--every-s", type=float, default=1.0, help="seconds between redraws (default 1)")
    p.add_argument("--once", action="store_true", help="print the streams once and exit")
    p.add_argument("--tail-chars", type=int, default=80,
                   help="characters of reasoning and of content shown per stream (default 80, at most what the "
                        "workers publish)")
    p.add_argument("--max-streams", type=int, default=20, help="streams shown, the oldest first (default 20)")
    p.set_defaults(func=handle)


def _one_line(s: str, n: int) -> str:
    # model text on a terminal: control characters (escape sequences) never reach it
    flat = "".join(c if c.isprintable() else " " for c in s)
    return " ".join(flat.split())[-n:] if n > 0 else ""


def render(data: dict[str, Any], name: str, tail: int, max_streams: int, width: int) -> list[str]:
    """The lines of one redraw (plain text, each cut to ``width``)."""
    streams = data["streams"][:max_streams]
    head = (f"{name}: {data['n_in_flight']} streams in flight on {data['workers']} worker(s), {len(streams)} shown"
            if data["live"] else f"{name}: not running, no stream in flight")
    lines = [head]
    if streams:
        lines.append(f"{'record':>8} {'endpoint':<14} {'age':>7} {'tokens':>7} {'tok/s':>6} {'field':<18} "
                     f"{'silent':>7}")
    for s in streams:
        silent = f"{s['since_token_s']:.1f}s" + ("!" if s["stalled"] else "")
        lines.append(f"{s['record_id']:>8} {_one_line(s['endpoint'], 14):<14} {s['age_s']:>6.1f}s {s['tokens']:>7}"
                     f" {s['tokens_per_s']:>6.1f} {_one_line(s['field'], 18) or '-':<18} {silent:>7}"
                     + ("  STALLED" if s["stalled"] else ""))
        if tail > 0:
            lines.append(f"{'':>9}reasoning: {_one_line(s['reasoning'], tail)}")
            lines.append(f"{'':>9}content:   {_one_line(s['content'], tail)}")
    return [ln[:width] for ln in lines]


def handle(args: argparse.Namespace) -> int:
    from ..app.routes_streams import streams_data
    from ..settings import get_settings
    from ..store import queue as store
    from ..store.db import DatabaseError, open_engine

    if args.every_s <= 0:
        raise CliError("--every-s must be more than 0")
    try:
        engine = open_engine(args.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    settings = get_settings()
    tty = sys.stdout.isatty()
    drawn = 0
    try:
        with engine.connect() as conn:
            try:
                run = store.run_row(conn, args.run)
            except store.NotFound as exc:
                raise CliError(str(exc)) from None
            conn.rollback()
        while True:
            with engine.connect() as conn:
                data = streams_data(conn, settings, int(run["id"]))
                conn.rollback()
            width = shutil.get_terminal_size((120, 24)).columns if tty else 10_000
            lines = render(data, str(run["name"]), args.tail_chars, args.max_streams, width)
            if tty and drawn:
                # the same plain redraw as the progress line: back to the block's first line, cleared below
                sys.stdout.write(f"\x1b[{drawn}F\x1b[J")
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
            drawn = len(lines)
            if args.once or not data["live"]:
                return 0
            time.sleep(args.every_s)
    except KeyboardInterrupt:
        return 0
    finally:
        engine.dispose()
