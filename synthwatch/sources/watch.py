"""Following JSONL files another program writes (``synthwatch watch``) and importing finished ones.

Exactly-once: the records parsed from a batch of complete lines, the counters, the series and the
file's new offset are committed in ONE transaction, so after a kill -9 the stored offset says
exactly which lines are in the database. A record's ``idx`` is the line's sequence number within
the run (lines consumed by earlier commits + position in the batch), so the run's UNIQUE
(run_id, idx) constraint refuses a line that would ever be stored twice.

Following works like ``tail -F`` by polling: complete lines are read with ``pread`` from the
stored offset (a half-written last line is simply not consumed yet); the file's (dev, inode) is
compared with the path's on every idle poll: a rename + new file is detected, the old file is
finished through the still-open descriptor, then the new file is read from its start; a file
that shrinks below the offset (truncation, copytruncate rotation) is read again from 0.
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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
_READ_CHUNK = 4 << 20


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


def check_hooks(engine: Engine, run_id: int, config: Any) -> list[WriterHook]:
    """The same data-quality hooks a generation run gets."""
    from ..quality.checks import writer_hooks

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
    "completion_tokens", "reasoning_tokens", "usage_json", "token_ids_json", "latency_s", "attempts", "error_kind",
    "error", "endpoint", "model", "system_fingerprint", "response_id", "extra_json", "finished_at", "check_flags",
    "gen_version", "derive_version",
)
_INSERT = text(
    f"INSERT INTO record ({', '.join(_INSERT_COLS)}) VALUES (:run_id, :idx, :source_id, :source_line, :rnd,"
    " :prompt, :status, :reasoning, :content, :content_null, :reasoning_source, :reasoning_len, :content_len,"
    " :finish_reason, :prompt_tokens, :completion_tokens, :reasoning_tokens, :usage_json, :token_ids_json,"
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


class Follower:
    """Follows one path like ``tail -F`` and feeds complete lines to an :class:`Ingestor`."""

    def __init__(self, ingestor: Ingestor, path: str, *, poll_interval_s: float = 0.2, from_end: bool = False,
                 max_batch_lines: int = 2000, rotate_grace_s: float = 2.0,
                 say: Callable[[str], None] = lambda s: None,
                 on_batch: Callable[[str, BatchResult], None] | None = None) -> None:
        self.ing = ingestor
        self.path = path
        self.poll_interval_s = poll_interval_s
        self.from_end = from_end
        self.max_batch_lines = max_batch_lines
        self.rotate_grace_s = rotate_grace_s
        self.say = say
        self.on_batch = on_batch
        self.stop_event = threading.Event()
        self.fd: int | None = None
        self.fd_id: tuple[int, int] | None = None
        self.display = path
        self.src = ingestor.source(path)
        self._rotated_at: float | None = None
        self._last_touch = 0.0
        self._last_control = 0.0
        self.stopped_by: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def run(self) -> str:
        """Follow until stop() or a stop control; returns why it ended ("signal", "stop", ...)."""
        try:
            self._open_first()
            while not self.stop_event.is_set():
                if self._control() in ("stop", "stop_now"):
                    self.stopped_by = "stop control"
                    break
                if self.fd is None:
                    self._wait_for_file()
                    continue
                n = self.poll_once()
                if n == 0:
                    self.stop_event.wait(self.poll_interval_s)
        finally:
            self.close()
        return self.stopped_by or "signal"

    def _control(self) -> str:
        m = time.monotonic()
        if m - self._last_control < 0.5:
            return "run"
        self._last_control = m
        desired = self.ing.desired()
        if desired == "pause":
            self.ing.set_status("paused", f"paused: {self.path} is not read until resumed")
            self.say("paused from the dashboard: not reading until resumed")
            while desired == "pause" and not self.stop_event.is_set():
                self.stop_event.wait(0.5)
                desired = self.ing.desired()
            if desired == "run":
                self.ing.set_status("running", f"watching {self.path}")
                self.say("resumed")
        return desired

    # ------------------------------------------------------------------ opening

    def _open_first(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            old = self._find_inode(self.src.dev, self.src.inode) if self.src.inode is not None else None
            if old is not None:
                self.say(f"{self.path} was renamed to {old} while we were away: finishing it first")
                self._finish_file(old)
            self.say(f"{self.path} does not exist yet: waiting for it")
            return
        src = self.src
        if src.inode is None:  # never read: a new watch
            offset, line_no = (self._end_position() if self.from_end else (0, 0))
            if self.from_end:
                self.say(f"{self.path}: starting at the end (line {line_no + 1}); earlier lines are not ingested")
            self.ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=offset, line_no=line_no,
                                size=st.st_size)
        elif (st.st_dev, st.st_ino) == (src.dev, src.inode):
            if st.st_size < src.offset:
                self.say(f"{self.path} is shorter ({st.st_size} bytes) than where we stopped ({src.offset}): "
                         "it was truncated; reading it again from the start")
                self.ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                    event="watch_truncated", detail=f"size {st.st_size} < offset {src.offset}")
            else:
                self.say(f"{self.path}: resuming at line {src.line_no + 1} (byte {src.offset})")
        else:
            old = self._find_inode(src.dev, src.inode)
            if old is not None:
                self.say(f"{self.path} was rotated while we were away: finishing {old} first")
                self._finish_file(old)
            else:
                self.say(f"{self.path} was replaced while we were away and the file we were reading is gone; "
                         "reading the new file from the start")
            self.ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                event="watch_rotated", detail="replaced while watch was not running")
        self._open_fd()

    def _open_fd(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (self.src.dev, self.src.inode):
            os.close(fd)  # replaced between stat and open: the next poll sees it
            return False
        self.fd, self.fd_id, self.display = fd, (st.st_dev, st.st_ino), self.path
        return True

    def _wait_for_file(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.stop_event.wait(self.poll_interval_s)
            return
        if self.src.inode is None or (st.st_dev, st.st_ino) != (self.src.dev, self.src.inode):
            if self.src.inode is not None:
                self.ing.reposition(self.src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                    event="watch_rotated", detail="new file")
            else:
                self._open_first()
                return
        if not self._open_fd():
            self.stop_event.wait(self.poll_interval_s)

    def _end_position(self) -> tuple[int, int]:
        """Offset just after the last complete line, and how many lines lie before it."""
        lines = 0
        last_nl = -1
        with open(self.path, "rb") as fh:
            pos = 0
            while chunk := fh.read(_READ_CHUNK):
                lines += chunk.count(b"\n")
                i = chunk.rfind(b"\n")
                if i >= 0:
                    last_nl = pos + i
                pos += len(chunk)
        return last_nl + 1, lines

    def _find_inode(self, dev: int | None, inode: int | None) -> str | None:
        """Where the file we were reading went (a rename in the same folder, as log rotation does)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            with os.scandir(folder) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == (dev, inode) and e.is_file(follow_symlinks=False):
                        return e.path
        except OSError:
            return None
        return None

    def _finish_file(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.fd, self.display = fd, path
            while self._drain(final=True):
                pass
        finally:
            os.close(fd)
            self.fd = None

    # ------------------------------------------------------------------ polling

    def poll_once(self) -> int:
        """Read what is new; handle truncation and rotation when idle. Returns lines consumed."""
        assert self.fd is not None
        n = self._drain(final=False)
        if n:
            self._rotated_at = None
            return n
        size = os.fstat(self.fd).st_size
        if size < self.src.offset:
            self.say(f"{self.path} was truncated ({size} bytes < offset {self.src.offset}): reading again from 0")
            self.ing.reposition(self.src, dev=self.src.dev, inode=self.src.inode, offset=0, line_no=0, size=size,
                                event="watch_truncated", detail=f"size {size} < offset {self.src.offset}")
            return 1
        try:
            st = os.stat(self.path)
            now_id: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            now_id = None
        if now_id is not None and now_id != self.fd_id:
            # renamed and replaced: finish the old file (waiting briefly for a half-written last line)
            m = time.monotonic()
            if self._rotated_at is None:
                self._rotated_at = m
            if size > self.src.offset and m - self._rotated_at < self.rotate_grace_s:
                return 0
            while self._drain(final=True):
                pass
            old = self.src.line_no
            self.close()
            self.ing.reposition(self.src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                event="watch_rotated", detail=f"previous file ended at line {old}")
            self.say(f"{self.path} was rotated (previous file ended at line {old}): following the new file")
            self._rotated_at = None
            self._open_fd()
            return 1
        if time.monotonic() - self._last_touch > 5 and size != self.src.size:
            self._last_touch = time.monotonic()
            self.ing.touch(self.src, size)
        return 0

    def _drain(self, *, final: bool) -> int:
        """Ingest every complete line available now (batch by batch). Returns lines consumed."""
        assert self.fd is not None
        total = 0
        while True:
            size = os.fstat(self.fd).st_size
            avail = size - self.src.offset
            if avail <= 0:
                return total
            want = min(avail, _READ_CHUNK)
            data = os.pread(self.fd, want, self.src.offset)
            while b"\n" not in data and len(data) < avail:  # one line longer than the chunk
                want = min(avail, want * 2)
                data = os.pread(self.fd, want, self.src.offset)
            lines = split_lines(data, self.src.offset, self.src.line_no, final=final and len(data) == avail)
            if not lines:
                return total
            for i in range(0, len(lines), self.max_batch_lines):
                batch = lines[i:i + self.max_batch_lines]
                res = self.ing.commit(self.src, batch, size=size, display_path=self.display)
                if self.on_batch:
                    self.on_batch(self.display, res)
                total += len(batch)
                if self.stop_event.is_set():
                    return total


# ============================================================================ import


def open_sequential(path: Path) -> Any:
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")  # noqa: SIM115


def import_file(ing: Ingestor, path: Path, *, max_batch_lines: int = 2000, say: Callable[[str], None] = lambda s: None,
                on_batch: Callable[[str, BatchResult], None] | None = None) -> tuple[int, int, int, bool]:
    """Read a finished file (plain or gzip) from its stored offset to the end.

    Returns (ok, error, bad, resumed_from_a_stored_offset)."""
    key = str(path.resolve())
    src = ing.source(key)
    st = path.stat()
    gz = False
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    resumed = False
    if src.inode is not None and (st.st_dev, st.st_ino) == (src.dev, src.inode) and (gz or st.st_size >= src.offset):
        resumed = src.offset > 0
    elif src.inode is not None:
        say(f"{path} changed since it was last imported into this run: reading it again from the start")
        ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                       event="import_changed", detail=str(path))
    else:
        ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size)
    ok = err = bad = 0
    with open_sequential(path) as fh:
        if src.offset:
            fh.seek(src.offset)
        buf = b""
        buf_at = src.offset
        for chunk in _chunks(fh):
            buf += chunk
            lines = split_lines(buf, buf_at, src.line_no, final=False)
            if lines:
                for i in range(0, len(lines), max_batch_lines):
                    res = ing.commit(src, lines[i:i + max_batch_lines], size=st.st_size, display_path=str(path))
                    ok, err, bad = ok + res.ok, err + res.error, bad + len(res.bad)
                    if on_batch:
                        on_batch(str(path), res)
                consumed = lines[-1].end - buf_at
                buf, buf_at = buf[consumed:], lines[-1].end
        if buf:
            lines = split_lines(buf, buf_at, src.line_no, final=True)
            res = ing.commit(src, lines, size=st.st_size, display_path=str(path))
            ok, err, bad = ok + res.ok, err + res.error, bad + len(res.bad)
            if on_batch:
                on_batch(str(path), res)
    return ok, err, bad, resumed


def _chunks(fh: Any) -> Iterator[bytes]:
    while chunk := fh.read(_READ_CHUNK):
        yield chunk
