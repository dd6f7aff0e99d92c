"""Review queries: random samples, record filters and full-text search, flags (single, bulk, undo).

Every query is answered from an index (see migration 0002_review): at 1M records each row carries
kilobytes of reasoning in overflow pages, so a query that reads table rows to evaluate a filter is slow.
The records table walks ``ix_record_filter`` (a narrow copy of every filter column in id order) and
stops after one page; random samples seek a random ``rnd`` in an index and take the next entry
(wrapping around), O(log n).

Model text is never interpreted here: display helpers return (kind, text) segments that templates
escape one by one.
"""

from __future__ import annotations

import functools
import random
import re
import time
import unicodedata
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from . import store

REASONS: tuple[tuple[str, str], ...] = (
    ("empty_reasoning", "empty reasoning"),
    ("truncated", "truncated"),
    ("wrong_format", "wrong format"),
    ("wrong_answer", "wrong answer"),
    ("wrong_language", "wrong language"),
    ("repetition", "repetition"),
    ("other", "other"),
)
REASON_CODES = tuple(code for code, _ in REASONS)
REASON_LABELS = dict(REASONS)
VERDICTS = ("good", "bad")
SAMPLE_MODES: tuple[tuple[str, str], ...] = (
    ("all", "all ok records"),
    ("recent", "recent"),
    ("failing", "failing a check"),
    ("unreviewed", "not yet reviewed"),
    ("flagged", "flagged"),
)
SAMPLE_MODE_CODES = tuple(code for code, _ in SAMPLE_MODES)
STATUSES = ("ok", "error", "timeout", "pending", "in_flight", "cancelled")
FLAG_FILTERS = ("good", "bad", "flagged", "unreviewed")
SORTS = ("id", "reasoning_len", "content_len", "completion_tokens", "latency_s")
SEARCH_FIELDS = ("all", "prompt", "reasoning", "content")
PAGE_SIZE = 50
BULK_CHUNK = 2000
COUNT_CAP = 100_000
RECENT_CAP = 20_000

# Columns the table rows show (never the big texts: previews are cut in SQL).
_ROW_COLUMNS = (
    "id, idx, status, finish_reason, review, review_reason, reasoning_source, endpoint, check_flags,"
    " reasoning_len, content_len, prompt_tokens, completion_tokens, latency_s, attempts, error_kind, finished_at,"
    " substr(prompt_json, 1, 400) AS prompt_head, substr(reasoning, 1, 160) AS reasoning_head,"
    " substr(content, 1, 160) AS content_head"
)


class ReviewError(ValueError):
    """Bad review input (a filter, a verdict, a record that is not in the run); the message says which."""


class NotFound(LookupError):
    pass


# ------------------------------------------------------------------------------------------ checks


@functools.cache
def check_bits() -> dict[str, int]:
    """name -> bit of the per-record checks, from synthwatch.checks when it defines them (else empty)."""
    try:
        from . import checks  # noqa: PLC0415 - optional module, written by another issue
    except Exception:  # pragma: no cover - depends on the checks module being there
        return {}
    for attr in ("CHECK_BITS", "BITS"):
        found = getattr(checks, attr, None)
        if isinstance(found, Mapping):
            return {str(k): int(v) for k, v in found.items()}
    listed = getattr(checks, "CHECKS", None)
    out: dict[str, int] = {}
    if isinstance(listed, Mapping):
        listed = list(listed.values())
    for item in listed or ():
        name, bit = getattr(item, "name", None), getattr(item, "bit", None)
        if isinstance(name, str) and isinstance(bit, int):
            out[name] = bit
    return out


def failed_checks(flags: int | None) -> list[str]:
    if not flags:
        return []
    names = [name for name, bit in check_bits().items() if flags & bit]
    return names or [f"bitmask {flags:#x}"]


# ----------------------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    check: str | None = None  # "any" | "none" | a check name
    flag: str | None = None  # good | bad | flagged | unreviewed
    reason: str | None = None
    finish_reason: str | None = None
    endpoint: str | None = None
    reasoning_source: str | None = None
    reasoning_len_min: int | None = None
    reasoning_len_max: int | None = None
    content_len_min: int | None = None
    content_len_max: int | None = None
    completion_tokens_min: int | None = None
    completion_tokens_max: int | None = None
    q: str | None = None
    field: str = "all"
    sort: str = "id"
    order: str = "desc"

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Filters:
        """Parse query parameters; unknown values raise ReviewError naming the parameter."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = params.get(f.name)
            if raw is None:
                continue
            raw = str(raw).strip()
            if raw == "":
                continue
            if f.name.endswith(("_min", "_max")):
                try:
                    number = int(raw)
                except ValueError:
                    raise ReviewError(f"{f.name}: not a whole number: {raw[:40]!r}") from None
                if number < 0:
                    raise ReviewError(f"{f.name}: must be >= 0 (got {number})")
                values[f.name] = number
            else:
                values[f.name] = raw
        choices = {
            "status": STATUSES,
            "flag": FLAG_FILTERS,
            "reason": REASON_CODES,
            "field": SEARCH_FIELDS,
            "sort": SORTS,
            "order": ("asc", "desc"),
        }
        for name, allowed in choices.items():
            if name in values and values[name] not in allowed:
                raise ReviewError(f"{name}: unknown value {values[name][:40]!r} (one of {', '.join(allowed)})")
        check = values.get("check")
        if check and check not in ("any", "none") and check not in check_bits():
            known = ", ".join(["any", "none", *check_bits()])
            raise ReviewError(f"check: unknown check {check[:40]!r} (one of {known})")
        if "q" in values and len(values["q"]) > 500:
            raise ReviewError("q: search text longer than 500 characters")
        return cls(**values)

    def params(self) -> dict[str, str]:
        """The non-default fields as query parameters (for links that keep the filter)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                out[f.name] = str(value)
        return out

    @property
    def active(self) -> bool:
        return any(k not in ("sort", "order") for k in self.params())


def fts_query(q: str, field_name: str = "all") -> str:
    """User words -> an FTS5 query: every word must occur (quoted, so FTS5 syntax is never interpreted);
    a trailing * keeps prefix search."""
    terms = []
    for word in q.split():
        prefix = word.endswith("*") and len(word) > 1
        word = word.rstrip("*") if prefix else word
        if not word:
            continue
        terms.append('"' + word.replace('"', '""') + '"' + ("*" if prefix else ""))
    if not terms:
        raise ReviewError("q: nothing to search for")
    expr = " AND ".join(terms)
    column = {"prompt": "prompt_json", "reasoning": "reasoning", "content": "content"}.get(field_name)
    return f"{{{column}}} : ({expr})" if column else expr


def _sort_expr(f: Filters) -> str:
    return "id" if f.sort == "id" else f"COALESCE({f.sort}, -1)"


def _conditions(f: Filters, params: dict[str, Any], alias: str = "") -> list[str]:
    p = alias
    conds: list[str] = []
    if f.status:
        conds.append(f"{p}status = :status")
        params["status"] = f.status
    if f.check == "any":
        conds.append(f"{p}check_flags != 0")
    elif f.check == "none":
        conds.append(f"{p}check_flags = 0")
    elif f.check:
        conds.append(f"({p}check_flags & :check_bit) != 0")
        params["check_bit"] = check_bits()[f.check]
    if f.flag in VERDICTS:
        conds.append(f"{p}review = :flag")
        params["flag"] = f.flag
    elif f.flag == "flagged":
        conds.append(f"{p}review IS NOT NULL")
    elif f.flag == "unreviewed":
        conds.append(f"{p}review IS NULL")
    if f.reason:
        conds.append(f"{p}review_reason = :reason")
        params["reason"] = f.reason
    for name in ("finish_reason", "endpoint", "reasoning_source"):
        value = getattr(f, name)
        if value == "(none)":
            conds.append(f"{p}{name} IS NULL")
        elif value:
            conds.append(f"{p}{name} = :{name}")
            params[name] = value
    for name in ("reasoning_len", "content_len", "completion_tokens"):
        low, high = getattr(f, f"{name}_min"), getattr(f, f"{name}_max")
        if low is not None:
            conds.append(f"{p}{name} >= :{name}_min")
            params[f"{name}_min"] = low
        if high is not None:
            conds.append(f"{p}{name} <= :{name}_max")
            params[f"{name}_max"] = high
    return conds


def _hint(conn: Connection, index: str) -> str:
    return f" INDEXED BY {index}" if conn.dialect.name == "sqlite" else ""


def _search_supported(conn: Connection) -> bool:
    return conn.dialect.name in ("sqlite", "postgresql")


# PostgreSQL full-text search: the expression and predicate of the GIN index ix_record_fts (migration
# 0003_pg_search), repeated verbatim so the planner matches it. synthwatch_fts_doc declares its real cost, so
# the planner walks records computing it only when matches are dense.
PG_TSVECTOR = "synthwatch_fts_doc(reasoning, content, prompt_json)"
PG_INDEXED = "(reasoning IS NOT NULL OR content IS NOT NULL)"
_PG_FIELD = {"prompt": "synthwatch_fts_doc(NULL, NULL, prompt_json)",
             "reasoning": "synthwatch_fts_doc(reasoning, NULL, NULL)",
             "content": "synthwatch_fts_doc(NULL, content, NULL)"}
_PG_PREFIX_WORD = re.compile(r"^\w+$")


def pg_tsquery(q: str, params: dict[str, Any]) -> str:
    """User words -> a tsquery SQL expression over bound values: every word must occur, a trailing * keeps
    prefix search. plainto_tsquery never interprets operators; a prefix word is used as a prefix only when it
    is made of word characters alone (so it cannot carry tsquery syntax), else it is searched as a word."""
    plain: list[str] = []
    prefixes: list[str] = []
    for word in q.split():
        prefix = word.endswith("*") and len(word) > 1
        word = word.rstrip("*") if prefix else word
        if not word:
            continue
        if prefix and _PG_PREFIX_WORD.match(word):
            prefixes.append(word)
        else:
            plain.append(word)
    if not plain and not prefixes:
        raise ReviewError("q: nothing to search for")
    parts = []
    if plain:
        params["tsq_plain"] = " ".join(plain)
        parts.append("plainto_tsquery('simple'::regconfig, :tsq_plain)")
    for n, word in enumerate(prefixes):
        params[f"tsq_p{n}"] = f"'{word}':*"
        parts.append(f"to_tsquery('simple'::regconfig, :tsq_p{n})")
    return "(" + " && ".join(parts) + ")"


def _pg_search_conds(conn: Connection, f: Filters, params: dict[str, Any]) -> list[str]:
    """Conditions that answer a search from ix_record_fts; a field restriction re-checks only the rows the
    index found (one GIN index serves every field)."""
    assert f.q
    tsq = pg_tsquery(f.q, params)
    # the declared cost of synthwatch_fts_doc would make PostgreSQL JIT-compile a 10 ms query for ~0.4 s
    conn.execute(text("SET LOCAL jit = off"))
    # a word in most records makes a bitmap of every match: with the default 4 MB it turns lossy and PostgreSQL
    # re-runs the text search on every record of those pages (minutes at 1M records); exact, it reads only rows
    conn.execute(text("SET LOCAL work_mem = '128MB'"))
    conds = [PG_INDEXED, f"{PG_TSVECTOR} @@ {tsq}"]
    column = _PG_FIELD.get(f.field)
    if column:
        conds.append(f"{column} @@ {tsq}")
    return conds


PG_FIRST_WINDOW = 4096
PG_PROBE_FACTOR = 3  # phase 1 reads this many times a page of the newest records


def _pg_search_windows(conn: Connection, run_id: int, conds: list[str], params: dict[str, Any], limit: int,
                       step_down: bool) -> list[int]:
    """A search page on PostgreSQL in id order, newest-first (or oldest-first), in two phases.

    Asked for the whole run at once, PostgreSQL either fetches and sorts every match of a common word (3.2 s at
    1M records) or, for a range of ids, walks them computing every record's tsvector (92 s for a rare prefix).
    Instead:

    1. the next few pages' worth of records (PG_PROBE_FACTOR x limit) are tested directly, ~0.2 ms each: a word
       in a third of the records or more fills the page here;
    2. otherwise id windows growing 8x, each answered from the GIN index intersected with the window (bitmap
       scans only, so no plan computes tsvectors row by row): a rarer word costs a few small index reads, and
       from the third window on only its GIN bitmap is read (the word is rare by then).

    ``conds``: every condition but the run's (this function writes that one, in two forms).
    """
    bounds = conn.execute(text("SELECT min(id), max(id) FROM record WHERE run_id = :run"), {"run": run_id}).one()
    if bounds[0] is None:
        return []
    lo_id, hi_id = int(bounds[0]), int(bounds[1])
    direction = "DESC" if step_down else "ASC"
    # the next window starts here (exclusive going down); a cursor or max_id moves the start
    if step_down:
        edge = min(hi_id + 1, int(params.get("cur_id", hi_id + 1)), int(params.get("max_id", hi_id)) + 1)
    else:
        edge = max(lo_id, int(params.get("cur_id", lo_id - 1)) + 1)
    where = " AND ".join(["run_id = :run", *conds])
    # phase 1; ORDER BY run_id too, so the plan walks ix_record_filter (run_id, id) and never other runs' rows
    probe = conn.execute(text(
        f"SELECT id FROM record WHERE run_id = :run AND {PG_INDEXED} AND id {'<' if step_down else '>='} :edge"
        f" ORDER BY run_id {direction}, id {direction} LIMIT :k"), {"run": run_id, "edge": edge,
                                                                    "k": limit * PG_PROBE_FACTOR}).all()
    if not probe:
        return []
    first, last = int(probe[0][0]), int(probe[-1][0])
    w_lo, w_hi = (last, first + 1) if step_down else (first, last + 1)
    found = _pg_window(conn, where, params, w_lo, w_hi, limit, direction, bitmap_only=False)
    edge = w_lo if step_down else w_hi
    if len(found) >= limit or len(probe) < limit * PG_PROBE_FACTOR:
        return found
    # phase 2
    conn.execute(text("SET LOCAL enable_indexscan = off"))
    conn.execute(text("SET LOCAL enable_seqscan = off"))
    try:
        width = PG_FIRST_WINDOW
        while len(found) < limit:
            w_lo, w_hi = (max(lo_id, edge - width), edge) if step_down else (edge, min(hi_id + 1, edge + width))
            if w_lo >= w_hi:
                break
            gin_only = width > PG_FIRST_WINDOW * 8
            # a wide window, or the run, as an index condition costs a bitmap of every id in it (0.2 s for 262k
            # ids); a word that reached such a window is rare, so its GIN bitmap alone is small, and run and
            # window are tested on those rows only ("+ 0": no index condition)
            w_where = " AND ".join(["run_id + 0 = :run", *conds]) if gin_only else where
            found += _pg_window(conn, w_where, params, w_lo, w_hi, limit - len(found), direction, bitmap_only=True,
                                gin_only=gin_only)
            edge = w_lo if step_down else w_hi
            width *= 8
    finally:
        conn.execute(text("SET LOCAL enable_indexscan = on"))
        conn.execute(text("SET LOCAL enable_seqscan = on"))
    return found


def _pg_window(conn: Connection, where: str, params: dict[str, Any], w_lo: int, w_hi: int, need: int,
               direction: str, *, bitmap_only: bool, gin_only: bool = False) -> list[int]:
    if bitmap_only:
        col = "id + 0" if gin_only else "id"
        sql = (f"SELECT id FROM record WHERE {where} AND {col} >= :w_lo AND {col} < :w_hi"
               f" ORDER BY id {direction} LIMIT :need")
    else:  # a few hundred ids: test each row, no index (OFFSET 0 keeps the planner from pushing the test down)
        sql = (f"SELECT id FROM (SELECT * FROM record WHERE run_id = :run AND id >= :w_lo AND id < :w_hi"
               f" OFFSET 0) AS r WHERE {where} ORDER BY id {direction} LIMIT :need")
    return [int(r[0]) for r in conn.execute(text(sql), {**params, "w_lo": w_lo, "w_hi": w_hi, "need": need})]


@dataclass(frozen=True)
class Cursor:
    value: float | None
    id: int

    def encode(self) -> str:
        return str(self.id) if self.value is None else f"{self.value!r}~{self.id}"

    @classmethod
    def decode(cls, raw: str, f: Filters) -> Cursor:
        try:
            if f.sort == "id":
                return cls(None, int(raw))
            value, _, rid = raw.partition("~")
            return cls(float(value), int(rid))
        except ValueError:
            raise ReviewError(f"cursor: malformed {raw[:40]!r}") from None

    @classmethod
    def of(cls, row: Mapping[str, Any], f: Filters) -> Cursor:
        if f.sort == "id":
            return cls(None, int(row["id"]))
        value = row.get(f.sort)
        return cls(-1.0 if value is None else float(value), int(row["id"]))


SPARSE_PROBE = 20_000


def _sparse_index(conn: Connection, run_id: int, f: Filters) -> tuple[str, list[str]]:
    """The index to walk for a filter, and the conditions that let SQLite use it.

    The narrow filter index in id order finds one page fast when matches are dense; for a flag or check
    filter that matches few records (at most SPARSE_PROBE, probed in their own small index) it is faster to
    collect those few and sort them than to walk every record of the run looking for them.
    """
    if conn.dialect.name != "sqlite" or f.q or f.sort != "id":
        return "ix_record_filter", []
    # Only when the small index holds every column the filter tests: a row lookup per match would cost more
    # (each record row carries its texts) than the walk it saves.
    others = set(f.params()) - {"status", "flag", "check", "order"}
    statuses = [f.status] if f.status else list(STATUSES)
    status_in = "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"
    candidates: list[tuple[str, list[str]]] = []
    if others:
        return "ix_record_filter", []
    if f.flag in VERDICTS and not f.check:
        candidates.append(("ix_record_review", [status_in, f"review = '{f.flag}'"]))
    elif f.flag == "flagged" and not f.check:
        candidates.append(("ix_record_review", [status_in, "review IS NOT NULL"]))
    if f.check and f.check != "none" and not f.flag:
        candidates.append(("ix_record_failing", [status_in, "check_flags != 0"]))
    for index, conds in candidates:
        probe = (f"SELECT count(*) FROM (SELECT 1 FROM record INDEXED BY {index} WHERE run_id = :run AND "
                 f"{' AND '.join(conds)} LIMIT {SPARSE_PROBE + 1}) AS p")
        if int(conn.execute(text(probe), {"run": run_id}).scalar_one()) <= SPARSE_PROBE:
            return index, conds
    return "ix_record_filter", []


def _select_ids(
    conn: Connection,
    run_id: int,
    f: Filters,
    *,
    after: Cursor | None = None,
    before: Cursor | None = None,
    limit: int = PAGE_SIZE,
    max_id: int | None = None,
) -> list[int]:
    """Ids of matching records in display order, `limit` of them after (or before) a cursor."""
    params: dict[str, Any] = {"run": run_id, "limit": limit}
    pg_search = bool(f.q) and conn.dialect.name == "postgresql"
    alias = "r." if f.q and not pg_search else ""
    index, index_conds = _sparse_index(conn, run_id, f)
    conds = [f"{alias}run_id = :run", *index_conds, *_conditions(f, params, alias)]
    if max_id is not None:
        conds.append(f"{alias}id <= :max_id")
        params["max_id"] = max_id
    descending = f.order == "desc"
    reverse = before is not None
    cursor = before if reverse else after
    step_down = descending != reverse  # walking toward smaller keys
    sort = _sort_expr(f)
    sort_col = f"{alias}{sort}" if f.sort == "id" else f"COALESCE({alias}{f.sort}, -1)"
    if cursor is not None:
        op = "<" if step_down else ">"
        if f.sort == "id":
            conds.append(f"{alias}id {op} :cur_id")
        else:
            conds.append(f"({sort_col} {op} :cur_v OR ({sort_col} = :cur_v AND {alias}id {op} :cur_id))")
            params["cur_v"] = cursor.value
        params["cur_id"] = cursor.id
    direction = "DESC" if step_down else "ASC"
    order = f"{alias}id {direction}" if f.sort == "id" else f"{sort_col} {direction}, {alias}id {direction}"
    if pg_search:
        conds += _pg_search_conds(conn, f, params)
        if f.sort == "id":
            # conds[0] is the run condition: the windows write it themselves (a form no index can use, at times)
            ids = _pg_search_windows(conn, run_id, conds[1:], params, limit, step_down)
            return ids[::-1] if reverse else ids
        sql = f"SELECT id FROM record WHERE {' AND '.join(conds)} ORDER BY {order} LIMIT :limit"
    elif f.q:
        if not _search_supported(conn):
            raise ReviewError("q: full-text search needs SQLite or PostgreSQL")
        params["match"] = fts_query(f.q, f.field)
        if f.sort == "id":
            # FTS5 yields rowids in order: walk it newest-first and stop after one page.
            order = f"f.rowid {direction}"
            conds = [c.replace("r.id ", "f.rowid ") if c.startswith("r.id ") else c for c in conds]
        sql = (
            f"SELECT r.id FROM record_fts f CROSS JOIN record r{_hint(conn, 'ix_record_filter')}"
            f" ON r.run_id = :run AND r.id = f.rowid WHERE f.record_fts MATCH :match AND {' AND '.join(conds)}"
            f" ORDER BY {order} LIMIT :limit"
        )
    else:
        sql = (
            f"SELECT id FROM record{_hint(conn, index)} WHERE {' AND '.join(conds)}"
            f" ORDER BY {order} LIMIT :limit"
        )
    try:
        ids = [int(r[0]) for r in conn.execute(text(sql), params)]
    except Exception as exc:
        if f.q and "fts5" in str(exc).lower():
            raise ReviewError(f"q: cannot search for {f.q[:60]!r}: {exc.__class__.__name__}") from exc
        raise
    return ids[::-1] if reverse else ids


def _rows(conn: Connection, ids: list[int]) -> list[dict[str, Any]]:
    if not ids:
        return []
    params = {f"i{n}": i for n, i in enumerate(ids)}
    marks = ", ".join(f":i{n}" for n in range(len(ids)))
    rows = {r["id"]: dict(r) for r in conn.execute(
        text(f"SELECT {_ROW_COLUMNS} FROM record WHERE id IN ({marks})"), params).mappings()}
    return [rows[i] for i in ids if i in rows]


@dataclass
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None
    prev_cursor: str | None
    filters: Filters
    elapsed_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def page(
    conn: Connection,
    run_id: int,
    f: Filters,
    *,
    after: str | None = None,
    before: str | None = None,
    limit: int = PAGE_SIZE,
) -> Page:
    """One page of matching records (keyset pagination: as fast on page 20,000 as on page 1)."""
    t0 = time.perf_counter()
    if after and before:
        raise ReviewError("give either after or before, not both")
    limit = max(1, min(int(limit), 500))
    a = Cursor.decode(after, f) if after else None
    b = Cursor.decode(before, f) if before else None
    ids = _select_ids(conn, run_id, f, after=a, before=b, limit=limit + 1)
    more = len(ids) > limit
    if b is not None:
        ids = ids[-limit:] if more else ids
    else:
        ids = ids[:limit]
    rows = _rows(conn, ids)
    for row in rows:
        row["failed_checks"] = failed_checks(row["check_flags"])
        row["prompt_preview"] = prompt_preview(row.pop("prompt_head") or "")
    has_next = more if b is None else True
    has_prev = (a is not None) if b is None else more
    return Page(
        rows=rows,
        next_cursor=Cursor.of(rows[-1], f).encode() if rows and has_next else None,
        prev_cursor=Cursor.of(rows[0], f).encode() if rows and has_prev else None,
        filters=f,
        elapsed_ms=(time.perf_counter() - t0) * 1000,
    )


def count(conn: Connection, run_id: int, f: Filters, *, cap: int | None = COUNT_CAP,
          max_id: int | None = None) -> tuple[int, bool]:
    """(matching records, whether the count stopped at `cap`)."""
    inner, params = matching(conn, run_id, f, max_id=max_id)
    if cap is not None:
        inner += " LIMIT :cap"
        params["cap"] = cap + 1
    n = int(conn.execute(text(f"SELECT count(*) FROM ({inner}) AS m"), params).scalar_one())
    if cap is not None and n > cap:
        return cap, True
    return n, False


def matching(conn: Connection, run_id: int, f: Filters, columns: tuple[str, ...] = (),
             max_id: int | None = None, where: str = "") -> tuple[str, dict[str, Any]]:
    """(SELECT of the records a filter matches, its parameters): the records table's count and the length
    histograms of a filter (synthwatch.lengths) read the same selection. ``columns`` are record columns
    (none: ``1``); ``where`` is one more condition on them."""
    params: dict[str, Any] = {"run": run_id}
    alias = "r." if f.q and conn.dialect.name != "postgresql" else ""
    cols = ", ".join(alias + c for c in columns) or "1"
    extra = [where.format(p=alias)] if where else []
    if f.q and conn.dialect.name == "postgresql":
        conds = ["run_id = :run", *_conditions(f, params), *_pg_search_conds(conn, f, params), *extra]
        if max_id is not None:
            conds.append("id <= :max_id")
        inner = f"SELECT {cols} FROM record WHERE {' AND '.join(conds)}"
    elif f.q:
        if not _search_supported(conn):
            raise ReviewError("q: full-text search needs SQLite or PostgreSQL")
        conds = ["r.run_id = :run", *_conditions(f, params, "r."), *extra]
        params["match"] = fts_query(f.q, f.field)
        inner = (
            f"SELECT {cols} FROM record_fts f CROSS JOIN record r{_hint(conn, 'ix_record_filter')}"
            f" ON r.run_id = :run AND r.id = f.rowid WHERE f.record_fts MATCH :match AND {' AND '.join(conds)}"
        )
        if max_id is not None:
            inner += " AND r.id <= :max_id"
    else:
        index, index_conds = _sparse_index(conn, run_id, f)
        conds = ["run_id = :run", *index_conds, *_conditions(f, params), *extra]
        if max_id is not None:
            conds.append("id <= :max_id")
        inner = f"SELECT {cols} FROM record{_hint(conn, index)} WHERE {' AND '.join(conds)}"
    if max_id is not None:
        params["max_id"] = max_id
    return inner, params


def neighbours(conn: Connection, run_id: int, f: Filters, row: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(previous, next) record ids around `row` in the filtered, sorted set."""
    cur = Cursor.of(row, f)
    prev_ids = _select_ids(conn, run_id, f, before=cur, limit=1)
    next_ids = _select_ids(conn, run_id, f, after=cur, limit=1)
    return (prev_ids[0] if prev_ids else None), (next_ids[0] if next_ids else None)


def distinct_values(conn: Connection, run_id: int, column: str, recent: int = 5000) -> list[str]:
    """Values for a filter drop-down: the usual ones plus those seen in the run's latest `recent` records
    (a bounded walk of the filter index; a full DISTINCT would scan every record)."""
    assert column in ("finish_reason", "endpoint", "reasoning_source")
    known: set[str] = set()
    if column == "finish_reason":
        known = {"stop", "length"}
    elif column == "reasoning_source":
        from .reasoning import SOURCES

        known = set(SOURCES)
    rows = conn.execute(
        text(f"SELECT DISTINCT {column} FROM (SELECT {column} FROM record{_hint(conn, 'ix_record_filter')}"
             f" WHERE run_id = :run ORDER BY id DESC LIMIT :n) AS recent WHERE {column} IS NOT NULL"),
        {"run": run_id, "n": recent},
    )
    return sorted(known | {str(r[0]) for r in rows})


def prompt_preview(prompt_json: str, limit: int = 140) -> str:
    """The last user turn of a (possibly cut) prompt JSON, flattened to one line."""
    text_value = prompt_json
    try:
        messages = orjson.loads(prompt_json)
        if isinstance(messages, dict):  # a prompt with tools
            messages = messages.get("messages") or []
        users = [m for m in messages if isinstance(m, dict) and m.get("role", m.get("from")) in ("user", "human")]
        last = users[-1] if users else (messages[-1] if messages else {})
        content = last.get("content", last.get("value", ""))
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text_value = str(content)
    except (orjson.JSONDecodeError, TypeError, AttributeError, IndexError):
        pass
    flat = " ".join(text_value.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# ----------------------------------------------------------------------------------------- samples


def _first_at(conn: Connection, sql: str, params: dict[str, Any], x: float) -> list[tuple[float, int]]:
    return [(float(r[1]), int(r[0])) for r in conn.execute(text(sql), {**params, "x": x})]


def sample(
    conn: Connection,
    run_id: int,
    mode: str = "all",
    *,
    minutes: float = 10.0,
    check: str | None = None,
    exclude: int | None = None,
    rng: random.Random | None = None,
    session: tuple[float, float] | None = None,
) -> int | None:
    """A random record id for a sampling mode, or None when the mode has no record.

    With ``session=(start, at)`` the pick is the next record of a review session instead: the mode's
    records in ``rnd`` order (a random order fixed per record) from ``start``, once round, so nothing
    comes up twice; ``at`` is the ``rnd`` of the record shown now. None when the round is complete."""
    if mode not in SAMPLE_MODE_CODES:
        raise ReviewError(f"mode: unknown sampling mode {mode[:40]!r} (one of {', '.join(SAMPLE_MODE_CODES)})")
    rng = rng or random.Random()
    if mode == "recent":
        return _sample_recent(conn, run_id, minutes, rng, exclude)
    params: dict[str, Any] = {"run": run_id}
    groups: list[str] = []
    if mode == "all":
        groups.append(f"SELECT id, rnd FROM record{_hint(conn, 'ix_record_sample')}"
                      " WHERE run_id = :run AND status = 'ok' AND rnd >= :x ORDER BY rnd LIMIT 2")
    elif mode == "unreviewed":
        groups.append(f"SELECT id, rnd FROM record{_hint(conn, 'ix_record_review')}"
                      " WHERE run_id = :run AND status = 'ok' AND review IS NULL AND rnd >= :x ORDER BY rnd LIMIT 2")
    elif mode == "flagged":
        # The union of several index ranges, each ordered by rnd: the first entry >= x over all of them
        # is a uniform sample of the union.
        for status in ("ok", "error", "timeout"):
            for verdict in VERDICTS:
                groups.append(
                    f"SELECT id, rnd FROM record{_hint(conn, 'ix_record_review')} WHERE run_id = :run"
                    f" AND status = '{status}' AND review = '{verdict}' AND rnd >= :x ORDER BY rnd LIMIT 2"
                )
    else:  # failing
        bit = ""
        if check and check != "any":
            bits = check_bits()
            if check not in bits:
                raise ReviewError(f"check: unknown check {check[:40]!r} (one of any, {', '.join(bits)})")
            bit = " AND (check_flags & :bit) != 0"
            params["bit"] = bits[check]
        for status in ("ok", "error", "timeout"):  # some checks (timeout, error) judge failed records
            groups.append(f"SELECT id, rnd FROM record{_hint(conn, 'ix_record_failing')}"
                          f" WHERE run_id = :run AND status = '{status}' AND check_flags != 0{bit} AND rnd >= :x"
                          " ORDER BY rnd LIMIT 2")
    if session is not None:
        return _session_next(conn, groups, params, session, exclude)
    x = rng.random()
    seen: list[tuple[float, int]] = []
    for start in (x, 0.0):
        hits = sorted(h for sql in groups for h in _first_at(conn, sql, params, start))
        seen += hits
        for _rnd, rid in hits:
            if rid != exclude:
                return rid
    return seen[0][1] if seen else None


def _session_next(conn: Connection, groups: list[str], params: dict[str, Any], session: tuple[float, float],
                  exclude: int | None) -> int | None:
    start, at = session
    wrapped = at < start  # past the top of the ring already: the round ends at start
    for x in (at,) if wrapped else (at, 0.0):
        for rnd, rid in sorted(h for sql in groups for h in _first_at(conn, sql, params, x)):
            if rid == exclude:
                continue
            if (wrapped or x == 0.0) and rnd >= start:
                return None
            return rid
    return None


def reviewed_since(conn: Connection, run_id: int, since: float) -> int:
    """Records given a verdict one by one since ``since`` (a review session's start), still standing."""
    return int(conn.execute(text(
        "SELECT count(DISTINCT record_id) FROM flag WHERE run_id = :r AND created_at >= :t AND bulk_id IS NULL"
        " AND undone_at IS NULL"), {"r": run_id, "t": since}).scalar_one())


def unreviewed_ok(conn: Connection, run: dict[str, Any]) -> int:
    """Ok records without a verdict (walks only the flagged entries of ix_record_review)."""
    flagged = int(conn.execute(text(f"SELECT count(*) FROM record{_hint(conn, 'ix_record_review')}"
                                    " WHERE run_id = :r AND status = 'ok' AND review IN ('good', 'bad')"),
                               {"r": run["id"]}).scalar_one())
    return max(0, int(run["n_ok"]) - flagged)


def _sample_recent(conn: Connection, run_id: int, minutes: float, rng: random.Random,
                   exclude: int | None) -> int | None:
    """A uniform pick among the records finished in the last `minutes` (the newest RECENT_CAP of them when
    there are more), walking only ix_record_finished (records of other statuses are stepped over)."""
    if not 0 < minutes <= 7 * 24 * 60:
        raise ReviewError(f"minutes: must be between 0 and 10080 (got {minutes})")
    hint = _hint(conn, "ix_record_finished")
    params = {"run": run_id, "since": store.now() - minutes * 60, "cap": RECENT_CAP}
    n = int(conn.execute(text(f"SELECT count(*) FROM (SELECT 1 FROM record{hint} WHERE run_id = :run"
                              " AND finished_at >= :since LIMIT :cap) AS w"), params).scalar_one())
    if n == 0:
        return None
    sql = text(f"SELECT id, status FROM record{hint} WHERE run_id = :run AND finished_at >= :since"
               " ORDER BY finished_at DESC LIMIT 20 OFFSET :off")
    for off in (rng.randrange(n), 0):
        rows = [(int(r[0]), r[1]) for r in conn.execute(sql, {**params, "off": off})]
        ok = [i for i, status in rows if status == "ok"]
        if ok:
            return next((i for i in ok if i != exclude), ok[0])
    return None


# ----------------------------------------------------------------------------------------- records


def get_record(conn: Connection, run_id: int, record_id: int) -> dict[str, Any]:
    row = conn.execute(text("SELECT * FROM record WHERE id = :i AND run_id = :r"),
                       {"i": record_id, "r": run_id}).mappings().first()
    if row is None:
        raise NotFound(f"no record {record_id} in run {run_id}")
    return dict(row)


def flag_history(conn: Connection, record_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(text("SELECT * FROM flag WHERE record_id = :i ORDER BY id DESC LIMIT 50"),
                        {"i": record_id}).mappings()
    return [dict(r) for r in rows]


def record_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A record for the JSON API: JSON columns decoded, everything else as stored."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key.endswith("_json") and isinstance(value, str):
            try:
                out[key.removesuffix("_json")] = orjson.loads(value)
            except orjson.JSONDecodeError:
                out[key] = value
        else:
            out[key] = value
    out["failed_checks"] = failed_checks(row.get("check_flags"))
    return out


def raw_fields(row: Mapping[str, Any]) -> str:
    """The stored raw response fields, pretty JSON (shown in the viewer's raw tab)."""
    keep = {k: v for k, v in record_json(row).items()
            if k not in ("prompt", "reasoning", "content", "failed_checks")}
    return orjson.dumps(keep, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


# ------------------------------------------------------------------------------------------- flags


def _validate_flag(verdict: str, reason: str | None, note: str | None) -> tuple[str | None, str | None]:
    if verdict not in VERDICTS:
        raise ReviewError(f"verdict: must be good or bad (got {str(verdict)[:40]!r})")
    reason = reason or None
    if reason is not None and reason not in REASON_CODES:
        raise ReviewError(f"reason: unknown reason {reason[:40]!r} (one of {', '.join(REASON_CODES)})")
    if reason is not None and verdict == "good":
        raise ReviewError("reason: a reason goes with a bad verdict only")
    note = (note or "").strip() or None
    if note is not None and len(note) > 2000:
        raise ReviewError("note: longer than 2000 characters")
    return reason, note


def flag(engine: Engine, run_id: int, record_id: int, verdict: str, reason: str | None = None,
         note: str | None = None) -> dict[str, Any]:
    """Record a verdict (history row + the record's denormalised latest verdict) in one short transaction."""
    reason, note = _validate_flag(verdict, reason, note)
    t = store.now()
    with engine.connect() as conn, store.write_begin(conn):
        found = conn.execute(text("SELECT 1 FROM record WHERE id = :i AND run_id = :r"),
                             {"i": record_id, "r": run_id}).first()
        if found is None:
            raise NotFound(f"no record {record_id} in run {run_id}")
        flag_id = conn.execute(
            text("INSERT INTO flag (run_id, record_id, verdict, reason, note, created_at)"
                 " VALUES (:r, :i, :v, :reason, :note, :t) RETURNING id"),
            {"r": run_id, "i": record_id, "v": verdict, "reason": reason, "note": note, "t": t},
        ).scalar_one()
        conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                     {"v": verdict, "reason": reason, "t": t, "i": record_id})
    return {"id": int(flag_id), "record_id": record_id, "verdict": verdict, "reason": reason, "note": note,
            "created_at": t}


def _restore(conn: Connection, record_id: int) -> dict[str, Any] | None:
    prev = conn.execute(
        text("SELECT verdict, reason, created_at FROM flag WHERE record_id = :i AND undone_at IS NULL"
             " ORDER BY id DESC LIMIT 1"), {"i": record_id}).mappings().first()
    conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                 {"v": prev["verdict"] if prev else None, "reason": prev["reason"] if prev else None,
                  "t": prev["created_at"] if prev else None, "i": record_id})
    return dict(prev) if prev else None


def undo(engine: Engine, run_id: int, record_id: int | None = None) -> dict[str, Any]:
    """Undo the latest flag on a record (or, without a record, the run's latest flag action: a whole bulk
    flag counts as one action). The record gets its previous verdict back."""
    with engine.connect() as conn:
        if record_id is not None:
            latest = conn.execute(
                text("SELECT id, record_id, bulk_id FROM flag WHERE run_id = :r AND record_id = :i"
                     " AND undone_at IS NULL ORDER BY id DESC LIMIT 1"), {"r": run_id, "i": record_id}).first()
        else:
            latest = conn.execute(
                text("SELECT id, record_id, bulk_id FROM flag WHERE run_id = :r AND undone_at IS NULL"
                     " ORDER BY id DESC LIMIT 1"), {"r": run_id}).first()
    if latest is None:
        raise ReviewError("nothing to undo" + (f" on record {record_id}" if record_id is not None else ""))
    if record_id is None and latest[2]:
        n = undo_bulk(engine, run_id, str(latest[2]))
        return {"undone": n, "bulk_id": latest[2], "record_id": None, "review": None}
    t = store.now()
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE flag SET undone_at = :t WHERE id = :f"), {"t": t, "f": latest[0]})
        prev = _restore(conn, int(latest[1]))
    return {"undone": 1, "record_id": int(latest[1]), "review": prev}


def undo_bulk(engine: Engine, run_id: int, bulk_id: str) -> int:
    done = 0
    while True:
        t = store.now()
        with engine.connect() as conn, store.write_begin(conn):
            rows = conn.execute(
                text("SELECT id, record_id FROM flag WHERE run_id = :r AND bulk_id = :b AND undone_at IS NULL"
                     " LIMIT :n"), {"r": run_id, "b": bulk_id, "n": BULK_CHUNK}).all()
            if not rows:
                return done
            conn.execute(text("UPDATE flag SET undone_at = :t WHERE id = :f"), [{"t": t, "f": r[0]} for r in rows])
            for r in rows:
                _restore(conn, int(r[1]))
            done += len(rows)


def latest_bulk(conn: Connection, run_id: int) -> dict[str, Any] | None:
    """The run's latest bulk flag while any of its flags still stands: its Undo stays on the records page."""
    row = conn.execute(text("SELECT bulk_id, verdict, created_at FROM flag WHERE run_id = :r AND bulk_id IS NOT NULL"
                            " ORDER BY created_at DESC LIMIT 1"), {"r": run_id}).first()
    if row is None:
        return None
    n = int(conn.execute(text("SELECT COUNT(*) FROM flag WHERE run_id = :r AND bulk_id = :b AND undone_at IS NULL"),
                         {"r": run_id, "b": row[0]}).scalar_one())
    return {"bulk_id": row[0], "verdict": row[1], "created_at": row[2], "flagged": n} if n else None


def max_record_id(conn: Connection, run_id: int) -> int:
    return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM record WHERE run_id = :r"),
                            {"r": run_id}).scalar_one())


def bulk_preview(conn: Connection, run_id: int, f: Filters) -> dict[str, Any]:
    """How many records a bulk flag would touch; max_id pins the set (later records are left alone)."""
    max_id = max_record_id(conn, run_id)
    n, _ = count(conn, run_id, f, cap=None, max_id=max_id)
    return {"count": n, "max_id": max_id}


def bulk_flag(read: Engine, write: Engine, run_id: int, f: Filters, verdict: str, reason: str | None,
              note: str | None, max_id: int) -> dict[str, Any]:
    """Flag every record matching `f` (with id <= max_id), in short transactions of BULK_CHUNK records."""
    reason, note = _validate_flag(verdict, reason, note)
    bulk_id = uuid.uuid4().hex[:12]
    by_id = replace(f, sort="id", order="desc")
    after: Cursor | None = None
    n = 0
    while True:
        with read.connect() as conn:
            ids = _select_ids(conn, run_id, by_id, after=after, limit=BULK_CHUNK, max_id=max_id)
        if not ids:
            break
        after = Cursor(None, ids[-1])
        t = store.now()
        with write.connect() as conn, store.write_begin(conn):
            conn.execute(
                text("INSERT INTO flag (run_id, record_id, verdict, reason, note, created_at, bulk_id)"
                     " VALUES (:r, :i, :v, :reason, :note, :t, :b)"),
                [{"r": run_id, "i": i, "v": verdict, "reason": reason, "note": note, "t": t, "b": bulk_id}
                 for i in ids],
            )
            conn.execute(text("UPDATE record SET review = :v, review_reason = :reason, reviewed_at = :t WHERE id = :i"),
                         [{"v": verdict, "reason": reason, "t": t, "i": i} for i in ids])
        n += len(ids)
    return {"bulk_id": bulk_id, "flagged": n, "verdict": verdict, "reason": reason}


def review_counts(conn: Connection, run_id: int) -> dict[str, int]:
    """Flag counts of a run (walks only flagged entries of ix_record_review)."""
    rows = conn.execute(
        text(f"SELECT review, count(*) FROM record{_hint(conn, 'ix_record_review')}"
             " WHERE run_id = :r AND status IN ('ok', 'error', 'timeout') AND review IN ('good', 'bad')"
             " GROUP BY review"), {"r": run_id}).all()
    return {str(r[0]): int(r[1]) for r in rows}


# ----------------------------------------------------------------------------------------- display

# Characters that change how text looks without being seen: zero-width, bidi controls, C0/C1 controls.
_INVISIBLE = re.compile(
    "[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u00ad\u061c\u180e\u034f"
    "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufff9-\ufffb\U000e0000-\U000e007f]"
)
_INVISIBLE_WS = re.compile("(" + _INVISIBLE.pattern[:-1] + r" \t\r\n\u00a0\u2000-\u200a\u3000]+)")
_INVISIBLE_SPLIT = re.compile("(" + _INVISIBLE.pattern + "+)")
_WS_SHOW = {" ": "·", "\t": "→\t", "\n": "↵\n", "\r": "␍", "\u00a0": "⍽", "\u3000": "□"}


def _marker(ch: str) -> str:
    name = unicodedata.name(ch, "")
    abbrev = {
        "\u202e": "RLO", "\u202d": "LRO", "\u202a": "LRE", "\u202b": "RLE", "\u202c": "PDF",
        "\u2066": "LRI", "\u2067": "RLI", "\u2068": "FSI", "\u2069": "PDI", "\u200b": "ZWSP",
        "\u200c": "ZWNJ", "\u200d": "ZWJ", "\u200e": "LRM", "\u200f": "RLM", "\ufeff": "BOM", "\u00ad": "SHY",
    }.get(ch) or name
    return f"⟨U+{ord(ch):04X}{' ' + abbrev if abbrev else ''}⟩"


def segments(value: str, *, whitespace: bool = False) -> list[tuple[str, str]]:
    """Split text into ("t", text) and ("inv", marker) / ("ws", shown) segments for literal display.

    Invisible and bidi-control characters always become visible markers; with `whitespace`, spaces, tabs and
    newlines are shown as · → ↵ too. Templates escape every segment.
    """
    pattern = _INVISIBLE_WS if whitespace else _INVISIBLE
    parts = pattern.split(value) if pattern is _INVISIBLE_WS else _INVISIBLE_SPLIT.split(value)
    out: list[tuple[str, str]] = []
    append = out.append
    # re.split with one capturing group alternates text, match, text, ...
    for n, part in enumerate(parts):
        if not part:
            continue
        if n % 2 == 0:
            append(("t", part))
            continue
        buf: list[str] = []
        for ch in part:
            shown = _WS_SHOW.get(ch)
            if shown is None and "\u2000" <= ch <= "\u200a":
                shown = "␣"
            if shown is not None:
                buf.append(shown)
                continue
            if buf:
                append(("ws", "".join(buf)))
                buf = []
            append(("inv", _marker(ch)))
        if buf:
            append(("ws", "".join(buf)))
    return out


def emptiness(value: str | None) -> str | None:
    """Why a text field counts as empty (None when it has visible content)."""
    if value is None:
        return "EMPTY (null)"
    if value == "":
        return "EMPTY"
    stripped = _INVISIBLE.sub("", value).strip()
    if not stripped:
        return f"EMPTY (only {len(value)} whitespace/invisible characters)"
    return None


def count_invisible(value: str | None) -> int:
    return len(_INVISIBLE.findall(value)) if value else 0
