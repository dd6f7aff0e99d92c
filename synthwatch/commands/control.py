"""`synthwatch control`: pause, resume, stop, cap or re-pace a run from the terminal (same as the dashboard)."""

from __future__ import annotations

import argparse
import sys

from ..cli import CliError
from ..hints import command as hint
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
    p.add_argument("--ack", action="store_true",
                   help="resume: acknowledge the open alarm that paused the run, in the same action (with "
                        "--for-records or --for-minutes); a plain resume is refused while one is open")
    p.add_argument("--in-flight", choices=("cancel", "finish"), dest="in_flight",
                   help="pause: what happens to the requests in flight: cancel (the connection is closed, the server"
                        " frees them, their records go back to pending) or finish (the default); stop / stop-now"
                        " are the same choice for a stop")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--for-records", type=int, metavar="N", help="with --ack: let N more records be claimed")
    g.add_argument("--for-minutes", type=float, metavar="M", help="with --ack: go on for M minutes")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..quality import detection  # noqa: F401  - registers the claim gate a resume asks (#35)
    from ..store import queue as store
    from ..store.db import DatabaseError, open_engine

    action = ACTIONS[args.action]
    if action in ("cap", "concurrency") and args.value is None:
        raise CliError(f"{args.action} needs a value, e.g. `{hint('control', args.action, 100, run=args.run, db=args.db)}`")
    if action not in ("cap", "concurrency") and args.value is not None:
        raise CliError(f"{args.action} takes no value (got {args.value!r})")
    if args.in_flight is not None and action != "pause":
        raise CliError("--in-flight goes with pause (a stop's choice is stop or stop-now)")
    value = args.in_flight if action == "pause" else args.value
    bounded = args.for_records is not None or args.for_minutes is not None
    if args.ack and action != "resume":
        raise CliError("--ack goes with resume only")
    if args.ack and not bounded:
        raise CliError("--ack needs --for-records N or --for-minutes M (how long the alarm stays snoozed)")
    if bounded and not args.ack:
        raise CliError("--for-records / --for-minutes go with --ack")
    try:
        engine = open_engine(args.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    try:
        with engine.connect() as conn:
            run = store.run_row(conn, args.run)
        applied = store.apply_control(engine, int(run["id"]), action, value, actor="cli",
                                      ack_records=args.for_records, ack_minutes=args.for_minutes)
    except store.AlarmOpen as exc:
        raise CliError(str(exc).replace("RUN", str(run["name"]))) from None
    except store.NotFound as exc:
        raise CliError(str(exc)) from None
    except store.ControlError as exc:
        raise CliError(str(exc)) from None
    finally:
        engine.dispose()
    for a in applied.pop("acknowledged", []):
        print(f"acknowledged alarm #{a['id']} {a['rule']} for {a['for']}: the run pauses again after that if the"
              " check failed since", file=sys.stderr)
    shown = ", ".join(f"{k} = {v if v is not None else 'none'}" for k, v in applied.items())
    print(f"run {run['name']!r} (id {run['id']}, {run['status']}): {shown}; workers follow within a second",
          file=sys.stderr)
    return 0
