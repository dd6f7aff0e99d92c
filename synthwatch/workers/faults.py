"""Fault points: named stages where a test can make the worker raise.

``RecordTasks.process`` (workers/record.py) calls :func:`hit` at each stage of a record's processing (``STAGES``: claim, request
build, send, capture, write); tests arm one to prove that whatever is raised there ends as a recorded error on
the record, never as a record left ``in_flight``. ``THREAD_STAGES`` are points in the worker's own threads and
tasks where an exception is not any one record's: ``writer`` is hit by the writer thread as it writes finished
records, ``tuner`` by the concurrency tuner's task at each step. An exception armed there kills that thread or
task, which the worker's supervisor must notice (it stops the worker, returns its claims to pending and exits
non-zero: synthwatch.workers.supervisor). Nothing is armed in normal runs, where a call costs one empty-dict
check.
"""

from __future__ import annotations

STAGES = ("claim", "request build", "send", "capture", "write")
THREAD_STAGES = ("writer", "tuner")
armed: dict[str, BaseException] = {}


def hit(stage: str) -> None:
    if armed:
        exc = armed.get(stage)
        if exc is not None:
            raise exc
