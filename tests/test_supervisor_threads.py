"""The worker's supervisor never takes a thread's start for its end, and names the part that died, not a part that
ended because of it.

A CI run once failed a worker at its start with "the WAL checkpoint thread ended unexpectedly": the writer started
that thread from its own thread, and between a thread's start() and its run is_alive() says False, as it does once
the thread has ended; the supervisor looked at that moment. Real threads, a real SQLite file.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from workerkit import create, make_config

from synthwatch.store import queue as store
from synthwatch.workers.supervisor import Supervisor
from synthwatch.workers.writer import Writer


def test_the_writer_s_threads_are_running_when_its_start_returns(engine: Any, prompts: Any) -> None:
    run_id = create(engine, make_config("http://127.0.0.1:9/v1", prompts(3)))
    with engine.connect() as conn, store.write_begin(conn):
        worker_id = store.register_worker(conn, run_id)
    for _ in range(20):  # the old start raced its checkpoint thread's on most tries: 20 leave it no chance
        writer = Writer(engine, run_id, worker_id, flush_interval_s=0.05)
        writer.start()
        try:
            alive = {part: t.is_alive() for part, t in writer.threads.items()}
        finally:
            writer.stop()
        assert alive == {"database writer thread": True, "WAL checkpoint thread": True}
        # stopped as asked, both have ended when stop() returns
        assert [part for part, t in writer.threads.items() if t.is_alive()] == []


def test_a_thread_is_watched_only_once_it_has_started() -> None:
    sup = Supervisor(lambda why: None)
    thread = threading.Thread(target=lambda: None)
    with pytest.raises(ValueError, match="the metrics server thread: a thread is watched once it has started"):
        sup.watch_thread(thread, "the metrics server thread")


def test_the_part_that_died_is_named_before_one_that_ended_after_it() -> None:
    """Two watched threads end before the supervisor looks: one of an exception, one without (as the writer's
    checkpoint thread ends when the writer dies). The report is the exception, whatever order they were watched in."""
    failures: list[str] = []
    go = threading.Event()

    def follows() -> None:
        go.wait()

    def dies() -> None:
        go.wait()
        raise OverflowError("injected")

    async def main() -> None:
        sup = Supervisor(failures.append)
        sup.start()  # its scanning task cannot run before this coroutine awaits: the scan below is the first
        threads = [threading.Thread(target=follows, daemon=True), threading.Thread(target=dies, daemon=True)]
        for t in threads:
            t.start()
        sup.watch_thread(threads[0], "the follower thread")  # watched first
        sup.watch_thread(threads[1], "the dying thread")
        go.set()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)
        sup.scan()
        await sup.close()

    asyncio.run(main())
    assert failures == ["the dying thread died (OverflowError: injected)"]
