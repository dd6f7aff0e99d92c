"""Helpers to run a real worker against a real simulator and a real SQLite file in tests."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

from synthwatch.config import RunConfig, deep_merge
from synthwatch.sources.load import prepare_run
from synthwatch.store import queue as store
from synthwatch.workers.engine import RunWorker


def make_config(base_urls: str | list[str], dataset: Path, **over: Any) -> RunConfig:
    urls = [base_urls] if isinstance(base_urls, str) else base_urls
    data: dict[str, Any] = {
        "name": over.pop("name", "test-run"),
        "dataset": {"path": str(dataset)},
        "endpoints": [{"base_url": u} for u in urls],
        "model": "sim-reasoner",
        "concurrency": 8,
        "timeouts": {"connect_s": 5, "total_s": 30, "idle_s": 5},
        "retries": {"max_attempts": 3, "backoff_base_s": 0.05, "backoff_max_s": 0.2},
        "flush_interval_ms": 50,
        "lease_s": 5,
    }
    return RunConfig.model_validate(deep_merge(data, over))


def create(engine: Any, config: RunConfig) -> int:
    run_id, _ = prepare_run(engine, config, out=open("/dev/null", "w"))  # noqa: SIM115
    return run_id


def run_to_end(engine: Any, config: RunConfig, timeout_s: float = 60, run_id: int | None = None) -> tuple[int, str]:
    # in its own thread and loop: Playwright's sync API leaves a loop running in the main thread
    bg = Background(engine, config, run_id).start()
    return bg.run_id, bg.join(timeout_s)


class Background:
    """A worker running in a thread with its own event loop (the test thread drives controls)."""

    def __init__(self, engine: Any, config: RunConfig, run_id: int | None = None,
                 hooks: Callable[[int], list[Any]] | None = None) -> None:
        self.engine = engine
        self.config = config
        self.run_id = run_id if run_id is not None else create(engine, config)
        self.worker = RunWorker(engine, self.run_id, config, hooks=hooks(self.run_id) if hooks else None)
        self.final: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            self.final = asyncio.run(self.worker.main())
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def start(self) -> Background:
        self.thread.start()
        return self

    def join(self, timeout_s: float = 60) -> str:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "worker did not finish in time"
        if self.error:
            raise self.error
        assert self.final is not None
        return self.final


def counts(engine: Any, run_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, COUNT(*) FROM record WHERE run_id = :r GROUP BY status"),
                            {"r": run_id}).all()
    return {s: n for s, n in rows}


def records(engine: Any, run_id: int, where: str = "1=1") -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(
            text(f"SELECT * FROM record WHERE run_id = :r AND {where} ORDER BY idx"), {"r": run_id}).mappings()]


def run_row(engine: Any, run_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return store.run_row(conn, run_id)


def wait_for(pred: Callable[[], Any], timeout_s: float = 20, interval_s: float = 0.05, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or pred}")


_Q = re.compile(r"What is (\d+) \+ (\d+)\?")


def answer_ok(record: dict[str, Any]) -> bool:
    """The simulator answers `What is a + b?` correctly: the content must hold the sum of this prompt."""
    import orjson

    prompt = orjson.loads(record["prompt_json"])[-1]["content"]
    m = _Q.search(prompt)
    assert m, prompt
    return str(int(m.group(1)) + int(m.group(2))) in (record["content"] or "")
