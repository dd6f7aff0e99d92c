"""Fault points: named stages of a record's processing where a test can make the worker raise.

``RunWorker._process`` calls :func:`hit` at each stage (claim, request build, send, capture,
write). Nothing is armed in normal runs, where a call costs one empty-dict check. Tests arm a
stage with an exception to prove that whatever is raised there ends as a recorded error on the
record, never as a record left ``in_flight``.
"""

from __future__ import annotations

STAGES = ("claim", "request build", "send", "capture", "write")
armed: dict[str, BaseException] = {}


def hit(stage: str) -> None:
    if armed:
        exc = armed.get(stage)
        if exc is not None:
            raise exc
