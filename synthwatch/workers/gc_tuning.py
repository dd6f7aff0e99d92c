"""Garbage-collector settings for the time a worker runs.

A worker allocates a few hundred container objects per request; with CPython's default thresholds
(700, 10, 10) the young-generation collections, and the full ones that walk every object the imports
created, cost ~65 us per request at thousands of requests per second: a quarter of the worker's
CPU in the benchmark (docs/benchmarks.md). While a worker runs, the objects that exist at its start
(modules, settings, the database engine) are frozen out of collection, and young collections run
every 20,000 allocations instead of 700. Most per-request objects are freed by reference counting
anyway; the collector only has cycles to find, and finds them a little later.

Process-wide, so nested or concurrent workers in one process (tests, the demo) share one tuning,
undone when the last of them ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

GEN0_THRESHOLD = 20_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def tuned_for_worker() -> Iterator[None]:
    global _users, _saved
    with _lock:
        _users += 1
        if _users == 1:
            _saved = gc.get_threshold()
            # no gc.collect() first (~50 ms with a dashboard's modules loaded): cycles that are garbage
            # already stay frozen until the last worker ends, then the collector finds them as usual
            gc.freeze()
            gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                gc.unfreeze()
                _saved = None
