"""Helpers for the checks/alarms tests: a worker WITH the checks hooks (workerkit's has none)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sqlalchemy import text
from workerkit import create

from synthwatch.checks import writer_hooks
from synthwatch.config import RunConfig
from synthwatch.workers.engine import RunWorker


def run_checked(engine: Any, config: RunConfig, timeout_s: float = 60) -> tuple[int, str]:
    # in its own thread and loop: Playwright's sync API leaves a loop running in the main thread
    bg = CheckedBackground(engine, config).start()
    return bg.run_id, bg.join(timeout_s)


class CheckedBackground:
    """A worker with the checks hooks in a thread (the test drives controls / reads the DB)."""

    def __init__(self, engine: Any, config: RunConfig) -> None:
        self.run_id = create(engine, config)
        self.worker = RunWorker(engine, self.run_id, config, hooks=writer_hooks(engine, self.run_id, config))
        self.final: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            self.final = asyncio.run(self.worker.main())
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self) -> CheckedBackground:
        self.thread.start()
        return self

    def join(self, timeout_s: float = 60) -> str:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "worker did not finish in time"
        if self.error:
            raise self.error
        assert self.final is not None
        return self.final


def alarms(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(
            text("SELECT * FROM alarm WHERE run_id = :r ORDER BY id"), {"r": run_id}).mappings()]


def stats(engine: Any, run_id: int) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        return {r["check_name"]: dict(r) for r in conn.execute(
            text("SELECT * FROM check_stat WHERE run_id = :r"), {"r": run_id}).mappings()}


def events(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(
            text("SELECT * FROM control_event WHERE run_id = :r ORDER BY id"), {"r": run_id}).mappings()]
