"""Review: sampling modes, filters + keyset pages, full-text search, flags/undo/bulk, the viewer's HTML."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from synthwatch.review import display as review_display
from synthwatch.review import filters as review_filters
from synthwatch.review import queries as review
from synthwatch.review.filters import Filters, ReviewError
from synthwatch.store import queue as store
from synthwatch.store import search_index

# ------------------------------------------------------------------------------------------ helpers


def add_run(engine: Any, name: str = "review-run", config: dict[str, Any] | None = None) -> int:
    with engine.connect() as conn, store.write_begin(conn):
        return store.create_run(conn, name, None, snapshot=config or {})


def add_record(engine: Any, run_id: int, idx: int, *, status: str = "ok", prompt: str | None = None,
               reasoning: str | None = "Let me think. 2 + 2 = 4.", content: str | None = "The answer is 4.",
               **cols: Any) -> int:
    """A finished record written the way the worker's writer leaves it (real SQL, queued for the search index)."""
    row: dict[str, Any] = {
        "run_id": run_id, "idx": idx, "rnd": random.random(), "status": status,
        "prompt_json": orjson.dumps([{"role": "user", "content": prompt or f"What is {idx} + 2?"}]).decode(),
        "reasoning": reasoning, "content": content, "content_null": False, "attempts": 1,
        "check_flags": 0, "reasoning_source": "reasoning" if reasoning else "none",
        "reasoning_len": len(reasoning) if reasoning is not None else None,
        "content_len": len(content) if content is not None else None,
        "finish_reason": "stop" if status == "ok" else None, "endpoint": "127.0.0.1:1",
        "finished_at": time.time() if status in ("ok", "error", "timeout") else None,
        "latency_s": 0.5, "completion_tokens": 40,
    }
    row.update(cols)
    names = ", ".join(row)
    with engine.connect() as conn, store.write_begin(conn):
        rid = int(conn.execute(text(f"INSERT INTO record ({names}) VALUES ({', '.join(':' + k for k in row)})"
                                    " RETURNING id"), row).scalar_one())
        if reasoning is not None or content is not None:
            search_index.enqueue(conn, [rid])  # what every writer of text does
        return rid


def ids_of(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


# ---------------------------------------------------------------------------------------- full text


def fts_integrity(conn: Any) -> None:
    """record_fts holds exactly the current text of the records it should (finished, not queued): every
    (term, record, column, position) instance equals that of an index built from scratch, and FTS5's own
    check of its structure passes."""
    conn.execute(text("INSERT INTO record_fts(record_fts, rank) VALUES ('integrity-check', 0)"))
    conn.execute(text("CREATE VIRTUAL TABLE temp.fts_ref USING fts5(prompt_json, reasoning, content)"))
    try:
        conn.execute(text(
            "INSERT INTO temp.fts_ref(rowid, prompt_json, reasoning, content) SELECT id, prompt_json, reasoning,"
            " content FROM record WHERE (reasoning IS NOT NULL OR content IS NOT NULL)"
            " AND id NOT IN (SELECT record_id FROM record_fts_queue)"))
        conn.execute(text("CREATE VIRTUAL TABLE temp.v_live USING fts5vocab(main, record_fts, 'instance')"))
        conn.execute(text("CREATE VIRTUAL TABLE temp.v_ref USING fts5vocab(temp, fts_ref, 'instance')"))
        cols = "term, doc, col, offset"
        extra = conn.execute(text(f"SELECT {cols} FROM temp.v_live EXCEPT SELECT {cols} FROM temp.v_ref LIMIT 5")).all()
        missing = conn.execute(text(f"SELECT {cols} FROM temp.v_ref EXCEPT SELECT {cols} FROM temp.v_live LIMIT 5")).all()
        assert not extra and not missing, f"stale entries {extra}, missing entries {missing}"
    finally:
        for t in ("v_live", "v_ref", "fts_ref"):
            conn.execute(text(f"DROP TABLE IF EXISTS temp.{t}"))


def indexed_ids(conn: Any) -> set[int]:
    return {int(r[0]) for r in conn.execute(text("SELECT id FROM record_fts_docsize"))}


def queued_ids(conn: Any) -> set[int]:
    return {int(r[0]) for r in conn.execute(text("SELECT record_id FROM record_fts_queue"))}


def test_fts_follows_the_worker(engine: Any, sim: Any, prompts: Any) -> None:
    """A real worker run queues its finished records without indexing them; the indexer makes them
    searchable; pending ones are never indexed; an update re-indexes."""
    from workerkit import Background, make_config

    url = sim()
    # in a thread with its own event loop: a Playwright test earlier in the session leaves a loop running here
    worker = Background(engine, make_config(url, prompts(12), cap=8, concurrency=2)).start()
    assert worker.join(60) in ("completed", "stopped")
    run_id = worker.run_id
    with engine.connect() as conn:
        finished = {int(r[0]) for r in conn.execute(
            text("SELECT id FROM record WHERE reasoning IS NOT NULL OR content IS NOT NULL"))}
        pending = conn.execute(text("SELECT count(*) FROM record WHERE status = 'pending'")).scalar_one()
        # the worker tokenized nothing: every finished record waits in the queue
        assert len(finished) >= 8 and pending >= 1
        assert queued_ids(conn) == finished and not indexed_ids(conn)
        assert search_index.backlog(conn) == len(finished)
    assert search_index.catch_up(engine)
    with engine.connect() as conn:
        assert indexed_ids(conn) == finished and not queued_ids(conn)
        # every simulator answer says "The answer is"
        pg = review.page(conn, run_id, Filters(q="answer", field="content"), limit=100)
        assert len(pg.rows) == len(finished)
        some = pg.rows[0]["id"]
    rewrite(engine, some, "content = 'zyxwvut quokka'")
    with engine.connect() as conn:
        # the old entry left the index at once; the new text waits for the indexer
        assert some not in indexed_ids(conn) and queued_ids(conn) == {some}
        assert some not in ids_of(review.page(conn, run_id, Filters(q="answer", field="content"), limit=100).rows)
        fts_integrity(conn)
    search_index.catch_up(engine)
    with engine.connect() as conn:
        assert ids_of(review.page(conn, run_id, Filters(q="quokka")).rows) == [some]
        assert some not in ids_of(review.page(conn, run_id, Filters(q="answer", field="content"), limit=100).rows)
        # prompts are searchable too, and the field restriction holds
        assert review.page(conn, run_id, Filters(q="What", field="prompt"), limit=100).rows
        assert not review.page(conn, run_id, Filters(q="quokka", field="reasoning")).rows
        fts_integrity(conn)


def rewrite(engine: Any, record_id: int, assignments: str) -> None:
    """Rewrite a finished record's text the one supported way: unindex, write, queue (one transaction)."""
    with engine.connect() as conn, store.write_begin(conn):
        search_index.unindex(conn, [record_id])
        conn.execute(text(f"UPDATE record SET {assignments} WHERE id = :i"), {"i": record_id})
        search_index.enqueue(conn, [record_id])


def test_fts_queue_keeps_the_index_exact(engine: Any) -> None:
    """Every order of rewrite, delete and indexing leaves record_fts equal to the records' current text
    (compared instance by instance with an index built from scratch), and a search finds exactly the current
    words."""
    run_id = add_run(engine)
    a = add_record(engine, run_id, 0, content="alpha one")
    b = add_record(engine, run_id, 1, content="bravo one")
    c = add_record(engine, run_id, 2, content="charlie one")
    d = add_record(engine, run_id, 3, status="pending", reasoning=None, content=None)

    def delete(record_id: int) -> None:
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("DELETE FROM record WHERE id = :i"), {"i": record_id})

    # queued, then rewritten twice and deleted before the indexer ever ran
    rewrite(engine, b, "content = 'bravo two'")
    rewrite(engine, b, "content = 'bravo three'")
    delete(c)
    with engine.connect() as conn:
        assert queued_ids(conn) == {a, b} and not indexed_ids(conn)
    assert search_index.catch_up(engine)
    # indexed, then rewritten (the old words must leave the index), emptied, and a pending one finished
    rewrite(engine, a, "content = 'alpha two'")
    rewrite(engine, b, "reasoning = NULL, content = NULL")
    rewrite(engine, d, "status = 'ok', reasoning = 'delta thoughts', content = 'delta one'")
    with engine.connect() as conn:
        fts_integrity(conn)
        assert queued_ids(conn) == {a, b, d} and not indexed_ids(conn)  # b has no text: dequeued, not indexed
    # an indexed record deleted: its entry goes with it (the delete trigger)
    assert search_index.catch_up(engine)
    delete(d)
    with engine.connect() as conn:
        fts_integrity(conn)
        assert indexed_ids(conn) == {a}

        def found(q: str) -> list[int]:
            return ids_of(review.page(conn, run_id, Filters(q=q), limit=100).rows)

        assert found("alpha") == [a] and found("two") == [a]
        assert found("one") == [] and found("bravo") == [] and found("charlie") == [] and found("delta") == []
    # text rewritten behind the index's back (no unindex) and queued: the indexer does not index it twice
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE record SET content = 'alpha three' WHERE id = :i"), {"i": a})
        search_index.enqueue(conn, [a])
    assert search_index.catch_up(engine)
    with engine.connect() as conn:
        assert indexed_ids(conn) == {a} and not queued_ids(conn)
        conn.execute(text("INSERT INTO record_fts(record_fts, rank) VALUES ('integrity-check', 0)"))
    # and a rebuild repairs that case: the index holds the current text again
    with engine.connect() as conn, store.write_begin(conn):
        search_index.rebuild(conn)
    with engine.connect() as conn:
        fts_integrity(conn)
        assert indexed_ids(conn) == {a} and not queued_ids(conn)
        assert ids_of(review.page(conn, run_id, Filters(q="three"), limit=100).rows) == [a]


def test_worker_writes_fire_no_trigger(engine: Any) -> None:
    """No trigger may fire on the worker's claim and final UPDATE (or the prompt load): any trigger makes SQLite
    keep a statement journal of every page those statements change (see migration 0004_fts_queue)."""
    with engine.connect() as conn:
        triggers = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
                                     " AND tbl_name = 'record'")).all()
    assert triggers and all(" DELETE ON record" in sql for _, sql in triggers), triggers


def test_indexer_transactions_stay_short(engine: Any) -> None:
    """index_some stops near its time budget and resumes where it stopped: nothing indexed twice or skipped."""
    run_id = add_run(engine)
    long_text = " ".join(f"word{i % 997}" for i in range(4000))
    ids = [add_record(engine, run_id, i, reasoning=long_text, content=f"unique{i}") for i in range(60)]
    n, empty = search_index.index_some(engine, lock_ms=5)
    assert 0 < n < 60 and not empty
    total = n
    while not empty:
        n, empty = search_index.index_some(engine, lock_ms=5)
        total += n
    assert total == 60
    with engine.connect() as conn:
        assert indexed_ids(conn) == set(ids)
        fts_integrity(conn)
        assert ids_of(review.page(conn, run_id, Filters(q="unique17"), limit=10).rows) == [ids[17]]


def test_search_text_is_never_fts_syntax(engine: Any) -> None:
    run_id = add_run(engine)
    target = add_record(engine, run_id, 0, content='He said "NOT (this)" AND near: x* -y')
    add_record(engine, run_id, 1, content="something else")
    search_index.catch_up(engine)
    with engine.connect() as conn:
        for q in ['"NOT', "(this)", "AND near:", "x*", "-y", 'said "NOT']:
            assert target in ids_of(review.page(conn, run_id, Filters(q=q)).rows), q
        assert ids_of(review.page(conn, run_id, Filters(q="somethi*")).rows) == [target + 1]
    with pytest.raises(ReviewError, match="nothing to search"):
        review_filters.fts_query("   ")


# ------------------------------------------------------------------------------------------ sampling


def test_sampling_modes(engine: Any) -> None:
    run_id = add_run(engine)
    other = add_run(engine, "other-run")
    add_record(engine, other, 0)
    # sampling takes the first record at or after a random rnd: evenly spaced keys make every record likely
    spaced = iter((k + 0.5) / 14 for k in range(14))
    plain = [add_record(engine, run_id, i, rnd=next(spaced)) for i in range(6)]
    failing = [add_record(engine, run_id, 10 + i, check_flags=1 << i, rnd=next(spaced)) for i in range(3)]
    good = add_record(engine, run_id, 20, review="good", reviewed_at=1.0, rnd=next(spaced))
    bad_err = add_record(engine, run_id, 21, status="error", review="bad", reasoning=None, content=None,
                         rnd=next(spaced))
    old = add_record(engine, run_id, 22, finished_at=time.time() - 3600, rnd=next(spaced))
    add_record(engine, run_id, 23, status="pending", reasoning=None, content=None, finished_at=None)
    ok_all = {*plain, *failing, good, old}
    rng = random.Random(5)

    def draws(mode: str, **kw: Any) -> set[int]:
        with engine.connect() as conn:
            return {review.sample(conn, run_id, mode, rng=rng, **kw) for _ in range(200)}  # type: ignore[misc]

    assert draws("all") == ok_all
    assert draws("unreviewed") == ok_all - {good}
    assert draws("flagged") == {good, bad_err}
    assert draws("failing") == set(failing)
    assert draws("failing", check="empty_reasoning") == {failing[0]}  # bit 1 << 0 in synthwatch.quality.checks
    with engine.connect() as conn:
        assert ids_of(review.page(conn, run_id, Filters(check="empty_content")).rows) == [failing[1]]
    assert draws("recent", minutes=10) == ok_all - {old}
    assert draws("recent", minutes=120) == ok_all
    with engine.connect() as conn:
        assert review.sample(conn, other, "flagged") is None
        assert review.sample(conn, other, "failing") is None
        # exclude: never the record being looked at when another exists
        assert all(review.sample(conn, run_id, "failing", exclude=failing[0], rng=rng) != failing[0]
                   for _ in range(30))
        with pytest.raises(ReviewError, match="unknown sampling mode 'bogus'"):
            review.sample(conn, run_id, "bogus")


# ------------------------------------------------------------------------------------ filters, pages


def test_filters_and_keyset_pages(engine: Any) -> None:
    run_id = add_run(engine)
    ids = []
    for i in range(130):
        ids.append(add_record(
            engine, run_id, i, reasoning="r" * (i % 7), finish_reason="length" if i % 5 == 0 else "stop",
            endpoint="a" if i % 2 else "b", check_flags=1 if i % 3 == 0 else 0,
            review="bad" if i % 11 == 0 else None, review_reason="truncated" if i % 11 == 0 else None,
        ))
    with engine.connect() as conn:
        # newest first, pages of 50, forward and back
        p1 = review.page(conn, run_id, Filters(), limit=50)
        p2 = review.page(conn, run_id, Filters(), after=p1.next_cursor, limit=50)
        p3 = review.page(conn, run_id, Filters(), after=p2.next_cursor, limit=50)
        assert ids_of(p1.rows + p2.rows + p3.rows) == ids[::-1]
        assert p3.next_cursor is None and p1.prev_cursor is None
        back = review.page(conn, run_id, Filters(), before=p3.prev_cursor, limit=50)
        assert ids_of(back.rows) == ids_of(p2.rows)

        def all_ids(f: Filters) -> list[int]:
            out, cur = [], None
            while True:
                pg = review.page(conn, run_id, f, after=cur, limit=17)
                out += ids_of(pg.rows)
                if not pg.next_cursor:
                    return out
                cur = pg.next_cursor

        def expect(pred: Any) -> list[int]:
            return [rid for i, rid in enumerate(ids) if pred(i)][::-1]

        assert all_ids(Filters(finish_reason="length")) == expect(lambda i: i % 5 == 0)
        assert all_ids(Filters(endpoint="a", check="any")) == expect(lambda i: i % 2 and i % 3 == 0)
        assert all_ids(Filters(flag="bad", reason="truncated")) == expect(lambda i: i % 11 == 0)
        # few flagged / failing records: read from their own small index, same answers in the same order
        assert review._sparse_index(conn, run_id, Filters(flag="bad"))[0] == "ix_record_review"
        assert all_ids(Filters(flag="bad")) == expect(lambda i: i % 11 == 0)
        assert all_ids(Filters(flag="flagged", order="asc")) == expect(lambda i: i % 11 == 0)[::-1]
        assert review._sparse_index(conn, run_id, Filters(check="any"))[0] == "ix_record_failing"
        assert all_ids(Filters(check="any", status="ok")) == expect(lambda i: i % 3 == 0)
        assert review.count(conn, run_id, Filters(flag="bad")) == (len(expect(lambda i: i % 11 == 0)), False)
        assert all_ids(Filters(flag="unreviewed", reasoning_len_max=0)) == expect(lambda i: i % 7 == 0 and i % 11)
        assert all_ids(Filters(reasoning_len_min=3, reasoning_len_max=4)) == expect(lambda i: i % 7 in (3, 4))
        # sorted by reasoning length (ties by id), both directions, across pages
        asc = all_ids(Filters(sort="reasoning_len", order="asc"))
        assert asc == [rid for _, rid in sorted(((i % 7, rid) for i, rid in enumerate(ids)))]
        desc = all_ids(Filters(sort="reasoning_len", order="desc"))
        assert desc == asc[::-1]
        assert review.count(conn, run_id, Filters(finish_reason="length")) == (26, False)
        assert review.count(conn, run_id, Filters(), cap=100) == (100, True)
        # neighbours in the filtered set
        f = Filters(finish_reason="length")
        order = all_ids(f)
        row = review.get_record(conn, run_id, order[3])
        assert review.neighbours(conn, run_id, f, row) == (order[2], order[4])
        # the page query walks the narrow filter index (no table rows, no temp sort for id order)
        plan = " ".join(str(r[-1]) for r in conn.execute(text(
            "EXPLAIN QUERY PLAN SELECT id FROM record INDEXED BY ix_record_filter WHERE run_id = 1"
            " AND finish_reason = 'x' AND id < 5 ORDER BY id DESC LIMIT 50")))
        assert "COVERING INDEX ix_record_filter" in plan and "TEMP B-TREE" not in plan


def test_filter_params_are_validated() -> None:
    assert Filters.from_params({"status": "ok", "reasoning_len_max": "0", "q": " "}).params() == {
        "status": "ok", "reasoning_len_max": "0"}
    for params, message in [
        ({"status": "bogus"}, "status: unknown value 'bogus'"),
        ({"reasoning_len_min": "ten"}, "reasoning_len_min: not a whole number"),
        ({"content_len_max": "-1"}, "content_len_max: must be >= 0"),
        ({"sort": "prompt"}, "sort: unknown value"),
        ({"check": "x" * 201}, "check: a check name is at most 200 characters"),
        ({"where": "x" * 2001}, "where: the expression is longer than 2000 characters"),
    ]:
        with pytest.raises(ReviewError, match=message):
            Filters.from_params(params)
    with pytest.raises(ReviewError, match="cursor: malformed"):
        review.Cursor.decode("x~y", Filters(sort="latency_s"))


# ------------------------------------------------------------------------------------- search (HTTP)


def test_search_over_http_indexes_first_and_counts_what_it_could_not(engine: Any, live_app: Any) -> None:
    """A search indexes queued records before it runs; with no time for that, the page and the API say how many
    finished records are not searchable yet instead of silently missing them; the background indexer of a
    running dashboard drains the queue on its own."""
    run_id = add_run(engine)
    ids = [add_record(engine, run_id, i, content=f"needle{i % 3} haystack") for i in range(30)]
    # no catch-up, background indexer asleep for an hour: nothing can be indexed
    lazy = live_app(search_catch_up_ms=0, search_index_interval_ms=3_600_000)
    with httpx.Client(base_url=lazy.url) as c:
        # the indexer's first pass at start-up may run; take what is left
        with engine.connect() as conn:
            left = search_index.backlog(conn)
        body = c.get(f"/api/runs/{run_id}/records", params={"q": "haystack", "limit": 100}).json()
        assert body["search_backlog"] == left and len(body["records"]) == 30 - left
        if left:
            html = c.get(f"/runs/{run_id}/records/count", params={"q": "haystack"}).text
            assert f"{left} finished record" in html and "not yet searchable" in html
        # without a search nothing is indexed or counted
        assert c.get(f"/api/runs/{run_id}/records").json()["search_backlog"] == 0
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("INSERT OR IGNORE INTO record_fts_queue(record_id) SELECT id FROM record"
                          " WHERE id NOT IN (SELECT id FROM record_fts_docsize)"))
    # the default: a search indexes first, so it finds everything and reports no backlog
    eager = live_app(search_index_interval_ms=3_600_000)
    with httpx.Client(base_url=eager.url) as c:
        body = c.get(f"/api/runs/{run_id}/records", params={"q": "needle1", "limit": 100}).json()
        assert body["search_backlog"] == 0
        assert sorted(r["id"] for r in body["records"]) == [i for n, i in enumerate(ids) if n % 3 == 1]
        assert c.get(f"/api/runs/{run_id}/records/count", params={"q": "needle2"}).json() == {
            "count": 10, "capped": False, "search_backlog": 0}
        preview = c.post(f"/api/runs/{run_id}/flags/bulk", json={"filters": {"q": "needle0"}, "verdict": "bad",
                                                                 "reason": "other"}).json()
        assert preview["preview"]["count"] == 10 and preview["search_backlog"] == 0
    # records finished while a dashboard runs become searchable without any search
    more = [add_record(engine, run_id, 100 + i, content="latecomer") for i in range(5)]
    live_app(search_index_interval_ms=50)
    deadline = time.monotonic() + 10
    def backlog() -> int:
        with engine.connect() as conn:  # a fresh connection each time: one read transaction keeps its snapshot
            return search_index.backlog(conn)

    while backlog() and time.monotonic() < deadline:
        time.sleep(0.05)
    with engine.connect() as conn:
        assert search_index.backlog(conn) == 0 and set(more) <= indexed_ids(conn)
        fts_integrity(conn)


# ---------------------------------------------------------------------------------------- flags (HTTP)


def test_flag_undo_and_bulk_over_http(engine: Any, live_app: Any) -> None:
    run_id = add_run(engine)
    other = add_run(engine, "other-run")
    foreign = add_record(engine, other, 0)
    recs = [add_record(engine, run_id, i, reasoning="" if i < 4 else "thinking") for i in range(10)]
    srv = live_app()
    with httpx.Client(base_url=srv.url) as c:
        r1 = recs[5]
        assert c.post(f"/api/runs/{run_id}/records/{r1}/flag", json={"verdict": "good"}).status_code == 200
        r = c.post(f"/api/runs/{run_id}/records/{r1}/flag",
                   json={"verdict": "bad", "reason": "repetition", "note": "loops at the end"})
        assert r.status_code == 200 and r.json()["reason"] == "repetition"
        got = c.get(f"/api/runs/{run_id}/records/{r1}").json()
        assert (got["record"]["review"], got["record"]["review_reason"]) == ("bad", "repetition")
        assert [f["verdict"] for f in got["flags"]] == ["bad", "good"] and got["flags"][0]["note"] == "loops at the end"
        assert c.post(f"/api/runs/{run_id}/records/{r1}/undo").json()["review"]["verdict"] == "good"
        assert c.get(f"/api/runs/{run_id}/records/{r1}").json()["record"]["review"] == "good"
        c.post(f"/api/runs/{run_id}/records/{r1}/undo")
        rec = c.get(f"/api/runs/{run_id}/records/{r1}").json()["record"]
        assert rec["review"] is None and rec["reviewed_at"] is None
        r = c.post(f"/api/runs/{run_id}/records/{r1}/undo")
        assert r.status_code == 400 and r.json()["detail"] == f"nothing to undo on record {r1}"
        for body, status, message in [
            ({"verdict": "meh"}, 400, "verdict: must be good or bad"),
            ({"verdict": "good", "reason": "truncated"}, 400, "a reason goes with a bad verdict only"),
            ({"verdict": "bad", "reason": "boring"}, 400, "reason: unknown reason 'boring'"),
        ]:
            r = c.post(f"/api/runs/{run_id}/records/{r1}/flag", json=body)
            assert r.status_code == status and message in r.json()["detail"]
        r = c.post(f"/api/runs/{run_id}/records/{foreign}/flag", json={"verdict": "good"})
        assert r.status_code == 404 and f"no record {foreign} in run {run_id}" in r.json()["detail"]
        assert c.post("/api/runs/999/records/1/flag", json={"verdict": "good"}).status_code == 404

        # bulk: preview, then apply pinned to the previewed set
        body: dict[str, Any] = {"filters": {"reasoning_len_max": "0"}, "verdict": "bad", "reason": "empty_reasoning"}
        preview = c.post(f"/api/runs/{run_id}/flags/bulk", json=body).json()["preview"]
        assert preview["count"] == 4
        late = add_record(engine, run_id, 99, reasoning="")  # arrives between preview and confirmation
        done = c.post(f"/api/runs/{run_id}/flags/bulk", json={**body, "ids": preview["ids"]}).json()
        assert done["flagged"] == 4
        flagged = c.get(f"/api/runs/{run_id}/records", params={"flag": "bad", "reason": "empty_reasoning"}).json()
        assert sorted(ids_of(flagged["records"])) == recs[:4]
        assert c.get(f"/api/runs/{run_id}/records/{late}").json()["record"]["review"] is None
        # undo the run's latest action = the whole bulk flag
        assert c.post(f"/api/runs/{run_id}/flags/undo").json()["undone"] == 4
        assert c.get(f"/api/runs/{run_id}/records/count", params={"flag": "flagged"}).json() == {
            "count": 0, "capped": False, "search_backlog": 0}
        r = c.post(f"/api/runs/{run_id}/flags/bulk", json={"filters": {"status": "nope"}, "verdict": "bad"})
        assert r.status_code == 400 and "status: unknown value 'nope'" in r.json()["detail"]


def test_bulk_flag_acts_on_the_previewed_set_not_on_records_that_finished_since(engine: Any, live_app: Any) -> None:
    """#37: 36 previewed, 37 flagged. A record still pending at the preview has an id below the preview's maximum;
    when it finishes matching the filter before the confirmation, a max id let it in. The preview pins the ids."""
    run_id = add_run(engine)
    empty = [add_record(engine, run_id, i, reasoning="") for i in range(3)]
    pending = add_record(engine, run_id, 3, status="pending", reasoning=None, content=None)
    tail = add_record(engine, run_id, 4, reasoning="")
    srv = live_app()
    body: dict[str, Any] = {"filters": {"reasoning_len_max": "0"}, "verdict": "bad", "reason": "empty_reasoning"}
    with httpx.Client(base_url=srv.url) as c:
        preview = c.post(f"/api/runs/{run_id}/flags/bulk", json=body).json()["preview"]
        assert preview["count"] == 4 and preview["max_id"] == tail > pending
        with engine.connect() as conn, store.write_begin(conn):  # the pending record finishes, empty
            conn.execute(text("UPDATE record SET status = 'ok', reasoning = '', reasoning_len = 0, content = 'x',"
                              " content_len = 1, finish_reason = 'stop', finished_at = :t WHERE id = :i"),
                         {"t": time.time(), "i": pending})
        refused = c.post(f"/api/runs/{run_id}/flags/bulk", json={**body, "max_id": preview["max_id"]})
        assert refused.status_code == 400 and "ids" in refused.json()["detail"]
        done = c.post(f"/api/runs/{run_id}/flags/bulk", json={**body, "ids": preview["ids"]}).json()
        assert done["flagged"] == preview["count"] == 4
        flagged = c.get(f"/api/runs/{run_id}/records", params={"flag": "bad", "limit": 100}).json()["records"]
        assert sorted(ids_of(flagged)) == sorted([*empty, tail])
        assert c.get(f"/api/runs/{run_id}/records/{pending}").json()["record"]["review"] is None
        # the set names ids; another run's ids or a garbled set flag nothing of theirs
        other = add_run(engine, "other-run")
        foreign = add_record(engine, other, 0, reasoning="")
        done = c.post(f"/api/runs/{run_id}/flags/bulk", json={**body, "ids": str(foreign)}).json()
        assert done["flagged"] == 0
        assert c.get(f"/api/runs/{other}/records/{foreign}").json()["record"]["review"] is None
        for bad_ids in ("5-3", "x", "3,2", "0"):
            r = c.post(f"/api/runs/{run_id}/flags/bulk", json={**body, "ids": bad_ids})
            assert r.status_code == 400 and r.json()["detail"].startswith("ids:"), (bad_ids, r.text)


def test_flags_refuse_cross_site_posts(engine: Any, live_app: Any) -> None:
    run_id = add_run(engine)
    rid = add_record(engine, run_id, 0)
    srv = live_app()
    r = httpx.post(f"{srv.url}/runs/{run_id}/records/{rid}/flag", data={"verdict": "bad"},
                   headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    with engine.connect() as conn:
        assert review.get_record(conn, run_id, rid)["review"] is None


# ------------------------------------------------------------------------------------ viewer (HTML)


def test_viewer_shows_text_literally_and_marks_the_invisible(engine: Any, live_app: Any) -> None:
    run_id = add_run(engine)
    rid = add_record(engine, run_id, 0, prompt="<b>hi</b>", reasoning="safe\u202etxt.exe <script>alert(1)</script>",
                     content="", content_null=True, usage_json='{"completion_tokens": 40}',
                     extra_json='{"top": {"kv_transfer_params": null}, "unread_fields": {"reasoning_content": "x"}}')
    blank = add_record(engine, run_id, 1, reasoning="  \n\u200b ", content=None)
    srv = live_app()
    with httpx.Client(base_url=srv.url) as c:
        html = c.get(f"/runs/{run_id}/records/{rid}").text
        assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "&lt;b&gt;hi&lt;/b&gt;" in html
        assert '<span class="inv">⟨U+202E RLO⟩</span>' in html and "\u202e" not in html
        assert '<span class="empty-marker">EMPTY</span>' in html and "null in the response" in html
        assert "kv_transfer_params" in html and "unread_fields" in html  # raw tab
        html = c.get(f"/runs/{run_id}/records/{blank}").text
        assert "EMPTY (only 5 whitespace/invisible characters)" in html and "EMPTY (null)" in html
        # random sample: a redirect to a viewer; an empty mode says so
        r = c.get(f"/runs/{run_id}/sample?mode=all")
        assert r.status_code == 303 and r.headers["location"].startswith(f"/runs/{run_id}/records/")
        assert 'id="no-sample"' in c.get(f"/runs/{run_id}/sample?mode=flagged").text
        assert c.get(f"/runs/{run_id}/sample?mode=nope").status_code == 400
        assert c.get(f"/runs/{run_id}/records?sort=prompt").status_code == 400
        assert c.get(f"/runs/{run_id}/records/123456").status_code == 404
        table = c.get(f"/runs/{run_id}/records?flag=unreviewed").text
        assert f'href="/runs/{run_id}/records/{rid}?from=records"' in table.replace("flag=unreviewed&amp;", "")


def test_segments_and_emptiness() -> None:
    assert review_display.segments("a\u200db") == [("t", "a"), ("inv", "⟨U+200D ZWJ⟩"), ("t", "b")]
    assert review_display.segments("a b\tc", whitespace=True) == [("t", "a"), ("ws", "·"), ("t", "b"), ("ws", "→\t"),
                                                          ("t", "c")]
    assert review_display.segments("  \n\u200b ", whitespace=True) == [("ws", "··↵\n"), ("inv", "⟨U+200B ZWSP⟩"), ("ws", "·")]
    assert review_display.emptiness("") == "EMPTY" and review_display.emptiness(None) == "EMPTY (null)"
    assert review_display.emptiness("\u2067 \n") is not None and review_display.emptiness("x") is None


def test_long_text_is_cut_into_blocks_after_line_ends() -> None:
    segs = review_display.segments(("line of text\n" * 1000) + "tail\u200bend")
    blocks = review_display.chunks(segs, size=100)
    assert all(b[-1][1].endswith("\n") for b in blocks[:-1])  # every block but the last ends a line
    assert all(sum(len(s) for _, s in b) <= 100 for b in blocks)
    assert blocks[-1][-2:] == [("inv", "⟨U+200B ZWSP⟩"), ("t", "end")] and blocks[-1][0][1].endswith("\ntail")


@given(st.text(alphabet="ab \n\t\u200b\u202e", max_size=400), st.integers(1, 60), st.booleans())
def test_blocks_give_the_text_back_unchanged(value: str, size: int, ws: bool) -> None:
    segs = review_display.segments(value, whitespace=ws)
    blocks = review_display.chunks(segs, size=size)
    assert "".join(s for b in blocks for _, s in b) == "".join(s for _, s in segs)
    assert [k for b in blocks for k, s in b if k != "t"] == [k for k, _ in segs if k != "t"]  # markers never cut
    assert all(b for b in blocks)  # no empty block
    longest_marker = max((len(s) for k, s in segs if k != "t"), default=0)
    # text alone fills a block to `size` at most; a marker joins a block holding < size characters and is never cut
    assert all(sum(len(s) for _, s in b) <= size + max(longest_marker - 1, 0) for b in blocks)


def test_migration_indexes_exist(db_path: Path, engine: Any) -> None:
    with engine.connect() as conn:
        names = {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type IN ('index', 'trigger')"))}
    assert {"ix_record_review", "ix_record_failing", "ix_record_filter", "record_fts_bd", "record_fts_ad"} <= names


def test_every_check_is_a_review_filter_and_an_export_exclusion(engine: Any) -> None:
    """The check filter and the export's exclusions read the checks' bit map directly: every check the writer
    runs can be filtered on and excluded, and a check that is not one is refused (in the run's catalogue, #38)."""
    from synthwatch.check_catalog import ALL_STATUS_CHECKS, BIT, CHECK_NAMES
    from synthwatch.export.plan import check_bit_map
    from synthwatch.review.filters import selections

    run_id = add_run(engine)
    with engine.connect() as conn:
        for name in CHECK_NAMES:
            f = Filters.from_params({"check": name})
            assert f.check == name and selections(conn, run_id, f) == []  # answered by the record's bits
        with pytest.raises(ReviewError, match="check: unknown check 'no_such_check'"):
            review.count(conn, run_id, Filters.from_params({"check": "no_such_check"}))
    assert check_bit_map() == BIT and len(BIT) == len(CHECK_NAMES)
    assert set(check_bit_map(ok_records_only=True)) == set(CHECK_NAMES) - ALL_STATUS_CHECKS
