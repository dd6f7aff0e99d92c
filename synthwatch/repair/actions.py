"""Repairs: re-derive stored answers under the run's current reading settings, or queue records to run again.

Both work on a selection (the records an alarm names, a check, a flag, any records-table filter, or ids),
always show a preview first (:func:`preview_rederive`, :func:`preview_rerun`), and never destroy data: a
record's output is copied whole into ``record_history`` before a repair replaces it (append-only; the
record's ``revision`` counts the copies), and every repair is a ``repair`` row with who, when and what was
selected, also in the audit log. A re-derive can be undone (:func:`undo`), which is itself a repair.

Re-derive reads the answer again from what was stored of the server's reply, with no new request: the text
of every reasoning field the server sent (the one read, ``unread_fields`` and ``duplicate_fields``) and the
content as sent (``raw_content`` when the reading split think tags off it). It then runs the per-record checks
again. Checks that compare a record with others (duplicate_output, server_drift) or need the tokenizer keep
their earlier result: ``synthwatch checks RUN --recompute`` re-scans the whole run for those.

Writes go in short transactions of :data:`CHUNK` records on the caller's (write) engine, so workers and
the dashboard keep going while 100,000 records are repaired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..capture.reasoning import REASONING_FIELDS, rederive
from ..capture.turns import load as load_turns
from ..check_catalog import BIT, CHECK_NAMES
from ..quality.checks import RecordChecker, RunContext, applied_bits, check_turns, view_from_row
from ..quality.detection import open_items, recent_windows
from ..quality.detection.alarms import AlarmKeeper, effective_rules
from ..quality.selection import BUILTIN, UnknownCheck, catalogue, check_is, record_ids
from ..review.filters import Filters, ReviewError, failed_checks, resolve
from ..review.flags import max_record_id
from ..review.queries import Cursor, select_ids
from ..store import queue as store
from ..store import search_index
from ..store.models import FINISHED_STATUSES

log = logging.getLogger("synthwatch.repair")

CHUNK = 500
# checks whose result depends on other records or on the tokenizer: a re-derive keeps their earlier result
KEPT_CHECKS = ("duplicate_output", "server_drift", "token_count_mismatch", "template_drops_reasoning")
_KEPT_MASK = sum(BIT[n] for n in KEPT_CHECKS)
OUTPUT_COLS = (
    "status", "reasoning", "content", "content_null", "reasoning_source", "reasoning_len", "content_len",
    "finish_reason", "prompt_tokens", "completion_tokens", "reasoning_tokens", "reasoning_tokens_source",
    "usage_json", "token_ids_json", "latency_s", "ttft_s", "n_chunks", "attempts", "attempts_json", "error_kind", "error", "endpoint", "model",
    "system_fingerprint", "response_id", "extra_json", "finished_at", "check_flags", "check_json", "gen_version",
    "derive_version", "turns_json", "turns_done", "billed_prompt_tokens", "billed_completion_tokens", "billed_estimated",
    "logprobs_json",
)
_COLS = ", ".join(OUTPUT_COLS)


class RepairError(ValueError):
    """A repair that cannot be made as asked; the message says why."""


# ------------------------------------------------------------------------------------------ selection


@dataclass(frozen=True, slots=True)
class Selection:
    """Which records a repair works on: a records-table filter (or explicit ids), pinned to ids <= max_id."""

    description: str
    filters: Filters
    max_id: int
    ids: tuple[int, ...] | None = None
    check: str | None = None
    """The check that chose the records (--check), canonical; with its kind in the run's catalogue."""
    check_kind: str | None = None

    def as_json(self) -> str:
        return orjson.dumps({"description": self.description, "filters": self.filters.params(),
                             "ids": list(self.ids) if self.ids is not None else None,
                             "max_id": self.max_id}).decode()


def select(conn: Connection, run_id: int, *, alarm_id: int | None = None, check: str | None = None,
           flag: str | None = None, params: dict[str, Any] | None = None, ids: list[int] | None = None) -> Selection:
    """Build a selection from exactly one way of choosing; bad input raises RepairError naming it."""
    given = [k for k, v in (("alarm", alarm_id), ("check", check), ("flag", flag), ("filter", params),
                            ("ids", ids)) if v]
    if len(given) != 1:
        raise RepairError("choose the records one way: an alarm, a check, a flag, a records filter or ids"
                          + (f" (got {', '.join(given)})" if given else ""))
    max_id = max_record_id(conn, run_id)
    try:
        if alarm_id is not None:
            row = conn.execute(text("SELECT rule, title FROM alarm WHERE id = :a AND run_id = :r"),
                               {"a": alarm_id, "r": run_id}).first()
            if row is None:
                raise RepairError(f"run {run_id} has no alarm {alarm_id}")
            if row[0] in ("timeout", "error"):
                f = Filters(status=row[0])
            else:  # any check of the run's catalogue: built-in, verifier, rule, user, language, judge (#38)
                failing = _failing(conn, run_id, row[0], max_id)
                return replace(failing, description=f"records named by alarm #{alarm_id} ({row[1]})")
            return Selection(f"records named by alarm #{alarm_id} ({row[1]})", f, max_id)
        if check is not None:
            return _failing(conn, run_id, check, max_id)
        if flag is not None:
            return Selection(f"records flagged {flag}", Filters.from_params({"flag": flag}), max_id)
        if params is not None:
            f = resolve(conn, run_id, Filters.from_params(params))
            desc = ", ".join(f"{k}={v}" for k, v in f.params().items() if k not in ("sort", "order")) or "all records"
            return Selection(f"records matching {desc}", f, max_id)
    except ReviewError as exc:
        raise RepairError(str(exc)) from None
    assert ids is not None
    clean = sorted({int(i) for i in ids})
    if len(clean) > 1_000_000:
        raise RepairError("at most 1,000,000 ids at a time")
    return Selection(f"{len(clean):,} chosen record{'' if len(clean) == 1 else 's'}", Filters(), max_id,
                     tuple(clean))


def _failing(conn: Connection, run_id: int, check: str, max_id: int) -> Selection:
    """The records failing any check of the run's catalogue (#38): a built-in check by its bit (the records-table
    filter), any other by its verdict in force (their ids, pinned here)."""
    cat = catalogue(conn, run_id)
    try:
        entry = cat.entry(check, "--check")
    except UnknownCheck as exc:
        raise RepairError(str(exc)) from None
    if entry.kind == BUILTIN:
        return Selection(f"records failing {entry.name}", Filters.from_params({"check": entry.name}), max_id,
                         check=entry.name, check_kind=entry.kind)
    ids = record_ids(conn, run_id, check_is(cat, entry.name), max_id=max_id)
    return Selection(f"records failing {entry.name}", Filters(), max_id, tuple(ids), check=entry.name,
                     check_kind=entry.kind)


def rederive_applies(sel: Selection) -> None:
    """A re-derive reads stored answers again and re-runs the built-in checks on them; it does not recompute
    the verdicts of the other checks, so records chosen by one of those are refused (RepairError says what to do)."""
    if sel.check is not None and sel.check_kind not in (None, BUILTIN):
        raise RepairError(
            f"a re-derive cannot choose records by {sel.check}: it reads the stored answers again and re-runs the "
            f"built-in checks only, and {sel.check} is a {sel.check_kind} check whose verdicts it does not "
            "recompute. Re-run those records instead (rerun with the same --check), or choose them by a built-in "
            "check, a filter or ids")


def iter_ids(engine: Engine, run_id: int, sel: Selection, chunk: int = CHUNK) -> Iterator[list[int]]:
    """The selection's record ids, `chunk` at a time, oldest first."""
    if sel.ids is not None:
        for i in range(0, len(sel.ids), chunk):
            part = list(sel.ids[i:i + chunk])
            with engine.connect() as conn:
                yield [r[0] for r in conn.execute(text(
                    f"SELECT id FROM record WHERE run_id = :r AND id IN ({','.join(map(str, part))}) ORDER BY id"),
                    {"r": run_id})]
        return
    f = replace(sel.filters, sort="id", order="asc")
    after: Cursor | None = None
    while True:
        with engine.connect() as conn:
            ids = select_ids(conn, run_id, f, after=after, limit=chunk, max_id=sel.max_id)
            conn.rollback()
        if not ids:
            return
        yield ids
        after = Cursor(None, ids[-1])


# what reading an answer again and checking it need (not usage, token ids, attempts: read once, kept as they are)
# every column derive() returns is read: comparing a re-derived record with its row needs them all (a record
# already right raised KeyError 'reasoning_len' here, found by tests/test_alarm_state_machine.py)
_READ_COLS = ("id, idx, run_id, revision, rerun, prompt_json, status, reasoning, content, content_null,"
              " reasoning_source, reasoning_len, content_len, finish_reason, completion_tokens, reasoning_tokens, extra_json, model,"
              " system_fingerprint, endpoint, error_kind, check_flags, check_json, derive_version, turns_json,"
              " turns_done")


def record_rows(conn: Connection, ids: list[int]) -> list[dict[str, Any]]:
    if not ids:
        return []
    return [dict(r) for r in conn.execute(text(
        f"SELECT {_READ_COLS} FROM record WHERE id IN ({','.join(str(int(i)) for i in ids)}) ORDER BY id")).mappings()]


# ------------------------------------------------------------------------------------------ re-derive


class NotDerivable(Exception):
    pass


def sent_answer(row: dict[str, Any]) -> tuple[dict[str, str], str]:
    """(reasoning field texts, content as sent) from what a record stored; NotDerivable says why not."""
    if row["status"] not in FINISHED_STATUSES:
        raise NotDerivable(f"the record is {row['status']}: it has no answer yet")
    extra: dict[str, Any] = {}
    if row["extra_json"]:
        try:
            loaded = orjson.loads(row["extra_json"])
            extra = loaded if isinstance(loaded, dict) else {}
        except orjson.JSONDecodeError:
            raise NotDerivable("its stored raw fields are not readable JSON") from None
    if row["reasoning"] is None and row["content"] is None and not extra.get("unread_fields"):
        why = f" ({row['error_kind']})" if row.get("error_kind") else ""
        raise NotDerivable(f"no answer was stored{why}: run it again instead")
    reasoning = row["reasoning"] or ""
    source = row["reasoning_source"] or "none"
    texts: dict[str, str] = {}
    if source in REASONING_FIELDS and reasoning:
        texts[source] = reasoning
    for name in extra.get("duplicate_fields") or ():
        if name in REASONING_FIELDS and reasoning:
            texts[name] = reasoning
    for name, value in (extra.get("unread_fields") or {}).items():
        if name in REASONING_FIELDS and isinstance(value, str):
            texts[name] = value
    raw = extra.get("raw_content")
    if isinstance(raw, str):
        return texts, raw
    split = source in ("inline", "inline-no-open") or "inline" in (extra.get("duplicate_fields") or ())
    if split:
        raise NotDerivable("the content as sent (before its think tags were split off) was not kept for this "
                           "record (stored before synthwatch kept it): run it again instead")
    return texts, row["content"] or ""


@dataclass
class ReadingSettings:
    mode: str = "auto"
    think_open: str = "<think>"
    think_close: str = "</think>"
    prefilled_open: bool = False
    expect: bool = True

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> ReadingSettings:
        r = cfg.get("reasoning") or {}
        return cls(str(r.get("mode") or "auto"), r.get("think_open", "<think>") or "",
                   r.get("think_close", "</think>") or "", bool(r.get("prefilled_open", False)),
                   bool(r.get("expect", True)))


def derive(row: dict[str, Any], rs: ReadingSettings) -> dict[str, Any]:
    """The record's derived columns under `rs` (reasoning, content, source, lengths, extra_json)."""
    texts, content = sent_answer(row)
    reasoning, new_content, source, unread, dups = rederive(
        texts, content, row["finish_reason"], rs.mode, rs.think_open, rs.think_close, rs.prefilled_open)
    extra: dict[str, Any] = {}
    if row["extra_json"]:
        loaded = orjson.loads(row["extra_json"])
        extra = loaded if isinstance(loaded, dict) else {}
    for key in ("unread_fields", "duplicate_fields", "raw_content"):
        extra.pop(key, None)
    if unread:
        extra["unread_fields"] = unread
    if dups:
        extra["duplicate_fields"] = dups
    if new_content != content:
        extra["raw_content"] = content
    was_null = bool(row["content_null"])
    return {
        "reasoning": reasoning, "content": None if was_null and not new_content else new_content,
        "reasoning_source": source, "reasoning_len": len(reasoning), "content_len": len(new_content),
        "extra_json": orjson.dumps(extra, option=orjson.OPT_NON_STR_KEYS).decode() if extra else None,
    }


def derive_turns(row: dict[str, Any], rs: ReadingSettings) -> str | None:
    """A conversation's earlier turns (synthwatch.capture.turns) re-derived like its last one: each stored turn is read
    again from its own answer as sent. Unchanged turns give back the stored text itself."""
    turns = load_turns(row.get("turns_json"))
    if not turns:
        return row.get("turns_json")
    out = []
    for i, turn in enumerate(turns):
        try:
            cols = derive({**turn, "status": "ok"}, rs)
        except NotDerivable as exc:
            raise NotDerivable(f"turn {i + 1}: {exc}") from None
        out.append({**turn, **cols})
    if out == turns:
        return row.get("turns_json")
    return orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS).decode()


class _Rechecker:
    """The per-record checks under the run's current settings, keeping the cross-record checks' results."""

    def __init__(self, run_id: int, name: str, cfg: dict[str, Any]) -> None:
        self.ctx = RunContext.from_config(run_id, name, cfg)
        self.checker = RecordChecker(self.ctx)

    def check(self, row: dict[str, Any]) -> tuple[int, str | None]:
        applied, failed, det = check_turns(self.checker, view_from_row(row), load_turns(row.get("turns_json")))
        old_flags = row["check_flags"] or 0
        old_det: dict[str, Any] = {}
        if row["check_json"]:
            try:
                old_det = orjson.loads(row["check_json"]) or {}
            except orjson.JSONDecodeError:
                old_det = {}
        flags = (failed & ~_KEPT_MASK) | (old_flags & _KEPT_MASK)
        merged = {k: v for k, v in det.items() if not BIT.get(k, 0) & _KEPT_MASK}
        merged.update({k: v for k, v in old_det.items() if k in KEPT_CHECKS and flags & BIT[k]})
        return flags, (orjson.dumps(merged).decode() if merged else None)


def run_info(conn: Connection, run_id: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    run = store.run_row(conn, run_id)
    cfg = orjson.loads(run["config_json"] or "{}") or {}
    return run, cfg, int(run.get("config_version") or 1)


def _changes(engine: Engine, run_id: int, sel: Selection, *,
             on_chunk: Callable[[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]], dict[str, str]],
                                None], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Walk the selection; for each chunk call on_chunk(rows, [(row, new columns)], {id: why not}).

    ``config``: read under these settings instead of the current version's (a preview of a proposed version)."""
    with engine.connect() as conn:
        run, cfg, version = run_info(conn, run_id)
        conn.rollback()
    if config is not None:
        cfg, version = config, version + 1
    rs = ReadingSettings.of(cfg)
    rechecker = _Rechecker(run_id, run["name"], cfg)
    totals = {"selected": 0, "changed": 0, "unchanged": 0, "cannot": 0}
    reasons: dict[str, int] = {}
    for ids in iter_ids(engine, run_id, sel):
        with engine.connect() as conn:
            rows = record_rows(conn, ids)
            conn.rollback()
        changed: list[tuple[dict[str, Any], dict[str, Any]]] = []
        cannot: dict[str, str] = {}
        for row in rows:
            totals["selected"] += 1
            try:
                cols = derive(row, rs)
                cols["turns_json"] = derive_turns(row, rs)
            except NotDerivable as exc:
                cannot[str(row["id"])] = str(exc)
                reasons[str(exc)] = reasons.get(str(exc), 0) + 1
                totals["cannot"] += 1
                continue
            after = {**row, **cols}
            cols["check_flags"], cols["check_json"] = rechecker.check(after)
            if all(row[k] == v for k, v in cols.items()):
                totals["unchanged"] += 1
                if row["derive_version"] != version:
                    changed.append((row, {"derive_version": version}))  # same answer, now read under `version`
                continue
            cols["derive_version"] = version
            totals["changed"] += 1
            changed.append((row, cols))
        on_chunk(rows, changed, cannot)
    return {**totals, "cannot_why": reasons, "config_version": version, "reading": rs.__dict__}


def preview_rederive(engine: Engine, run_id: int, sel: Selection, *, examples: int = 5,
                     config: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a re-derive would do: counts, why some cannot be re-derived, and before/after for a few records
    (under ``config``, a proposed next version, when given)."""
    rederive_applies(sel)
    shown: list[dict[str, Any]] = []
    cannot_examples: list[dict[str, Any]] = []

    def look(record_rows: list[dict[str, Any]], changed: list[tuple[dict[str, Any], dict[str, Any]]],
             cannot: dict[str, str]) -> None:
        for row, cols in changed:
            if len(shown) < examples and set(cols) != {"derive_version"}:
                shown.append(_example(row, cols))
        for rid, why in cannot.items():
            if len(cannot_examples) < examples:
                cannot_examples.append({"record_id": int(rid), "why": why})

    out = _changes(engine, run_id, sel, on_chunk=look, config=config)
    out.update(selection=sel.description, examples=shown, cannot_examples=cannot_examples,
               max_id=sel.max_id)
    return out


def _clip(v: Any, n: int = 300) -> Any:
    return v[:n] + "…" if isinstance(v, str) and len(v) > n else v


def _example(row: dict[str, Any], cols: dict[str, Any]) -> dict[str, Any]:
    before = {k: _clip(row[k]) for k in ("reasoning", "content", "reasoning_source")}
    after = {k: _clip(cols.get(k, row[k])) for k in ("reasoning", "content", "reasoning_source")}
    before["failing"] = failed_checks(row["check_flags"])
    after["failing"] = failed_checks(cols.get("check_flags", row["check_flags"]))
    return {"record_id": row["id"], "idx": row["idx"], "before": before, "after": after}


def start_repair(conn: Connection, run_id: int, kind: str, sel: Selection, version: int, actor: str,
                  undo_of: int | None = None) -> int:
    return int(conn.execute(text(
        "INSERT INTO repair (run_id, kind, t, actor, selection, config_version, n_selected, n_changed, n_skipped,"
        " status, undo_of) VALUES (:r, :k, :t, :a, :s, :v, 0, 0, 0, 'running', :u) RETURNING id"),
        {"r": run_id, "k": kind, "t": time.time(), "a": actor, "s": sel.as_json(), "v": version, "u": undo_of},
    ).scalar_one())


def copy_to_history(conn: Connection, ids: list[int], action: str, repair_id: int, t: float) -> None:
    for chunk in store.int_lists(ids):
        conn.execute(text(
            f"INSERT INTO record_history (run_id, record_id, revision, t, action, repair_id, {_COLS})"
            f" SELECT run_id, id, revision, :t, :a, :rep, {_COLS} FROM record WHERE id IN ({chunk})"),
            {"t": t, "a": action, "rep": repair_id})


def _bump(conn: Connection, run_id: int) -> None:
    conn.execute(text("UPDATE run SET repair_seq = repair_seq + 1, updated_at = :t WHERE id = :r"),
                 {"t": time.time(), "r": run_id})


_DERIVED = ("reasoning", "content", "reasoning_source", "reasoning_len", "content_len", "extra_json", "check_flags",
            "check_json", "derive_version", "turns_json")
_REDERIVE_UPDATE = (f"UPDATE record SET {', '.join(c + ' = {m}' for c in _DERIVED)}, revision = revision + 1"
                    " WHERE id = {m}")


def rederive_records(engine: Engine, run_id: int, sel: Selection, *, actor: str = "cli",
                     progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Re-derive the selection under the run's current reading settings; returns the repair's summary."""
    rederive_applies(sel)
    with engine.connect() as conn, store.write_begin(conn):
        _run, _cfg, version = run_info(conn, run_id)
        repair_id = start_repair(conn, run_id, "rederive", sel, version, actor)
    deltas = dict.fromkeys(CHECK_NAMES, 0)
    written = {"n": 0}

    def write(record_rows: list[dict[str, Any]], changed: list[tuple[dict[str, Any], dict[str, Any]]],
              _cannot: dict[str, str]) -> None:
        if not changed:
            return
        t = time.time()
        with engine.connect() as conn, store.write_begin(conn):
            store.lock_run(conn, run_id)  # workers and other repairs take it first too: nothing moves under us
            now = {r[0]: (r[1], r[2]) for chunk in store.int_lists([row["id"] for row, _ in changed])
                   for r in conn.execute(text(f"SELECT id, revision, status FROM record WHERE id IN ({chunk})"))}
            # a record changed since it was read (re-run, another repair) is left as it is now
            good = [(row, cols) for row, cols in changed if now.get(row["id"]) == (row["revision"], row["status"])]
            real = [(row, cols) for row, cols in good if len(cols) > 1]
            same = [row["id"] for row, cols in good if len(cols) == 1]
            ids = [row["id"] for row, _ in real]
            copy_to_history(conn, ids, "rederive", repair_id, t)
            search_index.unindex(conn, ids)
            if real:
                # positional parameters through the driver: SQLAlchemy's named-parameter processing cost ~30 us a row
                mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
                conn.exec_driver_sql(_REDERIVE_UPDATE.format(m=mark),
                                     [(*(cols[c] for c in _DERIVED), row["id"]) for row, cols in real])
            if same:
                conn.execute(text("UPDATE record SET derive_version = :v WHERE id = :id"),
                             [{"v": version, "id": i} for i in same])
            search_index.enqueue(conn, ids)
        for row, cols in real:
            old, new = row["check_flags"] or 0, cols["check_flags"]
            if old != new:
                for name in CHECK_NAMES:
                    b = BIT[name]
                    deltas[name] += bool(new & b) - bool(old & b)
        written["n"] += len(real)
        if progress is not None:
            progress({"written": written["n"]})

    try:
        out = _changes(engine, run_id, sel, on_chunk=write)
    except Exception as exc:
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("UPDATE repair SET status = 'failed', summary_json = :s WHERE id = :i"),
                         {"s": orjson.dumps({"error": f"{exc.__class__.__name__}: {exc}"[:2000]}).decode(),
                          "i": repair_id})
        raise
    out["changed"] = written["n"]
    finish(engine, run_id, repair_id, "rederive", out, deltas, actor)
    out["repair_id"] = repair_id
    return out


def finish(engine: Engine, run_id: int, repair_id: int, kind: str, out: dict[str, Any], fail_deltas: dict[str, int],
            actor: str, total_deltas: dict[str, int] | None = None) -> None:
    """Whole-run check counts, rolling windows and alarms after a repair; the repair row and the audit log."""
    with engine.connect() as conn, store.write_begin(conn):
        store.lock_run(conn, run_id)
        run, cfg, _v = run_info(conn, run_id)
        for name in CHECK_NAMES:
            df, dn = fail_deltas.get(name, 0), (total_deltas or {}).get(name, 0)
            if df or dn:
                conn.execute(text(
                    "UPDATE check_stat SET n_fail = MAX(0, n_fail + :df), n_total = MAX(0, n_total + :dn),"
                    " updated_at = :t WHERE run_id = :r AND check_name = :c".replace(
                        "MAX(", "GREATEST(" if store.is_pg(conn) else "MAX(")),
                    {"df": df, "dn": dn, "t": time.time(), "r": run_id, "c": name})
        ctx = RunContext.from_config(run_id, run["name"], cfg)
        rules = effective_rules(ctx.settings.rules)
        windows = recent_windows(conn, run_id, RecordChecker(ctx), rules)
        for name, w in windows.items():
            conn.execute(text("UPDATE check_stat SET win_fail = :f, win_total = :n WHERE run_id = :r"
                              " AND check_name = :c"), {"f": w.fail, "n": w.total, "r": run_id, "c": name})
        run_stats = {name: (nf, nt, ex) for name, nf, nt, ex in conn.execute(
            text("SELECT check_name, n_fail, n_total, example_record_id FROM check_stat WHERE run_id = :r"),
            {"r": run_id})}
        keeper = AlarmKeeper(run_id, run["name"], None, ctx.settings.webhook.dashboard_url)
        keeper.evaluate(conn, time.time(), rules, {n: (w.fail, w.total) for n, w in windows.items()}, run_stats, {},
                        allow_pause=False, clear_sticky=True)
        open_items.sync(conn, run_id, actor=actor)  # records repaired (or queued again) may close an open item
        summary = {k: v for k, v in out.items() if k not in ("examples", "cannot_examples")}
        conn.execute(text(
            "UPDATE repair SET status = 'done', n_selected = :n, n_changed = :c, n_skipped = :s, summary_json = :j"
            " WHERE id = :i"),
            {"n": out.get("selected", 0), "c": out.get("changed", 0), "s": out.get("cannot", 0),
             "j": orjson.dumps(summary).decode(), "i": repair_id})
        _bump(conn, run_id)
        store.add_event(conn, run_id, kind, repair_id, actor=actor,
                        detail=f"{out.get('changed', 0):,} of {out.get('selected', 0):,} selected records"
                               f" ({out.get('selection') or ''})"[:2000])


# ------------------------------------------------------------------------------------------ re-run


def preview_rerun(engine: Engine, run_id: int, sel: Selection) -> dict[str, Any]:
    """How many selected records would be queued again (finished ones), and how many are skipped and why."""
    counts = {"selected": 0, "queued": 0, "skipped": 0}
    why: dict[str, int] = {}
    for ids in iter_ids(engine, run_id, sel):
        with engine.connect() as conn:
            for status, rerun in conn.execute(text(
                    f"SELECT status, rerun FROM record WHERE id IN ({','.join(map(str, ids))})")):
                counts["selected"] += 1
                if status in FINISHED_STATUSES and not rerun:
                    counts["queued"] += 1
                else:
                    counts["skipped"] += 1
                    reason = "already queued again" if rerun else f"the record is {status}"
                    why[reason] = why.get(reason, 0) + 1
            conn.rollback()
    return {**counts, "skipped_why": why, "selection": sel.description, "max_id": sel.max_id}


def nothing_to_rerun(selected: int) -> str:
    return (f"nothing to re-run: {selected:,} records selected, none of them finished and not already queued again"
            " (no repair was recorded)")


def rerun_records(engine: Engine, run_id: int, sel: Selection, *, actor: str = "cli") -> dict[str, Any]:
    """Queue the selection's finished records to be generated again under the current config version.

    Each one's output and attempts move to its history first; the run's counters move them from ok / error /
    timeout back to pending (so the cap counts their new answer, once) and count them in n_rerun."""
    with engine.connect() as conn, store.write_begin(conn):
        run, _cfg, version = run_info(conn, run_id)
        if run["kind"] != "generate":
            raise RepairError(f"run {run['name']!r} is a {run['kind']} run: its records were not generated here,"
                              " so they cannot be run again (re-derive works on them)")
    # the repair row is written with the first record queued: a selection with nothing to re-run leaves no row (#26)
    repair_id: int | None = None
    expects = bool(run["expects_reasoning"])
    fail_d = dict.fromkeys(CHECK_NAMES, 0)
    total_d = dict.fromkeys(CHECK_NAMES, 0)
    counts = {"selected": 0, "queued": 0, "skipped": 0}
    for ids in iter_ids(engine, run_id, sel):
        counts["selected"] += len(ids)
        t = time.time()
        with engine.connect() as conn, store.write_begin(conn):
            store.lock_run(conn, run_id)
            rows = conn.execute(text(
                f"SELECT id, status, check_flags, reasoning_tokens, turns_done FROM record WHERE id IN"
                f" ({','.join(map(str, ids))}) AND status IN ('ok', 'error', 'timeout') AND rerun = 0")).all()
            mine = [r[0] for r in rows]
            counts["skipped"] += len(ids) - len(mine)
            if not mine:
                continue
            if repair_id is None:
                repair_id = start_repair(conn, run_id, "rerun", sel, version, actor)
            copy_to_history(conn, mine, "rerun", repair_id, t)
            search_index.unindex(conn, mine)
            by = {"ok": 0, "error": 0, "timeout": 0}
            turns_undone = 0
            for _id, status, flags, rtok, done in rows:
                by[status] += 1
                turns_undone += done or 0
                applied = applied_bits(status, rtok, expects)
                for name in CHECK_NAMES:
                    b = BIT[name]
                    fail_d[name] -= bool((flags or 0) & b)
                    total_d[name] -= bool(applied & b)
            for chunk in store.int_lists(mine):
                conn.execute(text(
                    "UPDATE record SET status = 'pending', rerun = 1, revision = revision + 1, rnd = :rnd,"
                    " reasoning = NULL, content = NULL, content_null = false, reasoning_source = NULL,"
                    " reasoning_len = NULL, content_len = NULL, finish_reason = NULL, prompt_tokens = NULL,"
                    " completion_tokens = NULL, reasoning_tokens = NULL, reasoning_tokens_source = NULL, usage_json = NULL,"
                    " billed_prompt_tokens = NULL, billed_completion_tokens = NULL, billed_estimated = NULL, token_ids_json = NULL,"
                    " latency_s = NULL, ttft_s = NULL, n_chunks = NULL, attempts = 0, attempts_json = NULL,"
                    " error_kind = NULL, error = NULL, endpoint = NULL, model = NULL, system_fingerprint = NULL,"
                    " response_id = NULL, extra_json = NULL, logprobs_json = NULL, finished_at = NULL, check_flags = 0,"
                    " check_json = NULL, turns_json = NULL, turns_done = 0, worker_id = NULL, lease_until = NULL, claimed_at = NULL"
                    f" WHERE id IN ({chunk})"), {"rnd": store.PENDING_RND})
            conn.execute(text(
                "UPDATE run SET n_ok = n_ok - :ok, n_error = n_error - :err, n_timeout = n_timeout - :to,"
                " n_pending = n_pending + :k, n_rerun = n_rerun + :k, n_turns_done = n_turns_done - :td,"
                " updated_at = :t WHERE id = :r"),
                {"ok": by["ok"], "err": by["error"], "to": by["timeout"], "k": len(mine), "td": turns_undone,
                 "t": t, "r": run_id})
            counts["queued"] += len(mine)
    out: dict[str, Any] = {**counts, "changed": counts["queued"], "cannot": counts["skipped"],
                           "selection": sel.description, "config_version": version}
    if repair_id is None:
        out.update(repair_id=None, message=nothing_to_rerun(counts["selected"]))
        return out
    finish(engine, run_id, repair_id, "rerun", out, fail_d, actor, total_d)
    out["repair_id"] = repair_id
    return out
