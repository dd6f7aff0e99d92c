"""Streaming export of a run's records in the formats training pipelines read.

``prepare_export`` checks everything that can be checked up front (the run exists, the format and
options make sense, the output can be written, a ``tokens`` export has token ids or a usable tokenizer)
and raises :class:`ExportError` before anything is written. ``run_export`` then reads the run's ``ok``
records by keyset pages (bounded memory at any size), drops the ones the selection excludes (counting
why), turns each kept record into one output row with the format's row function, and writes
``<out>.partial``; only a complete file is fsynced and renamed to ``<out>``, so an interrupted export
never leaves a half file under the final name. A manifest ``<out>.manifest.json`` records the counts,
every exclusion reason, the run config (secrets stripped), the tokenizer and template, the checks
applied and the file's sha256.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..capture.turns import history_reasoning_of
from ..hints import command as hint
from ..quality.detection.overrides import list_overrides
from ..store import queue as store
from . import unwritten
from .criteria import PromptTally, resolve
from .plan import (
    DEFAULT_CHECKS,
    FORMATS,
    MANIFEST_SUFFIX,
    PAGE_SIZE,
    PARQUET_FORMATS,
    PRESET_FORMATS,
    R_CANARY,
    R_EMPTY,
    R_FLAGGED,
    R_NOT_GOOD,
    R_TRUNCATED,
    R_VERSION,
    TOKEN_FORMATS,
    ExportError,
    ExportOptions,
    ExportPlan,
    ProgressFn,
    Skip,
    check_bit_map,
    normalize_messages,
    record_id,
    strip_secrets,
    text_content,
)
from .sinks import PARTIAL_SUFFIX, JsonlSink, ParquetSink, write_atomic
from .turns import EXPORT_TURNS, manifest_part, turn_rows
from .unwritten import TEXT_FORMATS, added_by_template

if TYPE_CHECKING:
    pass

_MESSAGE_COLS = ("id, idx, source_id, prompt_json, reasoning, content, finish_reason, review, check_flags,"
                 " gen_version, derive_version, revision, turns_json, prompt_idx, sample_index")


def sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        p = url.split("sqlite:///", 1)[1].split("?", 1)[0]
        return Path(p) if p and p != ":memory:" else None
    return None


# ------------------------------------------------------------------------------------------- prepare


def prepare_export(engine: Engine, run_ref: int | str, options: ExportOptions) -> ExportPlan:
    """Validate the request (raises ExportError with the reason); writes nothing."""
    fmt = options.format
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if (options.think_inline or options.from_value) and fmt != "sharegpt":
        flag = "--think-inline" if options.think_inline else "--from-value"
        raise ExportError(f"{flag} applies to the sharegpt format only")
    if options.turns not in EXPORT_TURNS:
        raise ExportError(f"turns must be one of {', '.join(EXPORT_TURNS)}, got {options.turns!r}")
    if options.only_good and options.include_flagged:
        raise ExportError("--only-good and --include-flagged contradict each other; give one")
    if not str(options.out).strip():
        raise ExportError("no output file given (--out FILE)")
    out = Path(options.out).expanduser().resolve()
    parquet = options.parquet if options.parquet is not None else out.suffix.lower() == ".parquet"
    if parquet and fmt not in PARQUET_FORMATS:
        raise ExportError(
            f"Parquet output is available for the {', '.join(PARQUET_FORMATS)} format; "
            f"write {fmt} as JSONL (an output name not ending in .parquet)"
        )
    if out.is_dir():
        raise ExportError(f"output {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise ExportError(f"output directory {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise ExportError(f"output directory {out.parent} is not writable")
    db_url = engine.url.render_as_string(hide_password=True)
    db_file = sqlite_path(str(engine.url))
    if db_file is not None:
        db_file = db_file.resolve()
        if out in (db_file, Path(f"{db_file}-wal"), Path(f"{db_file}-shm"), Path(f"{db_file}-journal")):
            raise ExportError(f"output {out} is the database itself; choose another file name")

    # the snapshot (#35): the ok records finished by now are the export's; one that finishes (or fails a check)
    # while a long export runs is not read
    cut = time.time()
    with engine.connect() as conn:
        try:
            run = store.run_row(conn, run_ref)
        except store.NotFound as exc:
            raise ExportError(str(exc)) from None
        # the ok records as one statement sees them now (8 bytes each): one finished before the cut but written
        # after this read (a writer's batch still in flight) is not in the export either
        in_snapshot = array("q", conn.execute(text(
            "SELECT id FROM record WHERE run_id = :r AND status = 'ok' ORDER BY id"), {"r": run["id"]}).scalars())
        status_counts = {
            str(s): int(n)
            for s, n in conn.execute(
                text("SELECT status, COUNT(*) FROM record WHERE run_id = :r GROUP BY status"), {"r": run["id"]}
            )
        }
        weakened = list_overrides(conn, int(run["id"]))
    try:
        config = orjson.loads(run.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        config = {}
    if not isinstance(config, dict):
        config = {}
    reasoning_cfg: dict[str, Any] = config["reasoning"] if isinstance(config.get("reasoning"), dict) else {}
    expects = bool(run["expects_reasoning"] if run.get("expects_reasoning") is not None
                   else reasoning_cfg.get("expect", True))
    think_open = str(reasoning_cfg.get("think_open") or "<think>")
    think_close = str(reasoning_cfg.get("think_close") or "</think>")

    bits = check_bit_map()
    checks: list[str] = list(DEFAULT_CHECKS) if options.default_exclusions else []
    if options.require_pass and options.select != "best":
        raise ExportError("--require-pass goes with --select best (passing and first-passing export passing "
                          "samples only)")
    # every check name and the expression, resolved in the run's one catalogue (#38)
    criteria = resolve(engine, run, config, options.exclude_checks, options.select_checks, options.where,
                       _select_mode(options.select))
    checks += [n for n in criteria.exclude_builtin if n not in checks]
    options = replace(options, exclude_checks=(*criteria.exclude_builtin, *criteria.exclude_verdicts),
                      select_checks=criteria.select_checks)  # canonical names from here on

    from .tokens import tokens_tokenizer

    server_ids = bool(config.get("request_token_ids")) and not options.retokenize
    lt = None
    tok_info = None
    if fmt in TOKEN_FORMATS:
        lt, tok_info = tokens_tokenizer(config, options, think_open, think_close, expects, server_ids)
    elif fmt == "specforge":
        # Optional: with a tokenizer, rows whose reasoning the chat template would drop are left out.
        lt, tok_info = tokens_tokenizer(config, options, think_open, think_close, expects, True)
        if lt is not None and lt.template_source is None:
            lt = None
    elif options.tokenizer or options.chat_template:
        raise ExportError("--tokenizer/--chat-template apply to the tokens, speculators and specforge formats only")
    if options.template_drops_past_reasoning and fmt != "tokens":
        raise ExportError("--template-drops-past-reasoning applies to the tokens format only (speculators "
                          "always appends the answer as generated)")

    return ExportPlan(
        run=run, config=strip_secrets(config), options=options, out=out, parquet=parquet, checks=checks,
        check_bits={n: bits[n] for n in checks if n not in DEFAULT_CHECKS}, expects_reasoning=expects,
        think_open=think_open, think_close=think_close, server_ids=server_ids, tokenizer=lt,
        tokenizer_info=tok_info, status_counts=status_counts, total=len(in_snapshot), db_url=db_url,
        select_checks=criteria.select_checks, criteria=criteria, snapshot_at=cut, snapshot_ids=in_snapshot, overrides=weakened,
    )


def _select_mode(mode: str) -> str:
    from .select import SELECT_MODES

    if mode not in SELECT_MODES:
        raise ExportError(f"select must be one of {', '.join(SELECT_MODES)}, got {str(mode)[:40]!r}")
    return mode


# ---------------------------------------------------------------------------------------- selection


def exclusion_reason(rec: Mapping[str, Any], plan: ExportPlan) -> str | None:
    """Why this ok record is left out, or None to export it."""
    if int(rec.get("idx") or 0) < 0:
        return R_CANARY
    opts = plan.options
    if opts.config_version is not None and rec.get("derive_version") != opts.config_version:
        return R_VERSION
    if opts.generated_under is not None and rec.get("gen_version") != opts.generated_under:
        return R_VERSION
    review = rec.get("review")
    if opts.only_good:
        if review != "good":
            return R_FLAGGED if review == "bad" else R_NOT_GOOD
    elif review == "bad" and not opts.include_flagged:
        return R_FLAGGED
    for name in plan.checks:
        if name == R_EMPTY:
            if plan.expects_reasoning and not (rec.get("reasoning") or "").strip():
                return R_EMPTY
        elif name == R_TRUNCATED:
            if rec.get("finish_reason") == "length":
                return R_TRUNCATED
        else:
            bit = plan.check_bits.get(name)
            if bit and int(rec.get("check_flags") or 0) & bit:
                return f"check:{name}"
    return plan.criteria.reason(int(rec["id"])) if plan.criteria is not None else None


# ------------------------------------------------------------------------------------------- rows


def row_messages(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    """OpenAI-style messages; the answer carries reasoning_content (the key HF chat templates read)."""
    answer = {"role": "assistant", "reasoning_content": rec.get("reasoning") or "", "content": rec.get("content") or ""}
    prompt = rec["prompt_json"]
    if prompt.startswith("[{") and prompt.endswith("}]") and '"from"' not in prompt:
        # Already OpenAI messages (no ShareGPT key anywhere): splice the stored JSON instead of parsing it;
        # the output is byte-for-byte what parsing and re-serialising would give.
        spliced = prompt[:-1].encode() + b"," + orjson.dumps(answer) + b"]"
        return {"id": record_id(rec, plan.run["name"]), "messages": orjson.Fragment(spliced)}
    return {
        "id": record_id(rec, plan.run["name"]),
        "messages": [*normalize_messages(orjson.loads(prompt)), answer],
    }


def row_sharegpt(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    """SpecForge/EAGLE-style conversations; reasoning as reasoning_content or inline between think strings."""
    turns: list[dict[str, Any]] = []
    for m in normalize_messages(orjson.loads(rec["prompt_json"])):
        turns.append({"role": m.get("role"), "content": text_content(m.get("content"))})
    reasoning = rec.get("reasoning") or ""
    content = rec.get("content") or ""
    if plan.options.think_inline:
        from .tokens import shown_by

        # the closing tag only where the model wrote it (a reply cut inside its reasoning has none)
        close = plan.think_close if shown_by(rec, plan.think_close).closed else ""
        answer = {"role": "assistant", "content": f"{plan.think_open}{reasoning}{close}{content}"}
    else:
        answer = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    turns.append(answer)
    if plan.options.from_value:
        turns = [{"from": _FROM.get(t["role"], t["role"]), "value": t["content"],
                  **({"reasoning_content": t["reasoning_content"]} if "reasoning_content" in t else {})}
                 for t in turns]
    return {"id": record_id(rec, plan.run["name"]), "conversations": turns}


_FROM = {"user": "human", "assistant": "gpt", "system": "system"}


def row_raw(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    """Every stored column, values exactly as stored (JSON columns stay JSON text)."""
    return dict(rec)


ROW_FUNCTIONS: dict[str, Callable[[Mapping[str, Any], ExportPlan], dict[str, Any]]] = {
    "messages": row_messages, "sharegpt": row_sharegpt, "raw": row_raw,
}


def row_function(fmt: str) -> Callable[[Mapping[str, Any], ExportPlan], dict[str, Any]]:
    if fmt in PRESET_FORMATS:
        from .presets import ROWS

        return ROWS[fmt]
    if fmt == "tokens":
        from .tokens import row_tokens

        return row_tokens
    return ROW_FUNCTIONS[fmt]


def _columns(fmt: str) -> str:
    if fmt == "raw":
        return "*"
    if fmt == "tokens":
        return _MESSAGE_COLS + ", token_ids_json, extra_json"
    if fmt == "speculators":
        return _MESSAGE_COLS + ", token_ids_json, usage_json, extra_json"
    # extra_json: what the record shows the model wrote (the content as sent, the stop reason: export.unwritten)
    return _MESSAGE_COLS + ", extra_json"


def _row_source(fmt: str, row: Mapping[str, Any]) -> str | None:
    """Where a token row's ids came from ("server" | "retokenized"), for the manifest."""
    if fmt == "tokens":
        return str(row["source"])
    if fmt == "speculators":
        return str(row["metadata"]["token_ids"])
    return None


# ------------------------------------------------------------------------------------------ reading


# a record in an export's snapshot: finished at or before the cut (a record stored without a finish time counts)
SNAPSHOT_SQL = "(finished_at IS NULL OR finished_at <= :cut)"


def in_ids(ids: Sequence[int], record_id: int) -> bool:
    """record_id is one of the sorted ``ids``."""
    i = bisect_left(ids, record_id)
    return i < len(ids) and ids[i] == record_id


def iter_ok_pages(
    engine: Engine, run_id: int, columns: str, page_size: int = PAGE_SIZE, finished_before: float | None = None,
    only_ids: Sequence[int] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The run's ok records in id order, one page at a time (keyset pagination: bounded memory); with
    ``finished_before``, only those finished at or before that time, and with ``only_ids`` (sorted) only those
    among them: the export's snapshot (#35).

    Each page is its own short read transaction, so a long export never pins the SQLite WAL: the cut, not a
    transaction, keeps the pages to the records that were finished when the export started.
    """
    last = 0
    cut = f" AND {SNAPSHOT_SQL}" if finished_before is not None else ""
    sql = (f"SELECT {columns} FROM record WHERE run_id = :r AND status = 'ok'{cut} AND id > :last ORDER BY id"
           " LIMIT :n")
    stmt = text(sql)
    raw_sql = sql.replace(":r", "?").replace(":cut", "?").replace(":last", "?").replace(":n", "?")
    args: tuple[Any, ...] = (run_id, finished_before) if finished_before is not None else (run_id,)
    while True:
        with engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                # The DB-API cursor directly: SQLAlchemy's row processing costs as much as the query here.
                cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
                try:
                    cur.execute(raw_sql, (*args, last, page_size))
                    keys = [d[0] for d in cur.description]
                    rows = [dict(zip(keys, r, strict=True)) for r in cur.fetchall()]
                finally:
                    cur.close()
            else:
                params: dict[str, Any] = {"r": run_id, "last": last, "n": page_size}
                if finished_before is not None:
                    params["cut"] = finished_before
                result = conn.execute(stmt, params)
                keys = list(result.keys())
                rows = [dict(zip(keys, r, strict=True)) for r in result.fetchall()]
        if not rows:
            return
        yield rows if only_ids is None else [r for r in rows if in_ids(only_ids, int(r["id"]))]
        last = rows[-1]["id"]
        if len(rows) < page_size:
            return


# ------------------------------------------------------------------------------------------ writing


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + MANIFEST_SUFFIX)


def run_export(engine: Engine, plan: ExportPlan, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Write the export and its manifest; returns the manifest. Leaves no partial file behind on failure."""
    started = time.time()
    fmt = plan.options.format
    make_row = row_function(fmt)
    out = plan.out
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    excluded: Counter[str] = Counter()
    scanned = exported = 0
    sources: Counter[str] = Counter()
    repaired = {"rederived": 0, "rerun": 0, "generated": Counter(), "derived": Counter()}
    sink: JsonlSink | ParquetSink = ParquetSink(partial) if plan.parquet else JsonlSink(partial)
    history_reasoning = history_reasoning_of(plan.config)
    which = plan.options.turns if fmt != "raw" else "raw"
    conversations = 0
    added: Counter[str] = Counter()  # tokens a trainer's template adds that the model did not write (unwritten.py)
    added_rows = 0
    selection = None
    tally = PromptTally()  # per prompt: selected, no pass, pending (#38)
    try:
        if progress:
            progress(0, plan.total)
        criteria = plan.criteria
        if criteria is not None:  # the records the checks and --where select, read once (#38)
            criteria.load(engine, int(plan.run["id"]))
        if plan.select_checks:  # k samples per prompt: which of them, read once before writing
            from .select import SELECT_COLS, select

            bits = check_bit_map()
            selection = select(engine, plan.run, plan.options.select, plan.select_checks,
                               {c: bits[c] for c in plan.select_checks if c in bits},
                               iter_ok_pages(engine, int(plan.run["id"]), SELECT_COLS, plan.options.page_size,
                                             plan.snapshot_at, plan.snapshot_ids),
                               lambda r: exclusion_reason(r, plan), require_pass=plan.options.require_pass)
        for page in iter_ok_pages(engine, int(plan.run["id"]), _columns(fmt), plan.options.page_size,
                                  plan.snapshot_at, plan.snapshot_ids):
            rows: list[dict[str, Any]] = []
            for stored in page:
                conversations += bool(stored.get("turns_json"))
                before = len(rows)
                for rec in turn_rows(stored, which, history_reasoning):
                    reason = exclusion_reason(rec, plan)
                    if reason is None and selection is not None:
                        reason = selection.reason(int(rec["id"]))
                    if reason is None:
                        try:
                            row = make_row(rec, plan)
                        except Skip as skip:
                            reason = skip.reason
                        else:
                            rows.append(row)
                            _count_repair(repaired, rec)
                            if fmt in TEXT_FORMATS:
                                extra_tokens = added_by_template(rec, plan.think_close, plan.options.think_inline)
                                added.update(extra_tokens)
                                added_rows += bool(extra_tokens)
                            source = _row_source(fmt, row)
                            if source is not None:
                                sources[source] += 1
                    if reason is not None:
                        excluded[reason] += 1
                if int(stored.get("idx") or 0) >= 0:  # canaries are not prompts
                    sid = int(stored["id"])
                    tally.see(int(stored["idx"] if stored.get("prompt_idx") is None else stored["prompt_idx"]),
                              len(rows) > before, criteria is not None and criteria.is_pending(sid)
                              or (selection is not None and sid in selection.lacking))
            sink.write(rows)
            scanned += len(page)
            exported += len(rows)
            if progress:
                progress(scanned, max(plan.total, scanned))
        digest = sink.close()
        from .manifest import build_manifest

        manifest = build_manifest(plan, scanned, exported, excluded, sources, digest, partial.stat().st_size, started)
        manifest["repairs"] = _repairs_summary(engine, plan, repaired)
        # k samples per prompt: which of them (export/select.py), with pass@k by the check it read
        manifest["selection"]["per_prompt"] = selection.summary if selection is not None else {"mode": "all"}
        if criteria is not None:
            manifest["selection"].update(criteria.manifest())
        manifest["selection"]["prompts"] = tally.summary(engine, int(plan.run["id"]))
        if selection is not None and selection.lacking:
            manifest.setdefault("warnings", []).append(
                f"{len(selection.lacking):,} ok records had no pass/fail verdict of {' and '.join(plan.select_checks)}"
                " yet (pending,"
                " or the check's own error) and were left out under no_verdict; export again once they have one")
        pending = _pending_checks(engine, plan)
        if pending is not None:
            manifest["pending_checks"] = pending
            if pending["records"]:
                manifest.setdefault("warnings", []).append(
                    f"{pending['records']} ok records have no verdict yet from the extended checks "
                    f"({', '.join(pending['checks'])}); their ids are in the manifest's pending_checks "
                    f"(`{hint('checks', '--pending', run=plan.run['name'], with_db=False)}` checks them)")
        if fmt in TEXT_FORMATS:
            manifest["template_adds_unwritten_tokens"] = unwritten.manifest_part(fmt, added, added_rows)
            if added_rows:
                manifest.setdefault("warnings", []).append(unwritten.warning(fmt, added, added_rows))
        manifest["turns"] = manifest_part(which, history_reasoning, str(plan.config.get("turns") or "last"),
                                          conversations)
        os.replace(partial, out)
        write_atomic(manifest_path(out), orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    except BaseException:
        sink.abort()
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return manifest


PENDING_IDS_LISTED = 1000


def _pending_checks(engine: Engine, plan: ExportPlan) -> dict[str, Any] | None:
    """Which ok records still wait for an extended check's verdict (#30): verdicts follow the records, so an export
    made while they are pending says so (None: the run has no extended checks)."""
    from ..quality import verdicts

    names = verdicts.configured_checks(plan.config)
    if not names:
        return None
    with engine.connect() as conn:
        ids = verdicts.pending_ids(conn, int(plan.run["id"]), names)
        conn.rollback()
    return {"checks": names, "records": len(ids), "record_ids": ids[:PENDING_IDS_LISTED],
            "record_ids_complete": len(ids) <= PENDING_IDS_LISTED}


def _count_repair(acc: dict[str, Any], rec: Mapping[str, Any]) -> None:
    gen, der = rec.get("gen_version"), rec.get("derive_version")
    acc["generated"][str(gen)] += 1
    acc["derived"][str(der)] += 1
    if gen is not None and der is not None and der != gen:
        acc["rederived"] += 1


def _repairs_summary(engine: Engine, plan: ExportPlan, acc: dict[str, Any]) -> dict[str, Any]:
    """How the exported records came to be: re-derived, re-run, and under which config versions."""
    from sqlalchemy import text as sql

    with engine.connect() as conn:
        rerun = int(conn.execute(sql(
            "SELECT COUNT(DISTINCT h.record_id) FROM record_history h JOIN record r ON r.id = h.record_id"
            " WHERE h.run_id = :r AND h.action = 'rerun' AND r.status = 'ok'"), {"r": plan.run["id"]}).scalar() or 0)
        current = conn.execute(sql("SELECT config_version FROM run WHERE id = :r"), {"r": plan.run["id"]}).scalar()
        conn.rollback()
    return {
        "rederived": acc["rederived"],
        "rerun": rerun,
        "config_versions": {"generated": dict(sorted(acc["generated"].items())),
                            "derived": dict(sorted(acc["derived"].items()))},
        "current_config_version": current,
        "config_version_filter": plan.options.config_version,
        "generated_under_filter": plan.options.generated_under,
        "note": "rederived: exported records whose answer was read again under a later config version than it was"
                " generated under; rerun: records in the run generated again by a re-run (earlier outputs are in"
                " record_history)",
    }


def export_run(engine: Engine, run_ref: int | str, options: ExportOptions,
               progress: ProgressFn | None = None) -> dict[str, Any]:
    return run_export(engine, prepare_export(engine, run_ref, options), progress)
