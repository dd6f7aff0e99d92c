"""Every command on PostgreSQL (a real server from tests/pgserver.py): run, import, watch, export, checks, serve,
the review search answered by PostgreSQL's own text search, and the migrations' schema matching the models."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import popen_cli, run_cli
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel
from workerkit import wait_for

from synthwatch.review import filters as review_filters
from synthwatch.review import queries as review
from synthwatch.store import models  # noqa: F401
from synthwatch.store.db import open_engine, resolve_url


def _script_lines(path: Path, start: int, n: int) -> Path:
    with path.open("a") as fh:
        for i in range(start, start + n):
            fh.write(json.dumps({"idx": i, "question": f"what is {i} + 1?", "reasoning": f"add one to {i} carefully",
                                 "content": str(i + 1), "finish_reason": "stop"}) + "\n")
    return path


def _count(engine: Any, run: str, where: str = "1=1") -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM record r JOIN run ON run.id = r.run_id"
                                     f" WHERE run.name = :n AND {where}"), {"n": run}).scalar_one())


@pytest.mark.slow
def test_every_command_on_postgresql(pg_server: Any, tmp_path: Path, sim: Any, prompts: Any) -> None:
    db = pg_server.new_database()
    url = sim(seed=3, reasoning_tokens="8-16", content_tokens="3-6")
    n = 12
    run_cli("run", "--db", db, "--dataset", str(prompts(n)), "--base-url", url, "--model", "sim-reasoner",
            "--name", "gen", "--concurrency", "4", "--quiet", check=True)
    engine = open_engine(db)
    assert _count(engine, "gen", "r.status = 'ok'") == n
    with engine.connect() as conn:
        assert conn.execute(text("SELECT status, n_ok FROM run WHERE name = 'gen'")).one() == ("completed", n)

    # import, then import again: nothing read twice
    src = _script_lines(tmp_path / "script.jsonl", 0, 5)
    run_cli("import", "--db", db, "--run", "imported", str(src), "--quiet", check=True)
    run_cli("import", "--db", db, "--run", "imported", str(src), "--quiet", check=True)
    assert _count(engine, "imported") == 5

    # watch a file another program appends to
    followed = _script_lines(tmp_path / "live.jsonl", 0, 3)
    watcher = popen_cli("watch", "--db", db, "--run", "watched", "--poll-interval-ms", "100", "--quiet",
                        str(followed))
    try:
        wait_for(lambda: _count(engine, "watched") == 3, timeout_s=30, what="the first lines ingested")
        _script_lines(followed, 3, 4)
        wait_for(lambda: _count(engine, "watched") == 7, timeout_s=30, what="appended lines ingested")
    finally:
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err

    out = tmp_path / "gen.messages.jsonl"
    run_cli("export", "gen", "--db", db, "--format", "messages", "--out", str(out), "--quiet", check=True)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == n and all(m["messages"][-1]["role"] == "assistant" for m in lines)
    assert json.loads((tmp_path / "gen.messages.jsonl.manifest.json").read_text())["counts"]

    checks = run_cli("checks", "gen", "--db", db, "--json", check=True)
    assert json.loads(checks.stdout)

    serve = popen_cli("serve", "--db", db, "--port", "0")
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "http://" not in line and time.monotonic() < deadline:
            line = serve.stderr.readline() if serve.stderr else ""
            if not line and serve.poll() is not None:
                break
        found = re.search(r"(http://[\d.]+:\d+)/runs", line)
        assert found, f"no dashboard URL in {line!r}"
        base = found.group(1)
        runs = {r["name"]: r for r in httpx.get(f"{base}/api/runs", timeout=10).json()["runs"]}
        assert set(runs) >= {"gen", "imported", "watched"}
        rid = runs["gen"]["id"]
        page = httpx.get(f"{base}/runs/{rid}", timeout=10)
        assert page.status_code == 200 and "gen" in page.text
        st = httpx.get(f"{base}/api/runs/{rid}/stats", timeout=10)
        assert st.status_code == 200, st.text
        workers = httpx.get(f"{base}/api/runs/{rid}/workers", timeout=10).json()
        assert [w["state"] for w in workers["workers"]] == ["exited"]
        # review search on PostgreSQL: text search over the finished records
        found_recs = httpx.get(f"{base}/api/runs/{runs['imported']['id']}/records",
                               params={"q": "carefully 3", "field": "reasoning"}, timeout=10)
        assert found_recs.status_code == 200, found_recs.text
        assert [r["idx"] for r in found_recs.json()["records"]] == [3]
        hostile = httpx.get(f"{base}/api/runs/{rid}/records", params={"q": "a' & !b | (c:*"}, timeout=10)
        assert hostile.status_code == 200, hostile.text
    finally:
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=30)
    engine.dispose()


@pytest.mark.parametrize("window", [review_filters.PG_FIRST_WINDOW, 1])
def test_search_on_postgresql(pg_server: Any, window: int, monkeypatch: Any) -> None:
    """Search results and keyset pages on PostgreSQL; window 1 makes every page walk several id windows."""
    monkeypatch.setattr(review_filters, "PG_FIRST_WINDOW", window)
    engine = open_engine(pg_server.new_database())
    from synthwatch.store import queue as store

    class P:
        def __init__(self, i: int, text_: str) -> None:
            self.index, self.line, self.source_id, self.messages = i, i, None, [{"role": "user", "content": text_}]

    with engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "s", None)
        store.insert_prompts(conn, rid, [P(i, f"question {i} about zebras" if i % 3 == 0 else f"plain {i}")
                                         for i in range(12)])
        conn.execute(text("UPDATE record SET status = 'ok', reasoning = 'think ' || idx || ' hippo',"
                          " content = 'answer ' || idx WHERE idx < 9"))
    with engine.connect() as conn:
        def ids(q: str, field: str = "all", **kw: Any) -> list[int]:
            pg = review.page(conn, rid, review_filters.Filters(q=q, field=field, **kw))
            return [r["idx"] for r in pg.rows]

        assert ids("zebras") == [6, 3, 0]  # finished records only (9 is pending: not indexed, as on SQLite)
        assert ids("zeb*") == [6, 3, 0]
        assert ids("zebras", "reasoning") == []
        assert ids("hippo answer 4") == [4]
        assert ids("answer", "content", order="asc")[:3] == [0, 1, 2]
        assert ids("hippo | zebras") == [6, 3, 0]  # operators are words, not syntax
        assert ids("a'b:* & !(c") == []
        assert review.count(conn, rid, review_filters.Filters(q="hippo")) == (9, False)
        assert review.count(conn, rid, review_filters.Filters(q="hippo", status="ok")) == (9, False)
        first = review.page(conn, rid, review_filters.Filters(q="hippo"), limit=4)
        rest = review.page(conn, rid, review_filters.Filters(q="hippo"), after=first.next_cursor, limit=10)
        assert [r["idx"] for r in first.rows + rest.rows] == list(range(8, -1, -1))
        back = review.page(conn, rid, review_filters.Filters(q="hippo"), before=rest.prev_cursor, limit=4)
        assert [r["idx"] for r in back.rows] == [8, 7, 6, 5]
        up = review.page(conn, rid, review_filters.Filters(q="hippo", order="asc"), limit=3)
        up2 = review.page(conn, rid, review_filters.Filters(q="hippo", order="asc"), after=up.next_cursor, limit=3)
        assert [r["idx"] for r in up.rows + up2.rows] == [0, 1, 2, 3, 4, 5]
    with engine.connect() as conn:
        # the query review builds matches the index expression (the planner can answer it from the GIN index)
        conn.execute(text("SET enable_seqscan = off"))
        conn.execute(text("SET enable_indexscan = off"))
        params: dict[str, Any] = {}
        conds = review_filters.pg_search_conds(conn, review_filters.Filters(q="zeb* hippo"), params)
        plan = "\n".join(r[0] for r in conn.execute(
            text(f"EXPLAIN SELECT id FROM record WHERE {' AND '.join(conds)}"), params))
    engine.dispose()
    assert "Bitmap Index Scan on ix_record_fts" in plan, plan


def test_migrations_match_the_models_on_postgresql(pg_server: Any) -> None:
    url = resolve_url(pg_server.new_database())
    open_engine(url).dispose()
    eng = create_engine(url)

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        return not (type_ == "index" and name == "ix_record_fts")  # PostgreSQL-only search index (0003_pg_search)

    with eng.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": include})
        diff = compare_metadata(ctx, SQLModel.metadata)
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    eng.dispose()
    assert diff == []
    from alembic.script import ScriptDirectory

    from synthwatch.store.db import alembic_config

    assert head == ScriptDirectory.from_config(alembic_config(url)).get_current_head()
