"""The review vocabulary and what a records filter selects: statuses, reasons, sample modes, the filter
parameters and their SQL, full-text search on SQLite (FTS5) and PostgreSQL (the GIN index of 0003_pg_search)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, cast

from sqlalchemy import literal_column, select, text
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.engine.interfaces import BindTyping
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.expression import FromClause

from ..check_catalog import BIT
from ..quality import selection
from ..quality.selection import WHERE_MAX_CHARS, Catalogue, UnknownCheck, Where, WhereError
from ..store.models import FINISHED_STATUSES, RECORD_STATUSES

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
# the status filter lists finished records first
STATUSES = (*FINISHED_STATUSES, *(s for s in RECORD_STATUSES if s not in FINISHED_STATUSES))
FINISHED = "finished"  # a status filter value: ok, error or timeout (the records table's default view)
STATUS_FILTERS = (FINISHED, *STATUSES)
FLAG_FILTERS = ("good", "bad", "flagged", "unreviewed")
SORTS = ("id", "reasoning_len", "content_len", "completion_tokens", "latency_s")
SEARCH_FIELDS = ("all", "prompt", "reasoning", "content")
PAGE_SIZE = 50
BULK_CHUNK = 2000
COUNT_CAP = 100_000
CHECK_NAME_MAX = 200
RECENT_CAP = 20_000

# Columns the table rows show (never the big texts: previews are cut in SQL).
ROW_COLUMNS = (
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


def check_bits() -> dict[str, int]:
    """name -> bit of the per-record checks, in code order."""
    return BIT


def failed_checks(flags: int | None) -> list[str]:
    if not flags:
        return []
    names = [name for name, bit in check_bits().items() if flags & bit]
    return names or [f"bitmask {flags:#x}"]


# A record fails some check of its run: a built-in bit, or the latest verdict of any other check is 'fail' (every
# name with stored verdicts is in the run's catalogue; ix_check_verdict_record answers both subqueries).
_FAILING_VERDICT = ("EXISTS (SELECT 1 FROM check_verdict fv WHERE fv.record_id = {p}id AND fv.state = 'fail'"
                    " AND NOT EXISTS (SELECT 1 FROM check_verdict lv WHERE lv.record_id = fv.record_id"
                    " AND lv.check_name = fv.check_name AND lv.id > fv.id))")


def has_verdict_checks(conn: Connection | None, run_id: int | None) -> bool:
    """Whether the run's catalogue holds a check beyond the built-in bits (configured or with stored verdicts)."""
    return conn is not None and run_id is not None and bool(selection.catalogue(conn, run_id).extended)


def failing_any_sql(conn: Connection | None, run_id: int | None, alias: str = "", passing: bool = False) -> str:
    """The records filter's "failing a check" (``passing``: "passing all"): any check the run's catalogue knows,
    built-in (the record's bits) or not (its latest verdict is fail; pending and error are not failures). A run
    with only built-in checks reads the bits alone, as ix_record_failing serves it."""
    bits = f"{alias}check_flags = 0" if passing else f"{alias}check_flags != 0"
    if not has_verdict_checks(conn, run_id):
        return bits
    verdict = _FAILING_VERDICT.format(p=alias or "record.")  # qualified: a bare id would be the verdict's
    return f"({bits} AND NOT {verdict})" if passing else f"({bits} OR {verdict})"


def failing_verdicts(conn: Connection, ids: list[int]) -> dict[int, list[str]]:
    """record id -> the checks beyond the built-in bits whose latest verdict for it is fail (names in order), for
    the records table's checks column. One query per page of ids."""
    out: dict[int, list[str]] = {}
    if not ids:
        return out
    params = {f"i{n}": i for n, i in enumerate(ids)}
    rows = conn.execute(text(
        "SELECT fv.record_id, fv.check_name FROM check_verdict fv WHERE fv.record_id IN ("
        + ", ".join(f":{k}" for k in params) + ") AND fv.state = 'fail' AND NOT EXISTS (SELECT 1 FROM check_verdict lv"
        " WHERE lv.record_id = fv.record_id AND lv.check_name = fv.check_name AND lv.id > fv.id)"
        " ORDER BY fv.record_id, fv.check_name"), params)
    for rid, name in rows:
        out.setdefault(int(rid), []).append(str(name))
    return out


def needs_catalogue(f: Filters) -> bool:
    """Whether the filter names a check the record's bits do not answer (an extended check, the judge, an alias) or
    gives an expression: both are resolved in the run's catalogue."""
    return bool(f.where) or (bool(f.check) and f.check not in ("any", "none") and f.check not in check_bits())


def selections(conn: Connection, run_id: int, f: Filters, cat: Catalogue | None = None) -> list[Where]:
    """The filter's `check` (records failing it) and `where` as expressions resolved in the run's catalogue (one
    catalogue, synthwatch.quality.selection: the same names and "did you mean" as the export and the CLI).
    ReviewError names the parameter, the problem and its column."""
    if not needs_catalogue(f):
        return []
    cat = cat or selection.catalogue(conn, run_id)
    out: list[Where] = []
    if f.check and f.check not in ("any", "none") and f.check not in check_bits():
        try:
            out.append(selection.check_is(cat, f.check, "fail"))
        except (UnknownCheck, WhereError) as exc:
            raise ReviewError(f"check: {exc}") from None
    if f.where:
        try:
            out.append(selection.parse_where(f.where, cat))
        except WhereError as exc:
            raise ReviewError(f"where: {exc}") from None
    return out


def resolve(conn: Connection, run_id: int, f: Filters) -> Filters:
    """The filter checked against the run's catalogue before it is used (a repair's selection): an unknown check or
    a bad expression raises ReviewError here, not in the middle of the work. The filter comes back with canonical
    check names and the expression's normalised text (Where.text: names, keywords, operators and parentheses only),
    which is what a repair row records."""
    found = selections(conn, run_id, f)
    changes: dict[str, Any] = {}
    if f.check and f.check not in ("any", "none") and f.check not in check_bits():
        changes["check"] = found.pop(0).names[0]
    if f.where:
        changes["where"] = found.pop(0).text
    return replace(f, **changes) if changes else f


_NAMED: dict[type[Dialect], Dialect] = {}
_BIND = re.compile(r"(?<![:\w]):(\w+)")


def clause_sql(conn: Connection, record: FromClause, clause: ColumnElement[Any], params: dict[str, Any]) -> str:
    """An SQLAlchemy clause over ``record`` (the table or its alias) as text for this module's raw SQL: its values
    stay bound (added to ``params`` under names of their own), never written into the SQL. It is compiled inside a
    query over ``record``, so that its subqueries correlate with the outer row instead of adding a FROM of their
    own, and the text after that query's WHERE is the condition."""
    kind = type(conn.dialect)
    if kind not in _NAMED:
        d: Any = cast(Any, kind)(paramstyle="named")
        d.bind_typing = BindTyping.NONE  # no `::TYPE` after a name: text() would not see it as a parameter
        _NAMED[kind] = d
    compiled = select(literal_column("1")).select_from(record).where(clause).compile(dialect=_NAMED[kind])
    head, sep, cond = str(compiled).partition("\nWHERE ")
    assert sep and "WHERE" not in head, str(compiled)
    names: dict[str, str] = {}
    for key, value in compiled.params.items():
        names[key] = f"sel{len(params)}_{key}"
        params[names[key]] = value
    return _BIND.sub(lambda m: ":" + names.get(m.group(1), m.group(1)), cond)


# ----------------------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    check: str | None = None  # "any" | "none" | any check name of the run's catalogue (synthwatch.quality.selection)
    where: str | None = None  # a selection expression over the run's checks (quality.selection.parse_where)
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
            "status": STATUS_FILTERS,
            "flag": FLAG_FILTERS,
            "reason": REASON_CODES,
            "field": SEARCH_FIELDS,
            "sort": SORTS,
            "order": ("asc", "desc"),
        }
        for name, allowed in choices.items():
            if name in values and values[name] not in allowed:
                raise ReviewError(f"{name}: unknown value {values[name][:40]!r} (one of {', '.join(allowed)})")
        # a check name or an expression is resolved against the run's catalogue where the run is known
        # (:func:`resolve`, :func:`conditions`); here only its size is bounded
        if len(values.get("check") or "") > CHECK_NAME_MAX:
            raise ReviewError(f"check: a check name is at most {CHECK_NAME_MAX} characters")
        if len(values.get("where") or "") > WHERE_MAX_CHARS:
            raise ReviewError(f"where: the expression is longer than {WHERE_MAX_CHARS} characters")
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


def sort_expr(f: Filters) -> str:
    return "id" if f.sort == "id" else f"COALESCE({f.sort}, -1)"


def conditions(f: Filters, params: dict[str, Any], alias: str = "", conn: Connection | None = None,
               run_id: int | None = None) -> list[str]:
    """SQL conditions of a filter over ``record`` (``alias``: "r." when it is joined as r). A check the bits do not
    answer, or an expression, needs the run (``conn``, ``run_id``) to resolve its names."""
    p = alias
    conds: list[str] = []
    if f.status == FINISHED:
        conds.append(f"{p}status IN ({', '.join(repr(x) for x in FINISHED_STATUSES)})")
    elif f.status:
        conds.append(f"{p}status = :status")
        params["status"] = f.status
    if f.check in ("any", "none"):
        conds.append(failing_any_sql(conn, run_id, p, f.check == "none"))
    elif f.check in check_bits():
        conds.append(f"({p}check_flags & :check_bit) != 0")
        params["check_bit"] = check_bits()[f.check]
    if needs_catalogue(f):
        if conn is None or run_id is None:
            raise ReviewError("check: a check of the run's catalogue needs the run")
        rec = selection.RECORD.alias(p.rstrip(".")) if p else selection.RECORD
        for w in selections(conn, run_id, f):
            conds.append("(" + clause_sql(conn, rec, selection.where_clause(w, rec), params) + ")")
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


def index_hint(conn: Connection, index: str) -> str:
    return f" INDEXED BY {index}" if conn.dialect.name == "sqlite" else ""


def search_supported(conn: Connection) -> bool:
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


def pg_search_conds(conn: Connection, f: Filters, params: dict[str, Any]) -> list[str]:
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


def pg_search_windows(conn: Connection, run_id: int, conds: list[str], params: dict[str, Any], limit: int,
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
    else:  # a few hundred ids: test each row, no index (OFFSET 0 keeps the planner from pushing the test down);
        # named `record` like the table, so a condition naming record.id (a check's verdict subquery) reads its row
        sql = (f"SELECT id FROM (SELECT * FROM record WHERE run_id = :run AND id >= :w_lo AND id < :w_hi"
               f" OFFSET 0) AS record WHERE {where} ORDER BY id {direction} LIMIT :need")
    return [int(r[0]) for r in conn.execute(text(sql), {**params, "w_lo": w_lo, "w_hi": w_hi, "need": need})]
