"""The database is the queue: claims are atomic, respect the cap, and dead workers' claims return."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import text

from synthwatch.config import RunConfig
from synthwatch.store import queue as store


@dataclass
class P:
    index: int
    line: int
    source_id: str
    messages: list


def _config(**kw) -> RunConfig:  # type: ignore[no-untyped-def]
    return RunConfig.model_validate({"dataset": {"path": "x.jsonl"}, "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
                                     "model": "m", **kw})


def _run(engine, n: int, **kw) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "r", _config(**kw))
        store.insert_prompts(conn, rid, [P(i, i + 1, f"s{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(n)])
    return rid


def _claim(engine, rid: int, wid: int, n: int):  # type: ignore[no-untyped-def]
    with engine.connect() as conn, store.write_begin(conn):
        return store.claim(conn, rid, wid, n, lease_s=30)


def test_claims_are_disjoint_and_counted(any_engine) -> None:  # type: ignore[no-untyped-def]
    rid = _run(any_engine, 10)
    a, why_a = _claim(any_engine, rid, 1, 4)
    b, why_b = _claim(any_engine, rid, 2, 4)
    c, why_c = _claim(any_engine, rid, 3, 4)
    ids = [x.id for x in a + b + c]
    assert len(ids) == len(set(ids)) == 10
    assert (why_a, why_b, why_c) == ("", "", "empty")
    assert a[0].messages == [{"role": "user", "content": "q0"}]
    with any_engine.connect() as conn:
        row = store.run_row(conn, rid)
    assert (row["n_pending"], row["n_in_flight"], row["total"]) == (0, 10, 10)


def test_cap_counts_in_flight(any_engine) -> None:  # type: ignore[no-untyped-def]
    rid = _run(any_engine, 10, cap=3)
    got, why = _claim(any_engine, rid, 1, 8)
    assert len(got) == 3 and why == "cap"
    assert _claim(any_engine, rid, 2, 8) == ([], "cap")


def test_paused_run_gives_no_claims(any_engine) -> None:  # type: ignore[no-untyped-def]
    rid = _run(any_engine, 5)
    store.apply_control(any_engine, rid, "pause")
    assert _claim(any_engine, rid, 1, 5) == ([], "pause")
    store.apply_control(any_engine, rid, "resume")
    assert len(_claim(any_engine, rid, 1, 5)[0]) == 5
    with any_engine.connect() as conn:
        actions = [r[0] for r in conn.execute(text("SELECT action FROM control_event WHERE run_id = :r ORDER BY id"),
                                              {"r": rid})]
    assert actions == ["pause", "resume"]


def test_dead_worker_claims_return_to_pending(any_engine) -> None:  # type: ignore[no-untyped-def]
    rid = _run(any_engine, 6)
    with any_engine.connect() as conn, store.write_begin(conn):
        wid = store.register_worker(conn, rid)
        # a pid that cannot exist on this host: the worker is gone
        conn.execute(text("UPDATE worker SET pid = 2147483000 WHERE id = :w"), {"w": wid})
    got, _ = _claim(any_engine, rid, wid, 4)
    assert len(got) == 4
    with any_engine.connect() as conn, store.write_begin(conn):
        moved = store.release_dead_claims(conn, rid, stale_after_s=3600)
    assert moved == 4
    with any_engine.connect() as conn:
        row = store.run_row(conn, rid)
    assert (row["n_pending"], row["n_in_flight"]) == (6, 0)


@pytest.mark.parametrize("value", ["0", "-5", "abc", "10000000000"])
def test_bad_control_values_are_refused(any_engine, value: str) -> None:  # type: ignore[no-untyped-def]
    rid = _run(any_engine, 1)
    with pytest.raises(store.ControlError):
        store.apply_control(any_engine, rid, "cap", value)
    with pytest.raises(store.ControlError):
        store.apply_control(any_engine, rid, "concurrency", value)
