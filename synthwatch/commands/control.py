"""`synthwatch control`: pause, resume, stop, cap or re-pace a run from the terminal (same as the dashboard)."""

from __future__ import annotations

import argparse
import sys

from ..cli import CliError
from ._common import add_db_arg

ACTIONS = {"pause": "pause", "resume": "resume", "stop": "stop", "stop-now": "stop_now", "cap": "cap",
           "concurrency": "concurrency"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "control", help="pause / resume / stop / stop-now / cap N / concurrency N for a run",
        description="Workers follow within about a second; every action is written to the run's audit log.",
    )
    add_db_arg(p)
    p.add_argument("run", help="run name or id")
    p.add_argument("action", choices=list(ACTIONS), help="what to do")
    p.add_argument("value", nargs="?", help="the new cap ('none' removes it) or concurrency")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..store import queue as store
    from ..store.db import DatabaseError, open_engine

    action = ACTIONS[args.action]
    if action in ("cap", "concurrency") and args.value is None:
        raise CliError(f"{args.action} needs a value, e.g. `synthwatch control {args.run} {args.action} 100`")
    if action not in ("cap", "concurrency") and args.value is not None:
        raise CliError(f"{args.action} takes no value (got {args.value!r})")
    try:
        engine = open_engine(args.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    try:
        with engine.connect() as conn:
            run = store.run_row(conn, args.run)
        applied = store.apply_control(engine, int(run["id"]), action, args.value, actor="cli")
    except store.NotFound as exc:
        raise CliError(str(exc)) from None
    except store.ControlError as exc:
        raise CliError(str(exc)) from None
    finally:
        engine.dispose()
    shown = ", ".join(f"{k} = {v if v is not None else 'none'}" for k, v in applied.items())
    print(f"run {run['name']!r} (id {run['id']}, {run['status']}): {shown}; workers follow within a second",
          file=sys.stderr)
    return 0
