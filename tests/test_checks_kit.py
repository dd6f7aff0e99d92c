"""Helpers for the checks/alarms tests: a worker WITH the checks hooks (workerkit's has none)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from workerkit import Background

from synthwatch.config import RunConfig
from synthwatch.quality.live import writer_hooks


def run_checked(engine: Any, config: RunConfig, timeout_s: float = 60) -> tuple[int, str]:
    # in its own thread and loop: Playwright's sync API leaves a loop running in the main thread
    bg = CheckedBackground(engine, config).start()
    return bg.run_id, bg.join(timeout_s)


def CheckedBackground(engine: Any, config: RunConfig) -> Background:  # noqa: N802  (reads like the class it was)
    """A worker with the checks hooks in a thread (the test drives controls / reads the DB)."""
    return Background(engine, config, hooks=lambda run_id: writer_hooks(engine, run_id, config))


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


def completed_mismatch_run(engine: Any, url: str, dataset: Any, name: str) -> int:
    """A run that read `reasoning_content` from a server sending `reasoning`, with the mismatch's auto-pause off
    so it completes: every record has its reasoning only in the unread field. Returns the run id."""
    from workerkit import make_config

    config = make_config(url, dataset, concurrency=4, reasoning={"mode": "reasoning_content"}, name=name,
                         checks={"rules": {"field_mismatch": {"auto_pause": False}}})
    bg = CheckedBackground(engine, config).start()
    assert bg.join(60) == "completed"
    return bg.run_id
