"""`synthwatch checks`: show a run's check rates and alarms; change its check settings; recompute."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sqlalchemy import text

from ..cli import CliError
from ..hints import command as hint
from ._common import add_db_arg, open_run


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "checks",
        help="data-quality checks of a run: rates, alarms, settings, recompute",
        description="Without options: print the run's check rates and active alarms. --config replaces the "
        "run's [checks] settings (TOML file with a [checks] table, same keys as docs/checks.md); --recompute "
        "re-runs every check on every stored record with the current settings.",
    )
    add_db_arg(p)
    p.add_argument("run", help="run name or id")
    p.add_argument("--config", help="TOML file whose [checks] table becomes the run's check settings")
    p.add_argument("--recompute", action="store_true", help="re-check every stored record and rebuild rates/alarms "
                   "(the extended checks too: verifiers, user checks, rules, language, near-duplicates)")
    p.add_argument("--pending", action="store_true",
                   help="run the extended checks on the records still waiting for a verdict (a worker stopped before "
                        "its checks drained, or a check added to a finished run)")
    p.add_argument("--retry-errors", action="store_true",
                   help="run each extended check again on the records whose verdict in force is its 'error' (it "
                        "raised, overran its budget or could not be loaded), and on those only; the error stays in the "
                        "history (the judge's errors: synthwatch judge RUN --retry-errors)")
    p.add_argument("--ack", type=int, metavar="ALARM_ID",
                   help="acknowledge (snooze) an alarm: until its check fails again, or with --for-records / "
                        "--for-minutes for that long; prints what it snoozed and until when")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--for-records", type=int, metavar="N", help="with --ack: snooze for N more claimed records")
    g.add_argument("--for-minutes", type=float, metavar="M", help="with --ack: snooze for M minutes")
    p.add_argument("--accept", type=int, metavar="ITEM_ID",
                   help="accept an open item (records an alarm left failing) as it is; needs --reason")
    p.add_argument("--reason", help="why the open item is accepted, or why --config weakens detection (a check"
                   " disabled, a threshold raised...: refused without one); kept with who and when")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=handle)


def _open_items(engine: Any, run: dict[str, Any], a: argparse.Namespace, out: Any) -> list[dict[str, Any]]:
    """--accept, then the run's open items brought up to date (quality/detection/open_items.py)."""
    from ..quality.detection import open_items

    run_id = int(run["id"])
    if a.accept is not None:
        try:
            item = open_items.accept(engine, run_id, a.accept, a.reason, actor="cli")
        except open_items.OpenItemError as exc:
            raise CliError(str(exc)) from None
        print(f"accepted open item #{item['id']}: {item['text']} (reason: {item['reason']})", file=sys.stderr)
    elif a.reason and not a.config:
        raise CliError("--reason goes with --accept ITEM_ID or --config FILE")
    open_items.sync_run(engine, run_id, actor="cli")
    with engine.connect() as conn:
        return open_items.items(conn, run_id)


def handle(a: argparse.Namespace) -> int:
    from ..config import ConfigError, load_toml
    from ..quality.checks import ChecksConfigError
    from ..quality.detection.alarms import AlarmNotFound, acknowledge, banner_alarms, snoozed_alarms
    from ..quality.recompute import check_rates, recompute, save_settings
    from ..store.queue import ControlError
    engine, run = open_run(a.db, a.run)
    run_id = int(run["id"])
    out = sys.stdout
    if a.config:
        try:
            data = load_toml(a.config)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        unknown = sorted(set(data) - {"checks"})
        if "checks" not in data:
            raise CliError(f"{a.config}: no [checks] table")
        if unknown:
            raise CliError(f"{a.config}: only a [checks] table is read here; unexpected keys: {', '.join(unknown)}")
        try:
            save_settings(engine, run_id, data["checks"], actor="cli", reason=a.reason)
        except ChecksConfigError as exc:
            raise CliError(f"{a.config}: {exc}") from None
        print(f"check settings of run {run['name']!r} replaced from {a.config}", file=sys.stderr)
    if (a.for_records is not None or a.for_minutes is not None) and a.ack is None:
        raise CliError("--for-records / --for-minutes go with --ack ALARM_ID")
    acked = None
    if a.ack is not None:
        try:
            acked = acknowledge(engine, run_id, a.ack, actor="cli", for_records=a.for_records,
                                for_minutes=a.for_minutes)
        except (AlarmNotFound, ControlError) as exc:
            raise CliError(str(exc)) from None
        state = "" if acked["active"] else " (no longer active)"
        print(f"{'already acknowledged' if acked['already'] else 'acknowledged'}: alarm #{acked['id']}"
              f" {acked['rule']} ({acked['title']}){state}; snoozed {acked['until']}", file=sys.stderr)
    summary: dict[str, Any] | None = None
    if a.recompute or a.pending or a.retry_errors:
        from ..quality.user_checks import loadable_error
        from .run import refuse_dashboard_changes

        # user checks a dashboard change stored are re-checked against the policy before any import (#34)
        refuse_dashboard_changes(engine, run)
        with engine.connect() as conn:  # the settings as they are now (--config above may have changed them)
            cfg = json.loads(conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
                             or "{}")
            conn.rollback()
        why = loadable_error(cfg.get("checks"))
        if why is not None:  # before a record is read: not an 'error' verdict on every one of them (#35)
            raise CliError(f"{why}; nothing was re-checked")
    if a.recompute:
        try:
            summary = recompute(engine, run_id)
        except ChecksConfigError as exc:
            raise CliError(str(exc)) from None
        print(f"recomputed {summary['records']} records in {summary['seconds']} s", file=sys.stderr)
    extended = None
    if a.recompute or a.pending:
        from ..quality.extended import recheck

        try:  # a --dedup-against file gone or changed into bad input: one line, exit 2 (#38)
            extended = recheck(engine, run_id, all_records=bool(a.recompute))
        except ChecksConfigError as exc:
            raise CliError(str(exc)) from None
        if extended["records"] or a.pending:
            print(f"extended checks: {extended['records']} records checked", file=sys.stderr)
    retried = None
    if a.retry_errors:
        from ..quality.extended import retry_errors

        retried = retry_errors(engine, run_id)
        done = ", ".join(f"{n} {k}" for n, k in retried["retried"].items()) or "none had an error verdict"
        left = sum(retried["still_error"].values())
        print(f"retried errored verdicts: {done}" + (f"; {left} still error" if left else ""), file=sys.stderr)
    items = _open_items(engine, run, a, out)
    from ..quality.user_checks import installed_entry_points
    from ..quality.verdicts import pending_count

    entry_points = installed_entry_points()
    with engine.connect() as conn:
        rates = check_rates(conn, run_id)
        alarms = banner_alarms(conn, run_id)
        snoozed = snoozed_alarms(conn, run_id)
        pending = pending_count(conn, run_id)
    if a.json:
        json.dump({"run_id": run_id, "checks": rates, "alarms": alarms, "snoozed": snoozed, "acknowledged": acked,
                   "open_items": items, "recompute": summary, "extended": extended, "retried": retried, "pending_checks": pending,
                   "entry_points": entry_points}, out, indent=1)
        out.write("\n")
        return 0
    print(f"{'check':<26} {'last window':>18} {'whole run':>20}  example", file=out)
    for r in rates:
        if not r["n_total"] and not r.get("extended"):
            continue
        win = f"{r['win_fail']}/{r['win_total']} ({r['win_rate']:.1%})" if r["win_total"] else "-"
        whole = f"{r['n_fail']}/{r['n_total']} ({r['rate']:.1%})" if r["n_total"] else "-"
        ex = f"#{r['example_record_id']}" if r["n_fail"] and r["example_record_id"] else ""
        if r.get("n_error"):
            ex = f"{ex} {r['n_error']} errors".strip()
        print(f"{r['check_name']:<26} {win:>18} {whole:>20}  {ex}", file=out)
    if pending:
        print(f"\n{pending} records wait for their extended checks (pending); "
              f"`{hint('checks', '--pending', run=run['name'], db=a.db)}` checks them now", file=out)
    if entry_points:
        print("\nuser checks installed (entry points, group synthwatch.checks; use one with [[checks.user]] name = "
              "...):", file=out)
        for name, target in sorted(entry_points.items()):
            print(f"  {name} = {target}", file=out)
    if alarms:
        print(f"\n{len(alarms)} active alarm(s):", file=out)
        for al in alarms:
            print(f"  [{al['severity']}] #{al['id']} {al['title']} ({al['count']} records)"
                  f"{' - run auto-paused' if al['auto_paused'] else ''}", file=out)
            print(f"      {al['message']}", file=out)
            if al["fix"]:
                print(f"      fix: {al['fix']}", file=out)
    if snoozed:
        print(f"\n{len(snoozed)} snoozed alarm(s) (acknowledged, still open: an export names them):", file=out)
        for al in snoozed:
            print(f"  [snoozed] #{al['id']} {al['title']} ({al['count']} records), snoozed {al['until']}", file=out)
    if not alarms and not snoozed:
        print("\nno active alarms", file=out)
    elif not alarms:
        print("\nno unacknowledged alarms", file=out)
    if items:
        print(f"\n{len(items)} open item{'' if len(items) == 1 else 's'} (records an alarm left failing):", file=out)
        for it in items:
            print(f"  #{it['id']} {it['text']}", file=out)
        print("  close one by repairing its records (rederive / rerun, docs/repair.md), flagging them bad, or: "
              f"{hint('checks', '--accept', items[0]['id'], '--reason', 'why', run=run['name'], db=a.db)}", file=out)
    else:
        print("no open items", file=out)
    return 0
