"""What the property-based suites assert about a run (#25 item 7): memory, logs, what is stored and who reads it.

Used by tests/test_fuzz_replies.py and tests/test_fuzz_process.py (the strategies are in tests/fuzzkit.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.fuzzkit import MiB

FINAL = ("ok", "error", "timeout")


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """This process's resident memory, sampled every 10 ms while the block runs."""

    def __init__(self) -> None:
        import threading

        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def grew_mb(self) -> float:
        return (self.peak - self.base) / MiB


class LogTrap:
    """Every log record of synthwatch's loggers at WARNING or above while the block runs (the worker, the writer
    and the checks log there; an escaped exception shows as "writer crashed", "worker failed", a traceback)."""

    BAD = ("writer crashed", "worker failed", "record task failed", "will retry", "giving up")

    def __init__(self) -> None:
        import logging

        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger("synthwatch")
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = self.records.append  # type: ignore[method-assign]

    def __enter__(self) -> LogTrap:
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self.handler)

    def fatal(self) -> bool:
        return any("crashed" in r.getMessage() or "worker failed" in r.getMessage() for r in self.records)

    def problems(self) -> list[str]:
        out = []
        for r in self.records:
            msg = r.getMessage()
            if r.exc_info or r.levelname in ("ERROR", "CRITICAL") or any(b in msg for b in self.BAD):
                exc = r.exc_info[1] if r.exc_info else None
                out.append(f"{r.name} {r.levelname}: {msg[:500]}"
                           + (f" ({type(exc).__name__}: {str(exc)[:300]})" if exc is not None else ""))
        return out


def check_stored(db: Path, run_id: int, *, stopped: bool = False) -> None:
    """Every row the run left in the SQLite file reads back: text columns are valid UTF-8 (read as bytes, decoded
    strictly), ``*_json`` columns parse as JSON, and no record of the run is left in flight, nor pending unless the
    run was ``stopped`` (a stop returns unfinished records to pending)."""
    import sqlite3

    import orjson

    conn = sqlite3.connect(db)
    conn.text_factory = bytes
    try:
        tables = [r[0].decode() for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                                       " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '%fts%'")]
        for table in tables:
            cols = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
            names = [c[1].decode() for c in cols]
            texty = {c[1].decode() for c in cols if not c[2] or b"CHAR" in c[2].upper() or b"TEXT" in c[2].upper()
                     or b"JSON" in c[2].upper()}
            where, args = ("WHERE run_id = ?", (run_id,)) if "run_id" in names else ("", ())
            for row in conn.execute(f'SELECT * FROM "{table}" {where}', args):
                for name, v in zip(names, row, strict=True):
                    if isinstance(v, bytes) and name in texty:
                        try:
                            s = v.decode("utf-8")
                        except UnicodeDecodeError as exc:
                            raise AssertionError(f"{table}.{name} holds text that is not UTF-8: {v[:200]!r}") from exc
                        if name.endswith("_json") and s:
                            try:
                                orjson.loads(s)
                            except orjson.JSONDecodeError as exc:
                                raise AssertionError(f"{table}.{name} does not parse as JSON ({exc}): {s[:200]!r}") \
                                    from exc
        allowed = "'ok', 'error', 'timeout'" + (", 'pending'" if stopped else "")
        left = conn.execute(f"SELECT status, COUNT(*) FROM record WHERE run_id = ? AND status NOT IN ({allowed})"
                            " GROUP BY status", (run_id,)).fetchall()
        assert not left, f"records left unfinished: {left}"
    finally:
        conn.close()


def check_readers(dashboard_url: str, engine: Any, run_id: int, out_dir: Path) -> None:
    """The dashboard's run page, records list, every record's page and JSON, and a raw export all read the run."""
    import httpx
    import orjson

    from synthwatch.export.plan import ExportOptions
    from synthwatch.export.stream import export_run

    with httpx.Client(base_url=dashboard_url, timeout=60) as c:
        # the records table with any status (its default view lists finished records only)
        for path in (f"/runs/{run_id}", f"/runs/{run_id}/records?status=", f"/api/runs/{run_id}/records?limit=200"):
            r = c.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text[:500])
        ids = [rec["id"] for rec in c.get(f"/api/runs/{run_id}/records?limit=200").json()["records"]]
        assert ids, "the records API lists the run's records"
        for rid in ids:
            r = c.get(f"/runs/{run_id}/records/{rid}")
            assert r.status_code == 200, (rid, r.status_code, r.text[:500])
            r = c.get(f"/api/runs/{run_id}/records/{rid}")
            assert r.status_code == 200, (rid, r.status_code, r.text[:500])
            orjson.loads(r.content)
    out = out_dir / f"raw-{run_id}.jsonl"
    export_run(engine, run_id, ExportOptions(format="raw", out=out, default_exclusions=False, include_flagged=True))
    for line in out.read_bytes().splitlines():
        orjson.loads(line)
