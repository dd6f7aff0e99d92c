"""Property-based: any reply a server can send goes through the real worker without harm (#25 item 7).

Each example is one :class:`tests.fuzzkit.Wire` (a reply as it goes on the wire: body, framing, coding, timing),
served by :class:`tests.hostileserver.HostileServer` on 127.0.0.1 to one record of a three-record run, while the
other two get valid, slowly streamed replies. The run goes through the real worker in process (RunWorker: the real
aiohttp client, capture, checks and writer thread) over one real SQLite file shared by the module's examples, with
timeouts connect 2 s, idle 1 s, total 3 s and limits body 4 MiB, event 1 MiB. The properties:

- the worker returns within the total timeout plus a margin, and the run is ``completed``;
- every record reaches a final state (ok, error, timeout): none is left ``pending`` or ``in_flight``;
- the two valid records end ``ok`` (one record cannot take down its batch);
- no exception escapes: synthwatch's loggers show no traceback, no "writer crashed", no error;
- resident memory grows by less than 150 MB while the example runs;
- the database holds nothing a reader chokes on: text columns are UTF-8, ``*_json`` columns parse, and the
  dashboard (a real server on a real port) serves the run page, the records list and every record's page and
  JSON, and a raw export writes lines that parse.

Every file in tests/fuzz_regressions/ named ``replies-*.json`` is replayed by ``test_regression`` (``./dev fuzz``
writes a falsifying example there), so a case found once stays tested after the Hypothesis database is gone.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveServer
from hypothesis import event, given, settings

from tests.fuzzchecks import LogTrap, PeakRSS, check_readers, check_stored
from tests.fuzzkit import (
    PHASES,
    MiB,
    Wire,
    examples,
    good_wire,
    load_regression,
    regression_files,
    save_regression,
    serve,
    spend,
    wires,
)
from tests.hostileserver import HostileServer
from tests.workerkit import Background, make_config, records

SUITE = "replies"
TIMEOUTS = {"connect_s": 2, "total_s": 3, "idle_s": 1}
LIMITS = {"max_body_bytes": 4 * MiB, "max_event_bytes": MiB}
MEMORY_BOUND_MB = 150
_names = itertools.count()


class Rig:
    """One SQLite file and one dashboard on a real port for all of a module's examples (each example is a run)."""

    def __init__(self, tmp: Path) -> None:
        from synthwatch.app.main import create_app
        from synthwatch.settings import Settings
        from synthwatch.store.db import open_engine

        self.tmp = tmp
        self.db = tmp / "fuzz.db"
        self.engine = open_engine(str(self.db))
        self.dashboard = LiveServer(create_app(str(self.db), Settings(db=str(self.db)))).start()
        self.dataset = tmp / "prompts.jsonl"
        self.dataset.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": c}]}) + "\n"
                                        for i, c in enumerate(["HOSTILE: 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"])))

    def close(self) -> None:
        self.dashboard.stop()
        self.engine.dispose()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("fuzz-replies"))
    yield r
    r.close()


def run_one(rig: Rig, wire: Wire) -> dict[str, Any]:
    """Serve ``wire`` to the hostile record of a new run; assert the properties; return the hostile record."""
    with HostileServer(serve(wire), good_delay_s=0.02) as srv, LogTrap() as logs:
        config = make_config(srv.url, rig.dataset, name=f"fuzz-{next(_names)}", stream=wire.stream, concurrency=4,
                             timeouts=TIMEOUTS, retries={"max_attempts": 1}, limits=LIMITS)
        t0 = time.monotonic()
        with PeakRSS() as mem:
            bg = Background(rig.engine, config).start()
            deadline, fatal_at = t0 + TIMEOUTS["total_s"] + 20, None
            while bg.thread.is_alive() and time.monotonic() < deadline:
                bg.thread.join(0.1)
                if fatal_at is None and logs.fatal():
                    fatal_at = time.monotonic()  # a crashed writer: give the worker 2 s to notice and end
                if fatal_at is not None and time.monotonic() > fatal_at + 2:
                    break
            assert not bg.thread.is_alive(), "the worker did not return:\n" + "\n".join(logs.problems())
        elapsed = time.monotonic() - t0
        final = bg.join(0)
    assert not logs.problems(), "\n".join(logs.problems())
    recs = records(rig.engine, bg.run_id)
    assert [r["status"] in ("ok", "error", "timeout") for r in recs] == [True] * 3, \
        [(r["status"], r["error_kind"]) for r in recs]
    assert final == "completed", final
    hostile, good = recs[0], recs[1:]
    assert [r["status"] for r in good] == ["ok", "ok"], [(r["error_kind"], r["error"]) for r in good]
    if hostile["status"] != "ok":
        assert hostile["error_kind"] and hostile["error"], "a failure is recorded with a kind and a message"
    assert elapsed < TIMEOUTS["total_s"] + 10, f"the run took {elapsed:.1f} s"
    assert mem.grew_mb < MEMORY_BOUND_MB, f"resident memory grew by {mem.grew_mb:.0f} MB"
    check_stored(rig.db, bg.run_id)
    check_readers(rig.dashboard.url, rig.engine, bg.run_id, rig.tmp)
    return hostile


# Over 30 s (~35 s here): 60 generated server replies, each through a real worker, a real SQLite file and a real
# dashboard reading it back; the example count is what CI can afford (./dev fuzz runs hundreds).
@pytest.mark.slow
@settings(max_examples=examples(ci=60), phases=PHASES)
@given(wire=wires())
def test_any_reply_leaves_the_worker_whole(rig: Rig, wire: Wire) -> None:
    spend(SUITE)
    try:
        hostile = run_one(rig, wire)
    except BaseException as exc:
        save_regression(SUITE, {"wire": wire}, exc)
        raise
    # what the examples covered (pytest --hypothesis-show-statistics)
    event(f"hostile record: {hostile['status']} {hostile['error_kind'] or ''}".strip())


@pytest.mark.parametrize("path", regression_files(SUITE), ids=lambda p: p.stem)
def test_regression(rig: Rig, path: Path, request: pytest.FixtureRequest) -> None:
    run_one(rig, **load_regression(path, request))


def test_valid_replies_end_ok(rig: Rig) -> None:
    """The rig itself: a valid reply, streamed and whole, ends ok (so a property failing is the reply's doing)."""
    for stream in (True, False):
        assert run_one(rig, good_wire(stream))["status"] == "ok"
