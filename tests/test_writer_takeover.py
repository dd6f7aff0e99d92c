"""A worker whose claims were taken over (its lease expired while it still ran) must not overwrite them."""

from __future__ import annotations

import time

from sqlalchemy import text
from workerkit import counts, create, make_config, records, run_row

from synthwatch.capture.reasoning import extract_response
from synthwatch.store import queue as store
from synthwatch.workers.results import Outcome
from synthwatch.workers.writer import Writer


def _reply(i: int) -> dict:  # type: ignore[type-arg]
    return {"id": f"r{i}", "object": "chat.completion", "created": 1, "model": "sim-reasoner",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "reasoning": f"think {i}", "content": f"answer {i}"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}


def test_results_for_claims_taken_over_are_dropped(any_engine, prompts) -> None:  # type: ignore[no-untyped-def]
    config = make_config("http://127.0.0.1:9/v1", prompts(10))
    run_id = create(any_engine, config)
    with any_engine.connect() as conn, store.write_begin(conn):
        worker_id = store.register_worker(conn, run_id)
        other = store.register_worker(conn, run_id)
    writer = Writer(any_engine, run_id, worker_id, flush_interval_s=0.05)
    writer.start()
    try:
        claimed, why = writer.claim(6).result(10)
        assert len(claimed) == 6 and why == ""
        lost = [c.id for c in claimed[:2]]
        with any_engine.connect() as conn, store.write_begin(conn):
            # the lease ran out and another worker holds two of them now; a third went back to the queue
            conn.execute(text(f"UPDATE record SET worker_id = {other} WHERE id IN ({lost[0]}, {lost[1]})"))
            conn.execute(text("UPDATE record SET status = 'pending', worker_id = NULL WHERE id = :i"),
                         {"i": claimed[2].id})
            conn.execute(text("UPDATE run SET n_in_flight = n_in_flight - 1, n_pending = n_pending + 1"
                              " WHERE id = :r"), {"r": run_id})
        for c in claimed:
            ex = extract_response(_reply(c.idx), "auto", "<think>", "</think>", False)
            writer.submit(Outcome(c.id, c.idx, "ok", c.messages, extracted=ex, endpoint="e", latency_s=0.1,
                                  finished_at=time.time()))
    finally:
        writer.stop()
    assert writer.error is None
    mine = {r["id"]: r for r in records(any_engine, run_id, "status = 'ok'")}
    assert sorted(mine) == [c.id for c in claimed[3:]]
    assert all(r["content"] == f"answer {r['idx']}" and r["worker_id"] is None for r in mine.values())
    theirs = records(any_engine, run_id, f"id IN ({lost[0]}, {lost[1]})")
    assert [(r["status"], r["worker_id"], r["content"]) for r in theirs] == [("in_flight", other, None)] * 2
    assert counts(any_engine, run_id) == {"ok": 3, "in_flight": 2, "pending": 5}
    row = run_row(any_engine, run_id)
    assert (row["n_ok"], row["n_in_flight"], row["n_pending"]) == (3, 2, 5)
