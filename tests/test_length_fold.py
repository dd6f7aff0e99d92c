"""The run page's length histogram folds per finished time bucket (#28 item 10): the fold equals a full recount,
and a live poll reads only the records finished since the last folded bucket."""

from __future__ import annotations

import random
import time
from typing import Any

from sqlalchemy import text
from test_review import add_record, add_run

from synthwatch.review import length_fold, lengths
from synthwatch.store import queue as store


def _add(engine: Any, rid: int, idx: int, tokens: int | None, finished_at: float, rng: random.Random) -> None:
    r, c = rng.randint(0, 300), rng.randint(0, 300)
    add_record(engine, rid, idx, reasoning="r" * r, content="c" * c, completion_tokens=tokens,
               finished_at=finished_at)


def _recount(engine: Any, rid: int, mt: int | None) -> dict[str, Any]:
    with engine.connect() as conn:
        return lengths.histogram(conn, rid, max_tokens=mt, cap=10**9)


def _poll(engine: Any, rid: int, mt: int | None, now: float) -> tuple[dict[str, Any], int]:
    with engine.connect() as conn:
        got = length_fold.whole_run(conn, rid, now=now)
    assert got is not None
    return length_fold.histogram(got[0], mt), got[1].rows


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for k in ("bins", "counts", "records", "bin_width", "max_tokens"):
        assert a[k] == b[k], k


def test_fold_equals_a_full_recount_and_a_poll_reads_only_new_records(any_engine: Any) -> None:
    engine, rng = any_engine, random.Random(7)
    length_fold.forget()
    mt = 400
    rid = add_run(engine, name="fold", config={"sampling": {"max_tokens": mt}})
    now = time.time()
    for i in range(120):  # history: finished between 2 h and 5 min ago, in no particular order
        _add(engine, rid, i, rng.choice([None, 0, rng.randint(1, mt), mt]), now - rng.uniform(300, 7200), rng)
    h, read = _poll(engine, rid, mt, now)
    _same(h, _recount(engine, rid, mt))
    assert read == h["records"] > 0  # the first view reads the history once

    # a poll with nothing new reads nothing; then 5 records finish (one with a new largest output: the bins move)
    assert _poll(engine, rid, mt, now + 1)[1] == 0
    for i in range(120, 125):
        _add(engine, rid, i, mt + 50 if i == 120 else rng.randint(1, 900), now + 2, rng)
    h, read = _poll(engine, rid, mt, now + 3)
    assert read == 5
    _same(h, _recount(engine, rid, mt))
    h, read = _poll(engine, rid, None, now + 4)  # without a limit too (bins span the largest output)
    _same(h, _recount(engine, rid, None))

    # once those 5 are past the writer's reach they are folded in; later polls read nothing again
    later = now + length_fold.FINAL_AFTER_S + 10
    h, read = _poll(engine, rid, mt, later)
    assert read == 5
    assert _poll(engine, rid, mt, later + 5)[1] == 0
    _same(_poll(engine, rid, mt, later + 5)[0], _recount(engine, rid, mt))


def test_a_repair_starts_the_fold_again(engine: Any) -> None:
    rng = random.Random(3)
    length_fold.forget()
    rid = add_run(engine, name="fold-repair", config={"sampling": {"max_tokens": 200}})
    now = time.time()
    for i in range(30):
        _add(engine, rid, i, rng.randint(1, 200), now - 1000, rng)
    _poll(engine, rid, 200, now)
    with engine.connect() as conn, store.write_begin(conn):  # a re-derive changed folded records in place
        conn.execute(text("UPDATE record SET reasoning_len = 0 WHERE run_id = :r"), {"r": rid})
        conn.execute(text("INSERT INTO repair (run_id, kind, t, actor, selection, config_version, n_selected,"
                          " n_changed, n_skipped, status) VALUES (:r, 'rederive', :t, 'test', '{}', 1, 30, 30, 0,"
                          " 'done')"), {"r": rid, "t": now})
    h, read = _poll(engine, rid, 200, now + 1)
    assert read == 30 and h["counts"]["reasoning"][0] == 30
    _same(h, _recount(engine, rid, 200))
