"""Another program's output as a run (``synthwatch watch`` / ``synthwatch import``): the run, and the Ingestor that
commits lines as records. Reading the files (following, importing) is follow.py.

Exactly-once: the records parsed from a batch of complete lines, the counters, the series and the
file's new offset are committed in ONE transaction, so after a kill -9 the stored offset says
exactly which lines are in the database. A record's ``idx`` is the line's sequence number within
the run (lines consumed by earlier commits + position in the batch), so the run's UNIQUE
(run_id, idx) constraint refuses a line that would ever be stored twice.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from ..store import queue as store
from ..store import search_index
from ..workers.results import Outcome
from ..workers.series import SERIES_WIDTH_S, SeriesAccumulator, record_columns
from ..workers.writer import WriterHook
from .ingest import LineError, LineParser, Parsed

log = logging.getLogger("synthwatch.watch")


WATCH_ENDPOINT = "watch"  # endpoint label of watched records (series rows, record.endpoint)
MAX_ERRORS_STORED = 10_000  # per run: a file of garbage must not fill the database with copies of it
READ_CHUNK = 4 << 20


class WatchError(Exception):
    """A user-facing problem (wrong run kind, two watchers on one file, unreadable file)."""


@dataclass
class Source:
    """Mirror of an ``ingest_source`` row."""

    id: int
    path: str
    dev: int | None
    inode: int | None
    offset: int
    line_no: int
    size: int
    shape: str | None
    n_ingested: int
    n_bad: int


@dataclass(slots=True)
class Line:
    no: int  # 1-based line number in the current file
    raw: bytes
    end: int  # byte offset just after this line


@dataclass
class BatchResult:
    ok: int = 0
    error: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)


def watch_config(name: str, path: str, *, model: str | None = None, expect_reasoning: bool = True,
                 reasoning_mode: str = "auto") -> Any:
    """The RunConfig a watched run stores (checks read reasoning.expect etc. from it)."""
    from ..config import RunConfig

    data: dict[str, Any] = {
        "name": name,
        "dataset": {"path": path},
        "endpoints": [{"base_url": "http://127.0.0.1/v1", "name": WATCH_ENDPOINT}],
        "model": model or "unknown",
        "concurrency": 1,
        "reasoning": {"mode": reasoning_mode, "expect": expect_reasoning},
    }
    try:
        from ..check_catalog import DEFAULT_RULES
    except ImportError:
        DEFAULT_RULES = {}  # noqa: N806
    # Pausing a watch cannot stop the other program's generation; it would only hold back what the
    # dashboard shows. Alarms still fire; auto-pause is off (the user can switch it on per rule).
    rules = {n: {"auto_pause": False} for n, r in DEFAULT_RULES.items() if getattr(r, "auto_pause", False)}
    if rules:
        data["checks"] = {"rules": rules}
    return RunConfig.model_validate(data)


def stored_checks(engine: Engine, name: str) -> dict[str, Any] | None:
    """The `[checks]` table stored with an existing run of this name (its settings may have changed since it was
    created: `synthwatch checks RUN --config`), or None for a new run."""
    with engine.connect() as conn:
        row = conn.execute(text("SELECT config_json FROM run WHERE name = :n"), {"n": name}).first()
        conn.rollback()
    if row is None or not row[0]:
        return None
    checks = (orjson.loads(row[0]) or {}).get("checks")
    return checks if isinstance(checks, dict) else None


def check_hooks(engine: Engine, run_id: int, config: Any) -> list[WriterHook]:
    """The same data-quality hooks a generation run gets."""
    from ..quality.live import writer_hooks

    return list(writer_hooks(engine, run_id, config))


def open_run(engine: Engine, name: str, config: Any, *, status_message: str) -> tuple[int, bool]:
    """Find or create the watched run and mark it running. Returns (run_id, existed)."""
    with engine.connect() as conn, store.write_begin(conn):
        row = conn.execute(text("SELECT id, kind FROM run WHERE name = :n"), {"n": name}).first()
        if row is not None and row[1] != "watch":
            raise WatchError(f"run {name!r} is a {row[1]} run, not a watched one: choose another --run name")
        if row is None:
            run_id = store.create_run(conn, name, config, kind="watch")
            existed = False
        else:
            run_id = int(row[0])
            existed = True
            conn.execute(text("UPDATE run SET desired = 'run' WHERE id = :r"), {"r": run_id})
        store.set_status(conn, run_id, "running", status_message)
        store.add_event(conn, run_id, "watch_start", None, actor="watch", detail=status_message)
    return run_id, existed


def finish_run(engine: Engine, run_id: int, status: str, message: str) -> None:
    with engine.connect() as conn, store.write_begin(conn):
        store.set_status(conn, run_id, status, message)
        conn.execute(text("UPDATE run SET desired = 'run' WHERE id = :r AND desired != 'run'"), {"r": run_id})


class Ingestor:
    """Commits batches of lines of one run: records, errors, counters, series and offsets together."""

    def __init__(self, engine: Engine, run_id: int, parser: LineParser, *, hooks: list[WriterHook] | None = None,
                 arrival: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.run_id = run_id
        self.parser = parser
        self.hooks = hooks or []
        self.arrival = arrival
        self.rng = random.Random()
        # the worker writer's series accumulation (workers/series.py), seeded from the stored rows at each batch
        self._series = SeriesAccumulator(run_id, 0)
        self.total_ok = 0
        self.total_error = 0
        self.total_bad = 0
        self.busy_retry_s = 120.0  # a locked database is waited for this long before giving up

    # ------------------------------------------------------------------ sources

    def source(self, path: str) -> Source:
        with self.engine.connect() as conn, store.write_begin(conn):
            row = conn.execute(text("SELECT * FROM ingest_source WHERE run_id = :r AND path = :p"),
                               {"r": self.run_id, "p": path}).mappings().first()
            if row is None:
                conn.execute(text("INSERT INTO ingest_source (run_id, path, \"offset\", line_no, size, n_ingested,"
                                  " n_bad, updated_at) VALUES (:r, :p, 0, 0, 0, 0, 0, :t)"),
                             {"r": self.run_id, "p": path, "t": time.time()})
                row = conn.execute(text("SELECT * FROM ingest_source WHERE run_id = :r AND path = :p"),
                                   {"r": self.run_id, "p": path}).mappings().one()
        return Source(row["id"], row["path"], row["dev"], row["inode"], row["offset"], row["line_no"], row["size"],
                      row["shape"], row["n_ingested"], row["n_bad"])

    def reposition(self, src: Source, *, dev: int | None, inode: int | None, offset: int, line_no: int,
                   size: int, event: str | None = None, detail: str | None = None) -> None:
        """Point the source at another file / position (new file, rotation, truncation, --from-end)."""
        with self.engine.connect() as conn, store.write_begin(conn):
            self._check_position(conn, src)
            conn.execute(text("UPDATE ingest_source SET dev = :d, inode = :i, \"offset\" = :o, line_no = :l, size = :s,"
                              " updated_at = :t WHERE id = :id"),
                         {"d": dev, "i": inode, "o": offset, "l": line_no, "s": size, "t": time.time(),
                          "id": src.id})
            if event:
                store.add_event(conn, self.run_id, event, src.path, actor="watch", detail=detail)
        src.dev, src.inode, src.offset, src.line_no, src.size = dev, inode, offset, line_no, size

    def touch(self, src: Source, size: int) -> None:
        """Record the file's size now and then (the dashboard can show how far behind we are)."""
        try:
            with self.engine.connect() as conn, store.write_begin(conn):
                conn.execute(text("UPDATE ingest_source SET size = :s, updated_at = :t WHERE id = :id"),
                             {"s": size, "t": time.time(), "id": src.id})
                conn.execute(text("UPDATE run SET updated_at = :t WHERE id = :r"),
                             {"t": time.time(), "r": self.run_id})
        except OperationalError as exc:  # only informative: the next touch will do
            log.warning("could not record the file size: %s", exc.orig)
            return
        src.size = size

    def _check_position(self, conn: Connection, src: Source) -> None:
        row = conn.execute(text("SELECT \"offset\", inode FROM ingest_source WHERE id = :id"), {"id": src.id}).first()
        if row is None or row[0] != src.offset or row[1] != src.inode:
            raise WatchError(f"{src.path}: another synthwatch process is reading this file into the same run "
                             f"(its stored position moved); stop one of them")

    def desired(self) -> str:
        with self.engine.connect() as conn:
            v = conn.execute(text("SELECT desired FROM run WHERE id = :r"), {"r": self.run_id}).scalar()
            conn.rollback()
        return str(v or "run")

    def set_status(self, status: str, message: str | None = None) -> None:
        with self.engine.connect() as conn, store.write_begin(conn):
            store.set_status(conn, self.run_id, status, message)

    # ------------------------------------------------------------------ batches

    def commit(self, src: Source, lines: list[Line], *, size: int, display_path: str | None = None) -> BatchResult:
        """Ingest complete lines and move the source's offset past them, atomically."""
        res = BatchResult()
        if not lines:
            return res
        where = display_path or src.path
        parsed: list[tuple[Line, Parsed]] = []
        bad: list[tuple[Line, str]] = []
        for ln in lines:
            raw = ln.raw.rstrip(b"\r")
            if ln.no == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                parsed.append((ln, self.parser.parse(raw)))
            except LineError as exc:
                bad.append((ln, str(exc)))
            except (ValueError, TypeError, RecursionError) as exc:  # a line must never stop the watcher
                bad.append((ln, f"unreadable: {exc.__class__.__name__}: {exc}"))
        now = self.arrival()
        started = time.monotonic()
        backoff = 0.2
        while True:
            try:
                return self._commit(src, lines, parsed, bad, size=size, where=where, now=now)
            except OperationalError as exc:
                msg = str(exc.orig).lower()
                if not ("locked" in msg or "busy" in msg) or time.monotonic() - started > self.busy_retry_s:
                    raise
                log.warning("database busy, retrying the batch: %s", exc.orig)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _commit(self, src: Source, lines: list[Line], parsed: list[tuple[Line, Parsed]], bad: list[tuple[Line, str]],
                *, size: int, where: str, now: float) -> BatchResult:
        res = BatchResult()
        last = lines[-1]
        with self.engine.connect() as conn, store.write_begin(conn):
            self._check_position(conn, src)
            base = int(conn.execute(
                text("SELECT COALESCE(SUM(n_ingested + n_bad), 0) FROM ingest_source WHERE run_id = :r"),
                {"r": self.run_id}).scalar_one())
            # idx follows line order (good and bad lines), so it is the same whoever replays the batch
            order = sorted([(ln.no, "p", i) for i, (ln, _) in enumerate(parsed)]
                           + [(ln.no, "b", i) for i, (ln, _) in enumerate(bad)])
            idx_of_parsed: dict[int, int] = {}
            for k, (_, kind, i) in enumerate(order):
                if kind == "p":
                    idx_of_parsed[i] = base + k
            outcomes = [self._outcome(idx_of_parsed[i], p, now) for i, (_, p) in enumerate(parsed)]
            if outcomes:
                rows = [self._row(o, p, ln, where) for o, (ln, p) in zip(outcomes, parsed, strict=True)]
                conn.execute(_INSERT, rows)
                ids: dict[int, int] = dict(conn.execute(
                    text("SELECT idx, id FROM record WHERE run_id = :r AND idx >= :lo AND idx < :hi"),
                    {"r": self.run_id, "lo": base, "hi": base + len(order)}).all())
                for o in outcomes:
                    o.record_id = ids[o.idx]
                search_index.enqueue(conn, [ids[r["idx"]] for r in rows
                                            if r["reasoning"] is not None or r["content"] is not None])
                if self.hooks:
                    for hook in self.hooks:
                        hook.on_outcomes(outcomes)
                    flagged = [{"id": o.record_id, "f": o.check_flags, "j": o.check_json}
                               for o in outcomes if o.check_flags or o.check_json]
                    if flagged:
                        conn.execute(text("UPDATE record SET check_flags = :f, check_json = :j WHERE id = :id"),
                                     flagged)
            if bad:
                stored = int(conn.execute(text("SELECT COUNT(*) FROM ingest_error WHERE run_id = :r"),
                                          {"r": self.run_id}).scalar_one())
                room = max(0, MAX_ERRORS_STORED - stored)
                if room:
                    conn.execute(
                        text("INSERT INTO ingest_error (run_id, path, line, reason, sample, t)"
                             " VALUES (:r, :p, :l, :reason, :s, :t)"),
                        [{"r": self.run_id, "p": where, "l": ln.no, "reason": reason,
                          "s": ln.raw[:500].decode("utf-8", "replace"), "t": now} for ln, reason in bad[:room]],
                    )
            t = time.time()
            self._write_series(conn, outcomes)
            for hook in self.hooks:
                hook.on_flush(conn, t)
            res.ok = sum(1 for o in outcomes if o.status == "ok")
            res.error = len(outcomes) - res.ok
            conn.execute(
                text("UPDATE ingest_source SET \"offset\" = :o, line_no = :l, size = :s, shape = :shape,"
                     " n_ingested = n_ingested + :n, n_bad = n_bad + :b, updated_at = :t WHERE id = :id"),
                {"o": last.end, "l": last.no, "s": size, "shape": self.parser.dominant, "n": len(outcomes),
                 "b": len(bad), "t": t, "id": src.id},
            )
            conn.execute(
                text("UPDATE run SET total = total + :n, n_ok = n_ok + :ok, n_error = n_error + :err,"
                     " updated_at = :t WHERE id = :r"),
                {"n": len(outcomes), "ok": res.ok, "err": res.error, "t": t, "r": self.run_id},
            )
        src.offset, src.line_no, src.size = last.end, last.no, size
        src.n_ingested += len(outcomes)
        src.n_bad += len(bad)
        src.shape = self.parser.dominant
        res.bad = [(ln.no, reason) for ln, reason in bad]
        self.total_ok += res.ok
        self.total_error += res.error
        self.total_bad += len(bad)
        return res

    def _outcome(self, idx: int, p: Parsed, now: float) -> Outcome:
        return Outcome(record_id=0, idx=idx, status=p.status, messages=p.messages, extracted=p.extracted,
                       error_kind=p.error_kind, error=p.error, endpoint=WATCH_ENDPOINT, latency_s=p.latency_s,
                       finished_at=p.timestamp if p.timestamp is not None else now)

    def _row(self, o: Outcome, p: Parsed, ln: Line, where: str) -> dict[str, Any]:
        ex = p.extracted
        row: dict[str, Any] = {
            "run_id": self.run_id, "idx": o.idx, "source_id": p.source_id, "source_line": ln.no,
            "rnd": self.rng.random(), "prompt": orjson.dumps(p.messages).decode(), "status": o.status,
            "latency_s": o.latency_s, "error_kind": o.error_kind, "error": o.error, "endpoint": WATCH_ENDPOINT,
            "finished_at": o.finished_at,
        }
        cols = record_columns(ex, {"ingest": {"path": where, "line": ln.no, "shape": p.shape}})
        cols["extra"] = cols.pop("extra_json")
        row.update(cols)
        return row

    # ------------------------------------------------------------------ series

    def _write_series(self, conn: Connection, outcomes: list[Outcome]) -> None:
        """The writer's per-bucket accumulation, seeded from the stored rows.

        Seeding (instead of keeping buckets in memory like the worker's writer) keeps counts right
        across a restart of `watch` and for old timestamps read from a file's records."""
        keys = {(o.endpoint or "", int(o.finished_at // SERIES_WIDTH_S) * SERIES_WIDTH_S) for o in outcomes}
        self._series.load(conn, keys)
        touched = self._series.add(outcomes, [])
        self._series.write(conn, list(touched.values()))


_INSERT_COLS = (
    "run_id", "idx", "source_id", "source_line", "rnd", "prompt_json", "status", "reasoning", "content",
    "content_null", "reasoning_source", "reasoning_len", "content_len", "finish_reason", "prompt_tokens",
    "completion_tokens", "reasoning_tokens", "reasoning_tokens_source", "usage_json", "token_ids_json", "latency_s",
    "attempts", "error_kind",
    "error", "endpoint", "model", "system_fingerprint", "response_id", "extra_json", "finished_at", "check_flags",
    "gen_version", "derive_version",
)
_INSERT = text(
    f"INSERT INTO record ({', '.join(_INSERT_COLS)}) VALUES (:run_id, :idx, :source_id, :source_line, :rnd,"
    " :prompt, :status, :reasoning, :content, :content_null, :reasoning_source, :reasoning_len, :content_len,"
    " :finish_reason, :prompt_tokens, :completion_tokens, :reasoning_tokens, :reasoning_tokens_source,"
    " :usage_json, :token_ids_json,"
    " :latency_s, 0, :error_kind, :error, :endpoint, :model, :system_fingerprint, :response_id, :extra,"
    " :finished_at, 0, (SELECT config_version FROM run WHERE id = :run_id),"
    " (SELECT config_version FROM run WHERE id = :run_id))"
)


# ============================================================================ following


def split_lines(data: bytes, start_offset: int, first_no: int, *, final: bool) -> list[Line]:
    """Complete lines of ``data`` read at ``start_offset``; with ``final`` a trailing partial line too."""
    out: list[Line] = []
    pos = 0
    no = first_no
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        if nl < 0:
            if final:
                no += 1
                out.append(Line(no, data[pos:], start_offset + n))
            break
        no += 1
        out.append(Line(no, data[pos:nl], start_offset + nl + 1))
        pos = nl + 1
    return out
