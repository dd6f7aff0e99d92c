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

The C allocator (glibc) is set once, for the process's life: blocks of MMAP_THRESHOLD_BYTES and more get memory
of their own, handed back to the system when freed. By default glibc raises that threshold (up to 32 MB) each
time it frees such a block, after which a long answer's growing text (a stream's pieces joined, 4, 8, ... MB) and
SQLite's copies of it come from the shared heap, which keeps them resident: a 60 MB streamed answer cost 2.2x its
size instead of 2x (#39, tests/test_reply_memory.py). Ordinary requests never allocate blocks that large. Only
the mmap threshold is pinned: glibc's trim threshold stays where it is at that moment.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import threading
from collections.abc import Iterator
from typing import Any

GEN0_THRESHOLD = 20_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100

MMAP_THRESHOLD_BYTES = 4 * 2**20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc malloc.h); pinning it also stops the trim threshold's raises

_lock = threading.Lock()
_allocator_set = False
_users = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def tuned_for_worker() -> Iterator[None]:
    global _users, _saved
    with _lock:
        _users += 1
        if not _allocator_set:
            _set_allocator()
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


def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def _set_allocator() -> None:
    """Pin glibc's mmap threshold; elsewhere (no mallopt) the C library's own policy stays."""
    global _allocator_set
    _allocator_set = True
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None and not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        logging.getLogger("synthwatch.worker").debug("mallopt refused the mmap threshold")


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim): called after a long text was let go
    (workers/long_texts.py), never per request (it walks the heap)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
