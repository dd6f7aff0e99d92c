"""`synthwatch fix | rederive | rerun | repairs | versions | autopause`: repair a run from a terminal.

Thin: parse flags, call synthwatch.store.versions / synthwatch.repair.actions / synthwatch.quality.detection.alarms, print. Every verb that
changes records previews first (`--dry-run` previews only; on a terminal it asks before applying).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from urllib.parse import parse_qsl

from ..capture.reasoning import MODES as REASONING_MODES
from ..cli import CliError
from ..hints import command as hint
from ._common import add_db_arg, add_flag, json_object_flag, open_run, positive_float, positive_int


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "fix", help="change a run's settings: a new config version (reading and generation settings)",
        description="Each change makes a new config version of the run; running workers adopt it within a "
        "second. Reading settings (reasoning.*) can then be applied to stored records with `synthwatch "
        "rederive`; generation settings apply to records generated or re-run from now on.")
    add_db_arg(p)
    p.add_argument("run", help="run name or id")
    g = p.add_argument_group("reading settings")
    g.add_argument("--reasoning-mode", choices=REASONING_MODES,
                   help='where the server puts the reasoning (reasoning.mode)')
    # each flag is named after the TOML key it sets (the old names still work: commands/_common.py add_flag)
    add_flag(g, "--reasoning-think-open", "--think-open", dest="think_open",
             help='the tag that opens inline reasoning (reasoning.think_open)')
    add_flag(g, "--reasoning-think-close", "--think-close", dest="think_close",
             help='the tag that closes inline reasoning (reasoning.think_close)')
    add_flag(g, "--reasoning-prefilled-open", "--prefilled-think", dest="prefilled", action="store_true", default=None,
             help='the template prefills the opening tag (reasoning.prefilled_open = true)')
    add_flag(g, "--no-reasoning-prefilled-open", "--no-prefilled-think", dest="prefilled", action="store_false",
             help='reasoning.prefilled_open = false')
    add_flag(g, "--reasoning-expect", "--expect-reasoning", dest="expect", action="store_true", default=None,
             help='the model reasons: empty reasoning is a failure (reasoning.expect = true)')
    add_flag(g, "--no-reasoning-expect", "--no-expect-reasoning", dest="expect", action="store_false",
             help='the model does not reason (reasoning.expect = false)')
    g = p.add_argument_group("generation settings")
    g.add_argument("--model", help='the served model name (model)')
    g.add_argument("--base-url", action="append", help="replaces the run's endpoints; repeat for several")
    g.add_argument("--api-key-env", help="environment variable holding the API key of --base-url's endpoints")
    g.add_argument("--max-tokens", type=positive_int, help='sampling.max_tokens')
    g.add_argument("--temperature", type=float, help='sampling.temperature')
    g.add_argument("--top-p", type=float, help='sampling.top_p')
    g.add_argument("--seed", type=int, help='sampling.seed')
    g.add_argument("--extra-body", help="JSON object: replaces sampling.extra_body")
    add_flag(g, "--timeouts-connect-s", "--connect-timeout-s", dest="connect_timeout_s", type=positive_float,
             help='seconds to connect (timeouts.connect_s)')
    add_flag(g, "--timeouts-total-s", "--timeout-s", dest="timeout_s", type=positive_float,
             help='seconds a request may take in all (timeouts.total_s)')
    add_flag(g, "--timeouts-idle-s", "--idle-timeout-s", dest="idle_timeout_s", type=positive_float,
             help='seconds without a byte before a timeout (timeouts.idle_s)')
    add_flag(g, "--retries-max-attempts", "--max-attempts", dest="max_attempts", type=positive_int,
             help='attempts per record (retries.max_attempts)')
    p.add_argument("--set", action="append", metavar="KEY=JSON", default=[],
                   help="any setting by dotted key, value as JSON (or a bare string), e.g. sampling.stop='[\"END\"]'")
    p.add_argument("--reason", help="why (kept with the version and in the audit log)")
    p.set_defaults(func=handle_fix)

    for verb, helptext in (
        ("rederive", "read stored answers again under the run's current reading settings (no new request)"),
        ("rerun", "queue records to be generated again under the current config version (history kept)"),
    ):
        q = sub.add_parser(verb, help=helptext, description=helptext + ". Choose the records with exactly one of "
                           "--alarm, --check, --flag, --filter or --ids. --dry-run shows the preview only.")
        add_db_arg(q)
        q.add_argument("run", help="run name or id")
        q.add_argument("--alarm", type=int, metavar="ALARM_ID", help="the records this alarm names")
        q.add_argument("--check", help="records failing this check: any check of the run (built-in, verify_*, "
                       "user:*, rule:*, language, near_duplicate, judge; rederive: built-in checks only)")
        q.add_argument("--flag", choices=["good", "bad", "flagged", "unreviewed"], help="records with this flag")
        q.add_argument("--filter", metavar="QUERY",
                       help="a records-table filter as in its URL, e.g. 'status=ok&finish_reason=length'")
        q.add_argument("--ids", help="comma-separated record ids")
        q.add_argument("--dry-run", action="store_true", help="preview only: change nothing")
        q.add_argument("--yes", action="store_true", help="do not ask on a terminal")
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=handle_repair, verb=verb)

    r = sub.add_parser("repairs", help="a run's repairs (re-derive, re-run, undo); undo one",
                       description="Lists the run's repairs, newest first. --undo ID gives the records a re-derive "
                       "(or a re-run not generated yet) changed their earlier output back; nothing is deleted.")
    add_db_arg(r)
    r.add_argument("run", help="run name or id")
    r.add_argument("--undo", type=int, metavar="REPAIR_ID",
                   help='undo this repair (its records get their earlier results back)')
    r.add_argument("--json", action="store_true", help='print JSON')
    r.set_defaults(func=handle_repairs)

    v = sub.add_parser("versions", help="a run's config versions with their changes and record counts")
    add_db_arg(v)
    v.add_argument("run", help="run name or id")
    v.add_argument("--json", action="store_true", help='print JSON')
    v.set_defaults(func=handle_versions)

    a = sub.add_parser("autopause", help="turn a check's auto-pause off (with a reason) or back on for a run",
                       description="Acknowledging an alarm only snoozes it: its auto-pause fires again when new "
                       "records fail. Turning auto-pause off is this separate action, with a typed reason kept in "
                       "the audit log and shown on the run page while it holds.")
    add_db_arg(a)
    a.add_argument("run", help="run name or id")
    a.add_argument("check", help="check name, e.g. empty_reasoning")
    a.add_argument("state", choices=["on", "off"])
    a.add_argument("--reason", help="required for off")
    a.set_defaults(func=handle_autopause)


def _open(a: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    return open_run(a.db, a.run)


def _fix_changes(a: argparse.Namespace) -> dict[str, Any]:
    ch: dict[str, Any] = {}
    for key, value in (
        ("reasoning.mode", a.reasoning_mode), ("reasoning.think_open", a.think_open),
        ("reasoning.think_close", a.think_close), ("reasoning.prefilled_open", a.prefilled),
        ("reasoning.expect", a.expect), ("model", a.model), ("sampling.max_tokens", a.max_tokens),
        ("sampling.temperature", a.temperature), ("sampling.top_p", a.top_p), ("sampling.seed", a.seed),
        ("timeouts.connect_s", a.connect_timeout_s), ("timeouts.total_s", a.timeout_s),
        ("timeouts.idle_s", a.idle_timeout_s), ("retries.max_attempts", a.max_attempts),
    ):
        if value is not None:
            ch[key] = value
    if a.extra_body is not None:
        ch["sampling.extra_body"] = json_object_flag(a.extra_body, "--extra-body")
    if a.base_url:
        ch["endpoints"] = [{"base_url": u, **({"api_key_env": a.api_key_env} if a.api_key_env else {})}
                           for u in a.base_url]
    elif a.api_key_env:
        raise CliError("--api-key-env goes with --base-url (the endpoints are replaced as a whole)")
    for item in a.set:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--set {item!r}: expected KEY=VALUE, e.g. sampling.temperature=0.6")
        try:
            ch[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            ch[key.strip()] = raw
    return ch


def handle_fix(a: argparse.Namespace) -> int:
    from ..quality.detection import overrides  # noqa: F401  - registers the guard a new config version passes (#35)
    from ..store.versions import VersionError, change_settings

    engine, run = _open(a)
    changes = _fix_changes(a)
    try:
        res = change_settings(engine, int(run["id"]), changes, actor="cli", reason=a.reason)
    except VersionError as exc:
        raise CliError(str(exc)) from None
    out = sys.stdout
    from ..repair.settings_diff import lines

    print(f"run {run['name']!r}: config version {res['version']}", file=out)
    for c in res["changes"]:  # each changed value on its line; never a whole endpoint, TLS or header values
        for line in lines([c]):
            print(f"  {c['kind']:10} {line}", file=out)
    if any(c["kind"] == "reading" for c in res["changes"]):
        print("stored records keep their answers until re-derived: "
              f"`{hint('rederive', '--check', 'field_mismatch', run=run['name'], db=a.db)}` (or another --check, or "
              "--alarm ID)", file=out)
    return 0


def _selection(a: argparse.Namespace, engine: Any, run_id: int) -> Any:
    from ..repair.actions import RepairError, select

    ids = None
    if a.ids:
        try:
            ids = [int(x) for x in a.ids.replace(" ", "").split(",") if x]
        except ValueError:
            raise CliError(f"--ids: not a comma-separated list of whole numbers: {a.ids[:60]!r}") from None
    params = dict(parse_qsl(a.filter, keep_blank_values=False)) if a.filter else None
    try:
        with engine.connect() as conn:
            return select(conn, run_id, alarm_id=a.alarm, check=a.check, flag=a.flag, params=params, ids=ids)
    except RepairError as exc:
        raise CliError(str(exc)) from None


def handle_repair(a: argparse.Namespace) -> int:
    from ..repair.actions import RepairError, preview_rederive, preview_rerun, rederive_records, rerun_records

    engine, run = _open(a)
    run_id = int(run["id"])
    sel = _selection(a, engine, run_id)
    out = sys.stdout
    try:
        preview = preview_rederive(engine, run_id, sel) if a.verb == "rederive" else preview_rerun(engine, run_id, sel)
    except RepairError as exc:
        again = (f" ({hint('rerun', '--check', sel.check, run=run['name'], db=a.db)})"
                 if a.verb == "rederive" and sel.check is not None else "")
        raise CliError(f"{exc}{again}") from None
    if a.json and a.dry_run:
        print(json.dumps({"dry_run": True, **preview}, default=str), file=out)
        return 0
    if not a.json:
        _print_preview(a.verb, run, preview, out)
    if a.dry_run:
        return 0
    if a.verb == "rerun" and not preview["queued"]:  # nothing to do: no question, no repair row
        from ..repair.actions import nothing_to_rerun

        msg = nothing_to_rerun(preview["selected"])
        print(json.dumps({"queued": 0, "repair_id": None, "message": msg}) if a.json else msg, file=out)
        return 0
    if sys.stdin.isatty() and not a.yes:
        answer = input("apply? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing changed", file=out)
            return 1
    try:
        res = rederive_records(engine, run_id, sel, actor="cli") if a.verb == "rederive" \
            else rerun_records(engine, run_id, sel, actor="cli")
    except RepairError as exc:
        raise CliError(str(exc)) from None
    if a.json:
        print(json.dumps(res, default=str), file=out)
    elif a.verb == "rederive":
        print(f"re-derived {res['changed']:,} records (repair #{res['repair_id']}; undo: "
              f"{hint('repairs', '--undo', res['repair_id'], run=run['name'], db=a.db)})", file=out)
    elif res.get("repair_id") is None:  # the records changed between the preview and now
        print(res["message"], file=out)
    else:
        print(f"re-runs: {res['queued']:,} queued (repair #{res['repair_id']}); they are generated when the run "
              f"runs: {hint('run', '--name', run['name'], db=a.db)}", file=out)
    return 0


def _print_preview(verb: str, run: dict[str, Any], p: dict[str, Any], out: Any) -> None:
    print(f"run {run['name']!r}: {p['selection']}: {p['selected']:,} selected", file=out)
    if verb == "rederive":
        print(f"  under config version {p['config_version']} (reasoning.mode = {p['reading']['mode']}):"
              f" {p['changed']:,} change, {p['unchanged']:,} stay the same, {p['cannot']:,} cannot be re-derived",
              file=out)
        for why, n in p["cannot_why"].items():
            print(f"    {n:,}: {why}", file=out)
        for ex in p["examples"]:
            b, f = ex["before"], ex["after"]
            print(f"  record #{ex['record_id']}: reasoning {len(b['reasoning'] or '')} -> {len(f['reasoning'] or '')}"
                  f" chars (source {b['reasoning_source']} -> {f['reasoning_source']}); failing"
                  f" {','.join(b['failing']) or 'nothing'} -> {','.join(f['failing']) or 'nothing'}", file=out)
    else:
        print(f"  {p['queued']:,} would be queued again, {p['skipped']:,} skipped", file=out)
        for why, n in p["skipped_why"].items():
            print(f"    {n:,}: {why}", file=out)


def handle_repairs(a: argparse.Namespace) -> int:
    from ..repair.actions import RepairError
    from ..repair.history import list_repairs, undo

    engine, run = _open(a)
    out = sys.stdout
    if a.undo is not None:
        try:
            res = undo(engine, int(run["id"]), a.undo, actor="cli")
        except RepairError as exc:
            raise CliError(str(exc)) from None
        if a.json:
            print(json.dumps(res), file=out)
        else:
            print(f"undid repair #{res['undid']}: {res['restored']:,} records restored, {res['skipped']:,} left as "
                  f"they are{' (' + res['skipped_why'] + ')' if res['skipped_why'] else ''}", file=out)
        return 0
    with engine.connect() as conn:
        rows = list_repairs(conn, int(run["id"]))
    if a.json:
        print(json.dumps(rows, default=str), file=out)
        return 0
    if not rows:
        print(f"run {run['name']!r} has no repairs", file=out)
    for r in rows:
        undone = " (undone)" if r["undone_at"] else ""
        print(f"#{r['id']} {r['kind']}{undone} by {r['actor']}: {r['n_changed']:,} of {r['n_selected']:,} — "
              f"{r['selection']} [config v{r['config_version']}, {r['status']}]", file=out)
    return 0


def handle_versions(a: argparse.Namespace) -> int:
    from ..store.versions import list_versions

    engine, run = _open(a)
    with engine.connect() as conn:
        rows = list_versions(conn, int(run["id"]))
    out = sys.stdout
    if a.json:
        print(json.dumps(rows, default=str), file=out)
        return 0
    for v in rows:
        cur = " (current)" if v["version"] == run.get("config_version") else ""
        print(f"v{v['version']}{cur} by {v['actor']}: generated {v['generated']:,}, derived {v['derived']:,}"
              + (f" — {v['reason']}" if v["reason"] else ""), file=out)
        for c in v["changes"]:
            print(f"    {c['path']}: {json.dumps(c['old'])} -> {json.dumps(c['new'])}", file=out)
    return 0


def handle_autopause(a: argparse.Namespace) -> int:
    from ..quality.detection.alarms import OverrideError, set_auto_pause

    engine, run = _open(a)
    try:
        res = set_auto_pause(engine, int(run["id"]), a.check, a.state == "on", reason=a.reason, actor="cli")
    except OverrideError as exc:
        raise CliError(str(exc)) from None
    state = "on" if res["auto_pause"] else "off"
    print(f"run {run['name']!r}: auto-pause for {res['check']} is {state}"
          + ("" if res["changed"] else " (it already was)"), file=sys.stdout)
    return 0
