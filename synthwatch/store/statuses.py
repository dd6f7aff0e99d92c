"""The statuses of runs and records and a run's desired states: plain tuples, importable without the ORM models
(synthwatch.store.models imports SQLModel and SQLAlchemy's ORM, ~0.1-0.2 CPU-s the worker's process does not need:
#39, the whole process's start-up)."""

from __future__ import annotations

RUN_STATUSES = ("created", "running", "paused", "stopping", "stopped", "completed", "failed")
# a run in one of these may still change: the dashboard polls it, its ETA and live charts are shown
LIVE_STATUSES = RUN_STATUSES[:4]
DESIRED_STATES = ("run", "pause", "stop", "stop_now")
RECORD_STATUSES = ("pending", "in_flight", "ok", "error", "timeout", "cancelled")
# a record in one of these has an answer or a final failure (checks, review, repairs work on them)
FINISHED_STATUSES = ("ok", "error", "timeout")
