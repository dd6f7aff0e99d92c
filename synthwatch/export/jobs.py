"""Export jobs of the dashboard: an export that runs in a background thread of the web process.

A job is an ``export_job`` row and the thread that fills it. The thread reads records through the
query-only read engine, page by page, and writes only its own row (progress, then the manifest or the
error) in short transactions on the write engine. Files go to the ``exports`` folder beside the SQLite
database; a finished job's file is found from its row only, never from a path a client sends.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from ..store import queue as store
from .plan import FORMATS, ExportError, ExportOptions, ExportPlan
from .stream import manifest_path, prepare_export, run_export, sqlite_path

log = logging.getLogger("synthwatch.export")

PROGRESS_WRITE_INTERVAL_S = 0.5
INTERRUPTED = "interrupted: the dashboard stopped while this export ran"


class JobNotFound(LookupError):
    pass


class JobNotDone(Exception):
    pass


class FileGone(Exception):
    pass


def exports_dir(db_url: str) -> Path:
    """The exports folder beside the SQLite database (or ./exports for a server database)."""
    db_file = sqlite_path(db_url)
    base = db_file.parent if db_file is not None else Path.cwd()
    return (base / "exports").resolve()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:60] or "run"


class ExportJobs:
    """This process's export jobs: their rows and their threads."""

    def __init__(self, read: Engine, write: Engine, folder: Path) -> None:
        self.read = read
        self.write = write
        self.folder = folder
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.RLock()

    def alive(self) -> set[int]:
        """Ids of the jobs whose thread runs in this process. Taken BEFORE a row is read: a thread writes its
        final status before it leaves the set, so a 'running' row without a live thread was interrupted."""
        with self._lock:
            return set(self._threads)

    def start(self, run_id: int, options: ExportOptions) -> int:
        """Check the export (ExportError on bad input, nothing written), insert its row, start its thread."""
        self.folder.mkdir(parents=True, exist_ok=True)
        plan = prepare_export(self.read, run_id, options)
        with self._lock:  # the row and its thread appear together: a reader never sees one without the other
            with self.write.connect() as conn, store.write_begin(conn):
                job_id = int(conn.execute(
                    text("INSERT INTO export_job (run_id, format, out_path, status, done, total, started_at)"
                         " VALUES (:r, :f, :o, 'running', 0, :n, :t) RETURNING id"),
                    {"r": run_id, "f": options.format, "o": str(plan.out), "n": plan.total, "t": time.time()},
                ).scalar_one())
            thread = threading.Thread(target=self._run, args=(job_id, plan), name=f"export-{job_id}", daemon=True)
            self._threads[job_id] = thread
            thread.start()
        return job_id

    def out_path(self, run_name: str, fmt: str, parquet: bool) -> Path:
        """A new file name in the exports folder: the run, the format, the time and a random suffix."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        name = f"{_slug(run_name)}-{fmt if fmt in FORMATS else 'export'}-{stamp}-{secrets.token_hex(3)}"
        return self.folder / (name + (".parquet" if parquet else ".jsonl"))

    def _run(self, job_id: int, plan: ExportPlan) -> None:
        last = 0.0

        def progress(done: int, total: int) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < PROGRESS_WRITE_INTERVAL_S and done < total:
                return
            last = now
            try:
                with self.write.connect() as conn, store.write_begin(conn):
                    conn.execute(text("UPDATE export_job SET done = :d, total = :n WHERE id = :j"),
                                 {"d": done, "n": total, "j": job_id})
            except OperationalError:  # database busy: progress is best effort, the export goes on
                log.warning("export %s: progress not recorded (database busy)", job_id)

        try:
            try:
                manifest = run_export(self.read, plan, progress)
            except Exception as exc:
                message = str(exc) if isinstance(exc, ExportError) else f"{type(exc).__name__}: {exc}"
                with self.write.connect() as conn, store.write_begin(conn):
                    conn.execute(
                        text("UPDATE export_job SET status = 'failed', finished_at = :t, error = :e WHERE id = :j"),
                        {"t": time.time(), "e": message[:2000], "j": job_id},
                    )
                return
            counts = manifest["counts"]
            with self.write.connect() as conn, store.write_begin(conn):
                conn.execute(
                    text("UPDATE export_job SET status = 'done', finished_at = :t, done = :d, total = :d,"
                         " manifest_json = :m WHERE id = :j"),
                    {"t": time.time(), "d": counts["ok_scanned"], "m": orjson.dumps(manifest).decode(), "j": job_id},
                )
        finally:
            with self._lock:
                self._threads.pop(job_id, None)

    def job(self, run_id: int, job_id: int) -> dict[str, Any] | None:
        """One job's row (``interrupted`` set when it says running and no thread of this process runs it; the
        row is then marked failed)."""
        alive = self.alive()
        with self.read.connect() as conn:
            row = conn.execute(
                text("SELECT * FROM export_job WHERE id = :j AND run_id = :r"), {"j": job_id, "r": run_id}
            ).mappings().first()
        if row is None:
            return None
        job = self._with_state(row, alive)
        if job["interrupted"]:
            with self.write.connect() as conn, store.write_begin(conn):
                conn.execute(
                    text("UPDATE export_job SET status = 'failed', finished_at = :t, error = :e"
                         " WHERE id = :j AND status = 'running'"),
                    {"t": time.time(), "e": INTERRUPTED, "j": job_id},
                )
            job.update(status="failed", error=INTERRUPTED, interrupted=False)
        return job

    def jobs(self, run_id: int, limit: int = 50) -> list[dict[str, Any]]:
        """The run's latest jobs, newest first."""
        alive = self.alive()
        with self.read.connect() as conn:
            rows = conn.execute(
                text("SELECT * FROM export_job WHERE run_id = :r ORDER BY id DESC LIMIT :n"), {"r": run_id, "n": limit}
            ).mappings().all()
        return [self._with_state(r, alive) for r in rows]

    @staticmethod
    def _with_state(row: Any, alive: set[int]) -> dict[str, Any]:
        job = dict(row)
        raw_manifest = job.pop("manifest_json", None)
        job["manifest"] = orjson.loads(raw_manifest) if raw_manifest else None
        job["interrupted"] = job["status"] == "running" and job["id"] not in alive
        return job

    def finished_file(self, run_id: int, job_id: int, manifest: bool = False) -> Path:
        """The file (or manifest) of a finished job of this run, only inside the exports folder."""
        with self.read.connect() as conn:
            row = conn.execute(
                text("SELECT status, out_path FROM export_job WHERE id = :j AND run_id = :r"), {"j": job_id, "r": run_id}
            ).first()
        if row is None:
            raise JobNotFound(f"run {run_id} has no export {job_id}")
        if row[0] != "done":
            raise JobNotDone(f"export {job_id} is {row[0]}, not done: there is no file to download yet")
        path = Path(row[1]).resolve()
        if manifest:
            path = manifest_path(path)
        if not path.is_relative_to(self.folder) or not path.is_file():
            raise FileGone(f"the file of export {job_id} is no longer in the exports folder")
        return path
