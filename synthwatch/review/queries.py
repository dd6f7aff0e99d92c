"""Review queries: keyset pages of the records table, counts, random samples, one record and its JSON (what a
filter selects is filters.py; verdicts are flags.py).

Every query is answered from an index (see migration 0002_review): at 1M records each row carries
kilobytes of reasoning in overflow pages, so a query that reads table rows to evaluate a filter is slow.
The records table walks ``ix_record_filter`` (a narrow copy of every filter column in id order) and
stops after one page; random samples seek a random ``rnd`` in an index and take the next entry
(wrapping around), O(log n).

Model text is never interpreted here: display helpers return (kind, text) segments that templates
escape one by one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..store import queue as store
from ..store.models import FINISHED_STATUSES
from .filters import (
    COUNT_CAP,
    FINISHED,
    PAGE_SIZE,
    RECENT_CAP,
    ROW_COLUMNS,
    SAMPLE_MODE_CODES,
    STATUSES,
    VERDICTS,
    Filters,
    NotFound,
    ReviewError,
    check_bits,
    conditions,
    failed_checks,
    failing_verdicts,
    fts_query,
    has_verdict_checks,
    index_hint,
    pg_search_conds,
    pg_search_windows,
    search_supported,
    sort_expr,
)


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
    statuses = list(FINISHED_STATUSES) if f.status == FINISHED else [f.status] if f.status else list(STATUSES)
    status_in = "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"
    candidates: list[tuple[str, list[str]]] = []
    if others:
        return "ix_record_filter", []
    if f.flag in VERDICTS and not f.check:
        candidates.append(("ix_record_review", [status_in, f"review = '{f.flag}'"]))
    elif f.flag == "flagged" and not f.check:
        candidates.append(("ix_record_review", [status_in, "review IS NOT NULL"]))
    if ((f.check == "any" and not has_verdict_checks(conn, run_id)) or f.check in check_bits()) and not f.flag:
        # a check of record.check_flags ("any" also reads the verdicts of a run with other checks)
        candidates.append(("ix_record_failing", [status_in, "check_flags != 0"]))
    for index, conds in candidates:
        probe = (f"SELECT count(*) FROM (SELECT 1 FROM record INDEXED BY {index} WHERE run_id = :run AND "
                 f"{' AND '.join(conds)} LIMIT {SPARSE_PROBE + 1}) AS p")
        if int(conn.execute(text(probe), {"run": run_id}).scalar_one()) <= SPARSE_PROBE:
            return index, conds
    return "ix_record_filter", []


def select_ids(
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
    conds = [f"{alias}run_id = :run", *index_conds, *conditions(f, params, alias, conn, run_id)]
    if max_id is not None:
        conds.append(f"{alias}id <= :max_id")
        params["max_id"] = max_id
    descending = f.order == "desc"
    reverse = before is not None
    cursor = before if reverse else after
    step_down = descending != reverse  # walking toward smaller keys
    sort = sort_expr(f)
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
        conds += pg_search_conds(conn, f, params)
        if f.sort == "id":
            # conds[0] is the run condition: the windows write it themselves (a form no index can use, at times)
            ids = pg_search_windows(conn, run_id, conds[1:], params, limit, step_down)
            return ids[::-1] if reverse else ids
        sql = f"SELECT id FROM record WHERE {' AND '.join(conds)} ORDER BY {order} LIMIT :limit"
    elif f.q:
        if not search_supported(conn):
            raise ReviewError("q: full-text search needs SQLite or PostgreSQL")
        params["match"] = fts_query(f.q, f.field)
        if f.sort == "id":
            # FTS5 yields rowids in order: walk it newest-first and stop after one page.
            order = f"f.rowid {direction}"
            conds = [c.replace("r.id ", "f.rowid ") if c.startswith("r.id ") else c for c in conds]
        sql = (
            f"SELECT r.id FROM record_fts f CROSS JOIN record r{index_hint(conn, 'ix_record_filter')}"
            f" ON r.run_id = :run AND r.id = f.rowid WHERE f.record_fts MATCH :match AND {' AND '.join(conds)}"
            f" ORDER BY {order} LIMIT :limit"
        )
    else:
        sql = (
            f"SELECT id FROM record{index_hint(conn, index)} WHERE {' AND '.join(conds)}"
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
        text(f"SELECT {ROW_COLUMNS} FROM record WHERE id IN ({marks})"), params).mappings()}
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
    ids = select_ids(conn, run_id, f, after=a, before=b, limit=limit + 1)
    more = len(ids) > limit
    if b is not None:
        ids = ids[-limit:] if more else ids
    else:
        ids = ids[:limit]
    rows = _rows(conn, ids)
    verdicts = failing_verdicts(conn, ids)  # every failing check, not only the bits (#38)
    for row in rows:
        row["failed_checks"] = failed_checks(row["check_flags"]) + verdicts.get(row["id"], [])
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
        conds = ["run_id = :run", *conditions(f, params, "", conn, run_id), *pg_search_conds(conn, f, params),
                 *extra]
        if max_id is not None:
            conds.append("id <= :max_id")
        inner = f"SELECT {cols} FROM record WHERE {' AND '.join(conds)}"
    elif f.q:
        if not search_supported(conn):
            raise ReviewError("q: full-text search needs SQLite or PostgreSQL")
        conds = ["r.run_id = :run", *conditions(f, params, "r.", conn, run_id), *extra]
        params["match"] = fts_query(f.q, f.field)
        inner = (
            f"SELECT {cols} FROM record_fts f CROSS JOIN record r{index_hint(conn, 'ix_record_filter')}"
            f" ON r.run_id = :run AND r.id = f.rowid WHERE f.record_fts MATCH :match AND {' AND '.join(conds)}"
        )
        if max_id is not None:
            inner += " AND r.id <= :max_id"
    else:
        index, index_conds = _sparse_index(conn, run_id, f)
        conds = ["run_id = :run", *index_conds, *conditions(f, params, "", conn, run_id), *extra]
        if max_id is not None:
            conds.append("id <= :max_id")
        inner = f"SELECT {cols} FROM record{index_hint(conn, index)} WHERE {' AND '.join(conds)}"
    if max_id is not None:
        params["max_id"] = max_id
    return inner, params


def neighbours(conn: Connection, run_id: int, f: Filters, row: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(previous, next) record ids around `row` in the filtered, sorted set."""
    cur = Cursor.of(row, f)
    prev_ids = select_ids(conn, run_id, f, before=cur, limit=1)
    next_ids = select_ids(conn, run_id, f, after=cur, limit=1)
    return (prev_ids[0] if prev_ids else None), (next_ids[0] if next_ids else None)


def distinct_values(conn: Connection, run_id: int, column: str, recent: int = 5000) -> list[str]:
    """Values for a filter drop-down: the usual ones plus those seen in the run's latest `recent` records
    (a bounded walk of the filter index; a full DISTINCT would scan every record)."""
    assert column in ("finish_reason", "endpoint", "reasoning_source")
    known: set[str] = set()
    if column == "finish_reason":
        known = {"stop", "length"}
    elif column == "reasoning_source":
        from ..capture.reasoning import SOURCES

        known = set(SOURCES)
    rows = conn.execute(
        text(f"SELECT DISTINCT {column} FROM (SELECT {column} FROM record{index_hint(conn, 'ix_record_filter')}"
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
        groups.append(f"SELECT id, rnd FROM record{index_hint(conn, 'ix_record_sample')}"
                      " WHERE run_id = :run AND status = 'ok' AND rnd >= :x ORDER BY rnd LIMIT 2")
    elif mode == "unreviewed":
        groups.append(f"SELECT id, rnd FROM record{index_hint(conn, 'ix_record_review')}"
                      " WHERE run_id = :run AND status = 'ok' AND review IS NULL AND rnd >= :x ORDER BY rnd LIMIT 2")
    elif mode == "flagged":
        # The union of several index ranges, each ordered by rnd: the first entry >= x over all of them
        # is a uniform sample of the union.
        for status in ("ok", "error", "timeout"):
            for verdict in VERDICTS:
                groups.append(
                    f"SELECT id, rnd FROM record{index_hint(conn, 'ix_record_review')} WHERE run_id = :run"
                    f" AND status = '{status}' AND review = '{verdict}' AND rnd >= :x ORDER BY rnd LIMIT 2"
                )
    elif check and check != "any" and check not in check_bits():
        # a check of the run's catalogue with stored verdicts (#38: user:*, rule:*, verifiers, language, the judge):
        # ok records in rnd order, each tested by its latest verdict (an unknown name: ReviewError, did you mean)
        cond = " AND ".join(conditions(Filters(check=check), params, "", conn, run_id))
        groups.append(f"SELECT id, rnd FROM record{index_hint(conn, 'ix_record_sample')}"
                      f" WHERE run_id = :run AND status = 'ok' AND {cond} AND rnd >= :x ORDER BY rnd LIMIT 2")
    else:  # failing
        bit = ""
        if check and check != "any":
            bit = " AND (check_flags & :bit) != 0"
            params["bit"] = check_bits()[check]
        for status in ("ok", "error", "timeout"):  # some checks (timeout, error) judge failed records
            groups.append(f"SELECT id, rnd FROM record{index_hint(conn, 'ix_record_failing')}"
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
    flagged = int(conn.execute(text(f"SELECT count(*) FROM record{index_hint(conn, 'ix_record_review')}"
                                    " WHERE run_id = :r AND status = 'ok' AND review IN ('good', 'bad')"),
                               {"r": run["id"]}).scalar_one())
    return max(0, int(run["n_ok"]) - flagged)


def _sample_recent(conn: Connection, run_id: int, minutes: float, rng: random.Random,
                   exclude: int | None) -> int | None:
    """A uniform pick among the records finished in the last `minutes` (the newest RECENT_CAP of them when
    there are more), walking only ix_record_finished (records of other statuses are stepped over)."""
    if not 0 < minutes <= 7 * 24 * 60:
        raise ReviewError(f"minutes: must be between 0 and 10080 (got {minutes})")
    hint = index_hint(conn, "ix_record_finished")
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


_WINDOWED = ("reasoning", "content")


def get_record(conn: Connection, run_id: int, record_id: int, window: int | None = None) -> dict[str, Any]:
    """A record's row. With ``window``, its reasoning and content are cut to their first ``window`` characters by the
    database (the record page, #34: a 60 MB answer is not read whole), and ``reasoning_chars`` / ``content_chars``
    hold their full lengths."""
    cols = "*"
    if window is not None:  # one character past the window says whether there is more (no length() of 60 MB)
        names = [c for c in conn.execute(text("SELECT * FROM record WHERE false")).keys() if c not in _WINDOWED]
        cols = ", ".join(names + [f"substr({c}, 1, {int(window) + 1}) AS {c}" for c in _WINDOWED])
    row = conn.execute(text(f"SELECT {cols} FROM record WHERE id = :i AND run_id = :r"),
                       {"i": record_id, "r": run_id}).mappings().first()
    if row is None:
        raise NotFound(f"no record {record_id} in run {run_id}")
    out = dict(row)
    if window is not None:
        for c in _WINDOWED:
            v = out[c]
            out[f"{c}_chars"] = len(v or "")
            if v is not None and len(v) > window:  # the stored length (the writer's), at least one past the window
                out[c], out[f"{c}_chars"] = v[:window], max(int(out.get(f"{c}_len") or 0), window + 1)
    return out


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
