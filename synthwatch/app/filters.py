"""Jinja filters. They return plain strings, so autoescape still applies to their output."""

from __future__ import annotations

import datetime as dt
from typing import Any

from jinja2 import Environment

from ..check_catalog import CHECK_NAMES
from ..store.models import LIVE_STATUSES
from .words import check_help, check_label, plural, status_in_labels


def fmt_time(ts: float | None) -> str:
    if not ts:
        return "–"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(seconds: float | None, coarse: bool = False) -> str:
    """``coarse`` drops the seconds past the first minute: a polled fragment whose only moving part is a duration
    (a paused run's "since the start") then changes once a minute, and its ETag answers the polls in between."""
    if seconds is None or seconds < 0:
        return "–"
    s = int(seconds)
    if coarse and s < 3600:
        return f"{s // 60}m" if s >= 60 else "under a minute"
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def fmt_num(x: Any, digits: int = 0) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and digits:
        return f"{x:,.{digits}f}"
    try:
        return f"{round(x):,}"
    except (TypeError, ValueError):
        return str(x)


def fmt_pct(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x * 100:.{digits}f}%"


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "–"
    if x < 1:
        return f"{x * 1000:.0f} ms"
    return f"{x:.2f} s"


def run_state(run: dict[str, Any]) -> str:
    """What a person reads for a run's state: its status, or where it is going while workers follow a control."""
    status, desired = run.get("status") or "", run.get("desired") or "run"
    if status not in LIVE_STATUSES:
        return status
    if desired in ("stop", "stop_now"):
        return "stopping" if status == "stopping" else "stopping…"
    if desired == "pause" and status != "paused":
        return "pausing…"
    if desired == "run" and status == "paused":
        return "resuming…"
    return status


def state_note(run: dict[str, Any]) -> str:
    """The run's status message, unless it only repeats the state ("stopped stopped"), with checks named by their
    labels (#37: the stored message names them by id)."""
    msg = (run.get("status_message") or "").strip()
    return "" if msg.lower().rstrip(".") in (run.get("status") or "", run_state(run).rstrip("…")) else \
        status_in_labels(msg)


def install(env: Environment) -> None:
    env.filters.update(
        time=fmt_time, duration=fmt_duration, num=fmt_num, pct=fmt_pct, seconds=fmt_seconds, plural=plural,
        run_state=run_state, state_note=state_note, check_label=check_label,
    )
    from .launch import shown_url

    # the checks a re-derive can recompute (a record's bits); any other check's records are re-run (#38)
    env.globals.update(check_label=check_label, check_help=check_help, shown_url=shown_url,
                       builtin_checks=frozenset(CHECK_NAMES))
