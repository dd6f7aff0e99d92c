"""Check settings saved as a new config version, and the checks recomputed over a whole run from its stored
records (``synthwatch checks RUN --recompute``, the checks page); the run's check rates."""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..capture.turns import load as load_turns
from ..check_catalog import BIT, CHECK_INFO, CHECK_NAMES, CheckSettings
from ..hints import command as hint
from ..store import queue as store
from . import verdicts
from .checks import ChecksConfigError, RecordChecker, RunContext, check_turns, parse_settings, view_from_row
from .detection import open_items, overrides  # noqa: F401  (overrides: registers the guard of config versions)
from .detection.alarms import AlarmKeeper, effective_rules, rules_for
from .token_checks import TokenJob, run_token_job, tokenizer_spec

log = logging.getLogger("synthwatch.checks")

# ------------------------------------------------------------------------------------ recompute

_RECORD_COLS = ("id, idx, status, reasoning, content, finish_reason, completion_tokens, reasoning_tokens, extra_json,"
                " model, system_fingerprint, prompt_json, finished_at, endpoint, turns_json")


def save_settings(engine: Engine, run_id: int, raw: dict[str, Any], actor: str = "cli", *,
                  reason: str | None = None) -> CheckSettings:
    """Validate and store a run's `[checks]` table in its config snapshot. A change that weakens detection needs
    ``reason`` (synthwatch.quality.detection.overrides); without one it raises ChecksConfigError naming each weakening."""
    from ..store.versions import VersionError, create_version

    settings = parse_settings(raw)
    with engine.connect() as conn, store.write_begin(conn):
        store.lock_run(conn, run_id)
        row = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).first()
        if row is None:
            raise store.NotFound(f"no run {run_id}")
        cfg = orjson.loads(row[0]) or {}
        old = parse_settings(cfg.get("checks") or {})
        before = {**effective_rules(old.rules), **rules_for(old.extended_names(), old.rules)}
        after = {**effective_rules(settings.rules), **rules_for(settings.extended_names(), settings.rules)}
        dropped = [n for n in before if n in after and before[n].auto_pause and not after[n].auto_pause]
        if dropped:
            # an off switch for the run's protection is its own action, with a reason on the record
            raise ChecksConfigError(
                f"turning auto-pause off ({', '.join(dropped)}) is a separate action with a reason: "
                f"`{hint('autopause', dropped[0], 'off', '--reason', 'why', run=str(run_id))}`, the run page's alarm banner, or "
                f"POST /api/runs/{run_id}/autopause")
        new_checks = settings.model_dump(mode="json", exclude_defaults=True)
        if cfg.get("checks") != new_checks:
            # settings are never overwritten: the change is the run's next config version
            try:
                create_version(conn, run_id, {**cfg, "checks": new_checks}, actor=actor,
                               reason=reason)
            except VersionError as exc:
                raise ChecksConfigError(str(exc)) from None
        store.add_event(conn, run_id, "check_settings", None, actor=actor)
    return settings


def recompute(engine: Engine, run_id: int, *, batch: int = 1000, use_tokenizer: bool = True) -> dict[str, Any]:
    """Re-run every check on every finished record of a run with its current settings.

    Rewrites check_flags / check_json, rebuilds check_stat (whole run and windows: the most
    recently finished records), and re-evaluates alarms (clears those that no longer fire, raises
    new ones; never auto-pauses). One pass in id order, batched write transactions."""
    with engine.connect() as conn:
        run = store.run_row(conn, run_id)
        conn.rollback()
    ctx = RunContext.from_config(run_id, run["name"], orjson.loads(run["config_json"] or "{}") or {})
    ctx.expects = bool(run["expects_reasoning"])
    checker = RecordChecker(ctx)
    rules = effective_rules(ctx.settings.rules)
    lt = None
    if use_tokenizer and ctx.tokenizer and ctx.tokenizer.get("name_or_path"):
        from ..tokens.tokenizer import TokenizerError, load_tokenizer

        try:
            lt = load_tokenizer(tokenizer_spec(ctx))
        except (TokenizerError, OSError, ValueError) as exc:
            log.warning("tokenizer checks skipped: %s", exc)
    totals: dict[str, list[Any]] = {n: [0, 0, None] for n in CHECK_NAMES}
    heaps: dict[str, list[tuple[float, int, bool]]] = {n: [] for n in CHECK_NAMES}
    details: dict[str, dict[str, Any]] = {}
    mismatch: set[str] = set()
    template_done = False
    ok_seen = 0
    last_id = 0
    n_records = 0
    t0 = time.time()
    while True:
        with engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT {_RECORD_COLS} FROM record WHERE run_id = :r AND id > :last"
                     " AND status IN ('ok', 'error', 'timeout') ORDER BY id LIMIT :n"),
                {"r": run_id, "last": last_id, "n": batch},
            ).mappings().all()
            conn.rollback()
        if not rows:
            break
        updates = []
        for row in rows:
            v = view_from_row(row)
            applied, failed, det = check_turns(checker, v, load_turns(row["turns_json"]))
            if v.status == "ok" and lt is not None:
                ok_seen += 1
                template = not template_done and bool(v.reasoning.strip()) \
                    and "template_drops_reasoning" not in ctx.settings.disabled
                count = ("token_count_mismatch" not in ctx.settings.disabled and v.completion_tokens is not None
                         and ok_seen % ctx.settings.token_sample_every == 0)
                if template or count:
                    template_done = template_done or template
                    job = TokenJob(v.record_id, v.prompt_messages(), v.reasoning, v.content, v.completion_tokens,
                                   template, count)
                    try:
                        results = run_token_job(lt, job)
                    except Exception as exc:  # one unrenderable record must not stop the recompute
                        log.warning("tokenizer check of record %d failed: %s", v.record_id, exc)
                        results = []
                    for _rid, name, bad, d in results:
                        applied |= BIT[name]
                        if bad:
                            failed |= BIT[name]
                            det[name] = d
            fin = row["finished_at"] or 0.0
            for name in CHECK_NAMES:
                b = BIT[name]
                if not applied & b:
                    continue
                tot = totals[name]
                tot[1] += 1
                bad = bool(failed & b)
                if bad:
                    tot[0] += 1
                    tot[2] = v.record_id
                    details[name] = {**det.get(name, {}), "record_id": v.record_id}
                h = heaps[name]
                item = (fin, v.record_id, bad)
                if len(h) < rules[name].window:
                    heapq.heappush(h, item)
                elif item > h[0]:
                    heapq.heapreplace(h, item)
            if det.get("field_mismatch"):
                mismatch.update(det["field_mismatch"].get("fields") or ())
            updates.append({"f": failed, "j": orjson.dumps(det).decode() if det else None, "i": v.record_id})
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("UPDATE record SET check_flags = :f, check_json = :j WHERE id = :i"), updates)
        n_records += len(rows)
        last_id = rows[-1]["id"]
    t = time.time()
    windows = {n: (sum(1 for x in heaps[n] if x[2]), len(heaps[n])) for n in CHECK_NAMES}
    if "field_mismatch" in details:
        details["field_mismatch"] = {**details["field_mismatch"], "fields": sorted(mismatch), "mode": ctx.mode}
    run_stats = {n: (v[0], v[1], v[2]) for n, v in totals.items()}
    keeper = AlarmKeeper(run_id, ctx.name, None, ctx.settings.webhook.dashboard_url)
    with engine.connect() as conn, store.write_begin(conn):
        # the built-in checks' rows only: the extended checks' are recounted from their verdicts (extended.recheck)
        names = ", ".join(f"'{n}'" for n in CHECK_NAMES)
        conn.execute(text(f"DELETE FROM check_stat WHERE run_id = :r AND check_name IN ({names})"), {"r": run_id})
        stat_rows = [{"r": run_id, "c": n, "f": v[0], "n": v[1], "wf": windows[n][0], "wn": windows[n][1],
                      "ex": v[2], "t": t} for n, v in totals.items() if v[1]]
        if stat_rows:
            conn.execute(
                text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                     " example_record_id, updated_at) VALUES (:r, :c, :f, :n, :wf, :wn, :ex, :t)"), stat_rows)
        raised = keeper.evaluate(conn, t, rules, windows, run_stats, details, allow_pause=False, clear_sticky=True)
        open_items.sync(conn, run_id, t=t, actor="checks")  # re-checked records may open or close an open item
        store.add_event(conn, run_id, "recompute_checks", n_records, actor="checks")
    return {
        "run_id": run_id, "records": n_records, "seconds": round(time.time() - t0, 3), "raised": raised,
        "active_alarms": sorted(keeper.active),
        "checks": {n: {"fail": v[0], "total": v[1], "window_fail": windows[n][0], "window_total": windows[n][1]}
                   for n, v in totals.items()},
    }


def check_rates(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """check_stat rows of a run in CHECK_NAMES order, with rates (one small indexed query)."""
    rows = {r["check_name"]: dict(r) for r in conn.execute(
        text("SELECT check_name, n_fail, n_total, win_fail, win_total, example_record_id, updated_at"
             " FROM check_stat WHERE run_id = :r"), {"r": run_id},
    ).mappings()}
    out = []
    for name in CHECK_NAMES:
        r = rows.get(name) or {"check_name": name, "n_fail": 0, "n_total": 0, "win_fail": 0, "win_total": 0,
                               "example_record_id": None, "updated_at": None}
        r["rate"] = r["n_fail"] / r["n_total"] if r["n_total"] else None
        r["win_rate"] = r["win_fail"] / r["win_total"] if r["win_total"] else None
        r["description"] = CHECK_INFO[name]
        out.append(r)
    # the run's extended checks (#30), after the built-ins, with their verdicts' states (errors, pending)
    cfg = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar()
    if "judge" in rows:  # a judge model's verdicts (synthwatch.workers.judge keeps its check_stat row)
        j = rows["judge"]
        j.update(rate=j["n_fail"] / j["n_total"] if j["n_total"] else None,
                 win_rate=j["win_fail"] / j["win_total"] if j["win_total"] else None, extended=True,
                 description="a judge model says bad (its label is a bad label, or its score is below min_score)",
                 n_error=verdicts.state_counts(conn, run_id).get("judge", {}).get("error", 0))
        out.append(j)
    try:
        settings = parse_settings((orjson.loads(cfg or "{}") or {}).get("checks") or {})
    except (orjson.JSONDecodeError, ChecksConfigError, AttributeError):
        return out
    info = settings.extended_info()
    if not info:
        return out
    states = verdicts.state_counts(conn, run_id)
    for name, words in info.items():
        r = rows.get(name) or {"check_name": name, "n_fail": 0, "n_total": 0, "win_fail": 0, "win_total": 0,
                               "example_record_id": None, "updated_at": None}
        r["rate"] = r["n_fail"] / r["n_total"] if r["n_total"] else None
        r["win_rate"] = r["win_fail"] / r["win_total"] if r["win_total"] else None
        r["description"] = words
        r["extended"] = True
        r["n_error"] = states.get(name, {}).get("error", 0)
        out.append(r)
    return out
