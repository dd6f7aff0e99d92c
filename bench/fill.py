"""Fill a SQLite database quickly with a realistic run: records, time series, failed attempts, audit log.

Raw ``executemany`` on one connection (not the worker): a million records take well under a
minute. The schema comes from the migrations (``open_engine``), so the result is exactly what
the worker would have written; other benchmarks reuse :func:`fill`.

    python -m bench.fill /tmp/big.db 1000000
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson

from synthwatch.workers.sketch import TPS_MIN, Sketch

SERIES_COUNTERS = (
    "finished", "ok", "errors", "timeouts", "attempts_failed", "attempt_timeouts", "retries", "dropped",
    "http_429", "http_4xx", "http_5xx", "other_errors", "cancelled", "prompt_tokens", "completion_tokens",
    "reasoning_tokens", "content_tokens", "chunks", "empty_reasoning", "finish_length", "inflight", "concurrency",
)
SERIES_COLS = ("run_id", "worker_id", "endpoint", "t", "width_s", *SERIES_COUNTERS, "latency_sum", "lat_hist",
               "ttft_hist", "tps_hist", "sources_json")

_WORDS = ("the model first restates the question then checks each step carefully and compares the result with an "
          "independent estimate before writing the final answer in a short clear paragraph with one example and "
          "a note about edge cases such as empty input very large numbers or unusual formatting").split()


def series_row(**values: Any) -> dict[str, Any]:
    """A complete series row (every NOT NULL column), with the given values."""
    row: dict[str, Any] = dict.fromkeys(SERIES_COUNTERS, 0)
    row.update({"worker_id": 0, "endpoint": "", "width_s": 5, "latency_sum": 0.0, "lat_hist": "", "ttft_hist": "",
                "tps_hist": "", "sources_json": "{}"})
    row.update(values)
    return row


def insert_series(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    conn.executemany(
        f"INSERT INTO series ({', '.join(SERIES_COLS)}) VALUES ({', '.join(':' + c for c in SERIES_COLS)})",
        [series_row(**r) for r in rows])


def _texts(rng: random.Random, n: int, words: tuple[int, int]) -> list[str]:
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(*words))) for _ in range(n)]


def fill(db_path: str | Path, n_records: int, *, run_name: str | None = None, n_endpoints: int = 2,
         n_workers: int = 2, rate_per_s: float = 50.0, status: str = "running", end_t: float | None = None,
         pending_share: float = 0.02, seed: int = 0, batch: int = 20_000, fts: bool = True) -> int:
    """Add one run of ``n_records`` records ending at ``end_t`` (default now). Returns its run id.

    ``fts=True`` queues the finished records for the search indexer, as a worker does (a dashboard
    then indexes them in the background). ``fts=False`` skips that: those records are not searchable
    and must not be updated or deleted (the triggers would delete index entries that were never made).
    Benchmarks that do not search use it, or build the index in one pass.
    """
    from synthwatch.store.db import open_engine

    open_engine(str(db_path)).dispose()  # schema from the migrations
    rng = random.Random(seed)
    end = end_t if end_t is not None else time.time()
    n_final = int(n_records * (1 - pending_share)) if status in ("running", "paused") else n_records
    duration = max(10.0, n_final / rate_per_s)
    start = end - duration
    endpoints = [f"vllm-{i}" for i in range(n_endpoints)]
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    name = run_name or f"bench-{n_records}-{int(end)}"
    config = {"model": "sim-reasoner", "dataset": {"path": "bench.jsonl"}, "reasoning": {"mode": "auto"},
              "endpoints": [{"base_url": f"http://127.0.0.1:{9000 + i}/v1", "name": e} for i, e in enumerate(endpoints)],
              "timeouts": {"total_s": 600, "idle_s": 60}}
    conn.execute("BEGIN")
    run_id = conn.execute(
        "INSERT INTO run (name, kind, status, desired, cap, concurrency, config_json, expects_reasoning, created_at,"
        " started_at, finished_at, updated_at, total, n_pending, n_in_flight, n_ok, n_error, n_timeout, n_cancelled)"
        " VALUES (?, 'generate', ?, 'run', NULL, 64, ?, 1, ?, ?, ?, ?, ?, 0, 0, 0, 0, 0, 0) RETURNING id",
        (name, status, orjson.dumps(config).decode(), start, start,
         None if status in ("running", "paused") else end, end, n_records)).fetchone()[0]
    reasonings = _texts(rng, 500, (60, 220))
    contents = _texts(rng, 500, (20, 80))
    prompts = [orjson.dumps([{"role": "user", "content": f"What is {a} + {b}?"}]).decode()
               for a, b in ((rng.randint(1, 999), rng.randint(1, 999)) for _ in range(500))]
    counts = {"ok": 0, "error": 0, "timeout": 0, "pending": 0}
    rec_cols = ("run_id", "idx", "source_id", "source_line", "rnd", "prompt_json", "status", "reasoning", "content",
                "reasoning_source", "reasoning_len", "content_len", "finish_reason", "prompt_tokens",
                "completion_tokens", "reasoning_tokens", "latency_s", "ttft_s", "n_chunks", "attempts", "error_kind",
                "error", "endpoint", "model", "finished_at")
    rec_sql = (f"INSERT INTO record ({', '.join(rec_cols)}, content_null, check_flags)"
               f" VALUES ({', '.join('?' * len(rec_cols))}, 0, 0)")
    blank = dict.fromkeys(rec_cols)
    buf: list[tuple[Any, ...]] = []
    errors: list[tuple[Any, ...]] = []
    for i in range(n_records):
        if i >= n_final:
            st = "pending"
        else:
            x = rng.random()
            st = "ok" if x < 0.94 else ("timeout" if x < 0.97 else "error")
        counts[st] += 1
        t = start + duration * min(i, n_final) / max(1, n_final)
        ep = endpoints[i % n_endpoints]
        rec = dict(blank, run_id=run_id, idx=i, source_id=f"s{i}", source_line=i + 1,
                   rnd=rng.random() if st != "pending" else -1.0,
                   prompt_json=prompts[i % 500], status=st, attempts=0)
        if st == "ok":
            r, c = reasonings[i % 500], contents[(i * 7) % 500]
            comp = (len(r) + len(c)) // 4
            lat = rng.lognormvariate(1.5, 0.5)
            rec.update(reasoning=r, content=c, reasoning_source="reasoning", reasoning_len=len(r), content_len=len(c),
                       finish_reason="stop" if rng.random() > 0.02 else "length", prompt_tokens=20,
                       completion_tokens=comp, reasoning_tokens=len(r) // 4, latency_s=lat, ttft_s=lat * 0.1,
                       n_chunks=comp, attempts=1, endpoint=ep, model="sim-reasoner", finished_at=t)
        elif st != "pending":
            kind = "idle_timeout" if st == "timeout" else "http_5xx"
            msg = "no data for 60 s" if st == "timeout" else '{"error": {"message": "Internal server error"}}'
            rec.update(latency_s=60.0, attempts=2, error_kind=kind, error=msg, endpoint=ep, finished_at=t)
            for a in range(2):
                errors.append((run_id, t - 1 + a, None, ep, kind, 500 if st == "error" else None, a == 1, msg))
        buf.append(tuple(rec.values()))
        if len(buf) >= batch:
            conn.executemany(rec_sql, buf)
            buf = []
    if buf:
        conn.executemany(rec_sql, buf)
    if fts:  # what every writer of text does (synthwatch.store.search_index.enqueue)
        conn.execute("INSERT OR IGNORE INTO record_fts_queue(record_id) SELECT id FROM record WHERE run_id = ?"
                     " AND (reasoning IS NOT NULL OR content IS NOT NULL)", (run_id,))
    conn.executemany("INSERT INTO error_event (run_id, t, record_id, endpoint, kind, status_code, final, message)"
                     " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", errors)
    conn.execute("UPDATE run SET n_ok = ?, n_error = ?, n_timeout = ?, n_pending = ? WHERE id = ?",
                 (counts["ok"], counts["error"], counts["timeout"], counts["pending"], run_id))
    _fill_series(conn, rng, run_id, start, end, duration, counts, endpoints, n_workers)
    for t, action, value in ((start, "worker_start", "1"), (start + duration / 3, "pause", None),
                             (start + duration / 3 + 30, "resume", None), (start + duration / 2, "concurrency", "64")):
        conn.execute("INSERT INTO control_event (run_id, t, action, value, actor) VALUES (?, ?, ?, ?, 'ui')",
                     (run_id, t, action, value))
    conn.execute("COMMIT")
    conn.close()
    return int(run_id)


def _fill_series(conn: sqlite3.Connection, rng: random.Random, run_id: int, start: float, end: float,
                 duration: float, counts: dict[str, int], endpoints: list[str], n_workers: int) -> None:
    n_buckets = max(1, int(duration // 5))
    per_bucket = (counts["ok"] + counts["error"] + counts["timeout"]) / n_buckets
    share = len(endpoints) * n_workers
    rows: list[dict[str, Any]] = []
    t0 = int(start // 5 * 5)
    for b in range(n_buckets + 1):
        t = t0 + 5 * b
        for w in range(1, n_workers + 1):
            rows.append(series_row(run_id=run_id, worker_id=w, endpoint="", t=t, inflight=rng.randint(20, 32),
                                   concurrency=32))
            for ep in endpoints:
                fin = max(0, round(rng.gauss(per_bucket / share, 1)))
                ok = sum(1 for _ in range(fin) if rng.random() < 0.94)
                to = (fin - ok) // 2
                lat, ttft, tps = Sketch(), Sketch(), Sketch(TPS_MIN)
                for _ in range(ok):
                    v = rng.lognormvariate(1.5, 0.5)
                    lat.add(v)
                    ttft.add(v * 0.1)
                    tps.add(rng.uniform(20, 60))
                comp = ok * rng.randint(150, 400)
                rows.append(series_row(
                    run_id=run_id, worker_id=w, endpoint=ep, t=t, finished=fin, ok=ok, timeouts=to, errors=fin - ok - to,
                    attempts_failed=2 * (fin - ok), attempt_timeouts=2 * to, retries=fin - ok, http_5xx=2 * (fin - ok - to),
                    http_429=rng.randint(0, 1), prompt_tokens=20 * ok, completion_tokens=comp,
                    reasoning_tokens=comp * 3 // 4, content_tokens=comp - comp * 3 // 4, chunks=comp,
                    empty_reasoning=0, finish_length=1 if ok and rng.random() < 0.02 else 0, inflight=rng.randint(5, 16),
                    latency_sum=4.5 * ok, lat_hist=lat.to_text(), ttft_hist=ttft.to_text(), tps_hist=tps.to_text(),
                    sources_json=orjson.dumps({"reasoning": ok}).decode() if ok else "{}"))
        if len(rows) >= 20_000:
            insert_series(conn, rows)
            rows = []
    if rows:
        insert_series(conn, rows)



MISMATCH_TEXT_WORDS = (180, 540)  # reasoning after its first line: ~1-3 KB
MISMATCH_CONTENT_WORDS = (30, 70)  # answer after its first line: a few hundred characters


def fill_field_mismatch(db_path: str | Path, n_records: int, *, run_name: str | None = None, seed: int = 0,
                        end_t: float | None = None, rate_per_s: float = 50.0, batch: int = 5_000) -> int:
    """Add one completed run of ``n_records`` ok records in the state of issue 16's story. Returns its run id.

    The server sent the reasoning in ``reasoning`` while the run read ``reasoning_content``: every record has
    ``reasoning = ''``, ``reasoning_source = 'none'`` and the text in ``extra_json.unread_fields.reasoning``,
    as the worker stores it. The run is created by ``store.create_run`` from a valid RunConfig (config version
    1, reasoning.mode = reasoning_content); each record's check_flags / check_json come from the real
    per-record checks (field_mismatch, empty_reasoning, reasoning_tokens_no_text, and truncated for the 2 %
    cut at max_tokens), check_stat holds the run's totals and rolling windows, and the field_mismatch alarm
    is open. Texts are unique per record (the question's numbers), ~1-3 KB of reasoning and a few hundred
    characters of answer; the records are in the full-text index, as a dashboard would have left them.
    Series rows (two workers, two endpoints) count the empty reasoning. Auto-pause was off for the check
    (an explicit, recorded choice in the real product), so the run went to its end.
    """
    from sqlalchemy import text

    from synthwatch.check_catalog import BIT, CHECK_NAMES
    from synthwatch.config import RunConfig
    from synthwatch.quality.checks import RecordChecker, RecordView, RunContext
    from synthwatch.quality.detection import recent_windows
    from synthwatch.quality.detection.alarms import effective_rules
    from synthwatch.store import queue as store
    from synthwatch.store.db import open_engine

    rng = random.Random(seed)
    end = end_t if end_t is not None else time.time()
    duration = max(10.0, n_records / rate_per_s)
    start = end - duration
    endpoints = ["vllm-0", "vllm-1"]
    name = run_name or f"mismatch-{n_records}-{int(end)}"
    config = RunConfig.model_validate({
        "name": name, "dataset": {"path": "prompts.jsonl"}, "model": "sim-reasoner", "concurrency": 64,
        "endpoints": [{"base_url": f"http://127.0.0.1:{9000 + i}/v1", "name": e} for i, e in enumerate(endpoints)],
        "reasoning": {"mode": "reasoning_content"},
    })
    snapshot = config.snapshot()
    engine = open_engine(str(db_path))  # schema from the migrations
    try:
        with engine.begin() as sconn:
            run_id = store.create_run(sconn, name, config)
        ctx = RunContext.from_config(run_id, name, snapshot)
        checker = RecordChecker(ctx)
        rec_cols = ("run_id", "idx", "source_id", "source_line", "rnd", "prompt_json", "status", "reasoning",
                    "content", "content_null", "reasoning_source", "reasoning_len", "content_len", "finish_reason",
                    "prompt_tokens", "completion_tokens", "reasoning_tokens", "usage_json", "latency_s", "ttft_s",
                    "n_chunks", "attempts", "attempts_json", "endpoint", "model", "system_fingerprint",
                    "response_id", "extra_json", "claimed_at", "finished_at", "check_flags", "check_json",
                    "gen_version", "derive_version", "revision", "rerun")
        rec_sql = f"INSERT INTO record ({', '.join(rec_cols)}) VALUES ({', '.join('?' * len(rec_cols))})"
        bodies = _texts(rng, 2_000, MISMATCH_TEXT_WORDS)
        tails = _texts(rng, 2_000, MISMATCH_CONTENT_WORDS)
        n_fail = dict.fromkeys(CHECK_NAMES, 0)
        n_total = dict.fromkeys(CHECK_NAMES, 0)
        example: dict[str, int] = {}
        conn = sqlite3.connect(str(db_path), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        first_id = conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM record").fetchone()[0]
        buf: list[tuple[Any, ...]] = []
        for i in range(n_records):
            a, b = 17 + i, rng.randint(1, 999)
            ep = endpoints[i % 2]
            reasoning = (f"Let me work through this step by step. The question asks me to compute {a} + {b}. "
                         f"First, {a} + {b} = {a + b}. Now {bodies[rng.randrange(len(bodies))]}")
            length = rng.random() < 0.02
            content = f"The answer is **{a + b}**. Working: {a} + {b} = {a + b}. {tails[rng.randrange(len(tails))]}"
            r_tok, c_tok = len(reasoning) // 4, len(content) // 4
            usage = {"prompt_tokens": 25, "total_tokens": 25 + r_tok + c_tok, "completion_tokens": r_tok + c_tok,
                     "completion_tokens_details": {"reasoning_tokens": r_tok}}
            extra = {"top": {"prompt_text": None}, "choice": {"logprobs": None, "stop_reason": None},
                     "unread_fields": {"reasoning": reasoning}}
            t = start + duration * i / max(1, n_records)
            lat = rng.lognormvariate(1.5, 0.5)
            prompt = orjson.dumps([{"role": "user", "content": f"What is {a} + {b}?"}]).decode()
            view = RecordView(first_id + i, i, "ok", reasoning="", content=content,
                              finish_reason="length" if length else "stop", completion_tokens=r_tok + c_tok,
                              reasoning_tokens=r_tok, unread_fields={"reasoning": reasoning}, model="sim-reasoner",
                              system_fingerprint="vllm-0.32.0-sim", prompt_json=prompt, endpoint=ep)
            applied, failed, det = checker.check(view)
            for c in CHECK_NAMES:
                if applied & BIT[c]:
                    n_total[c] += 1
                    if failed & BIT[c]:
                        n_fail[c] += 1
                        example[c] = first_id + i
            attempts = [{"n": 1, "t": round(t - lat, 3), "endpoint": ep, "ok": True, "kind": None, "status": 200,
                         "error": None, "latency_s": round(lat, 4)}]
            buf.append((run_id, i, f"p{i}", i + 1, rng.random(), prompt, "ok", "", content, 0, "none", 0,
                        len(content), "length" if length else "stop", 25, r_tok + c_tok, r_tok,
                        orjson.dumps(usage).decode(), lat, lat * 0.1, r_tok + c_tok + 1, 1,
                        orjson.dumps(attempts).decode(), ep, "sim-reasoner", "vllm-0.32.0-sim",
                        f"chatcmpl-{seed}-{i:08x}", orjson.dumps(extra).decode(), t - lat, t, failed,
                        orjson.dumps(det).decode() if det else None, 1, 1, 0, 0))
            if len(buf) >= batch:
                conn.executemany(rec_sql, buf)
                buf = []
        if buf:
            conn.executemany(rec_sql, buf)
        # searchable, as a dashboard's background indexer leaves a finished run (search_index.rebuild, one run)
        conn.execute("INSERT INTO record_fts(rowid, prompt_json, reasoning, content) SELECT id, prompt_json,"
                     " reasoning, content FROM record WHERE run_id = ?", (run_id,))
        counts = {"ok": n_records, "error": 0, "timeout": 0, "pending": 0}
        _fill_series(conn, rng, run_id, start, end, duration, counts, endpoints, 2)
        # every request of this run succeeded; every ok record had empty reasoning (source "none")
        conn.execute("UPDATE series SET ok = finished, errors = 0, timeouts = 0, attempts_failed = 0,"
                     " attempt_timeouts = 0, retries = 0, http_5xx = 0, http_429 = 0 WHERE run_id = ? AND endpoint != ''",
                     (run_id,))
        conn.execute("UPDATE series SET empty_reasoning = ok, sources_json = CASE WHEN ok > 0 THEN"
                     " '{\"none\":' || ok || '}' ELSE '{}' END WHERE run_id = ?", (run_id,))
        conn.execute(
            "UPDATE run SET status = 'completed', desired = 'run', status_message = ?, created_at = ?, started_at = ?,"
            " finished_at = ?, updated_at = ?, total = ?, n_ok = ? WHERE id = ?",
            (f"completed with {n_fail['field_mismatch']:,} records failing field_mismatch", start - 5, start, end,
             end, n_records, n_records, run_id))
        conn.execute("UPDATE config_version SET created_at = ? WHERE run_id = ?", (start - 5, run_id))
        conn.execute("INSERT INTO control_event (run_id, t, action, value, actor) VALUES (?, ?, 'worker_start', '1',"
                     " 'ui')", (run_id, start))
        conn.execute("COMMIT")
        conn.close()
        rules = effective_rules(ctx.settings.rules)
        with engine.begin() as sconn:
            windows = recent_windows(sconn, run_id, RecordChecker(ctx), rules)
            for c in CHECK_NAMES:
                if n_total[c]:
                    sconn.execute(text(
                        "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total,"
                        " example_record_id, updated_at) VALUES (:r, :c, :f, :n, :wf, :wn, :ex, :t)"),
                        {"r": run_id, "c": c, "f": n_fail[c], "n": n_total[c], "wf": windows[c].fail,
                         "wn": windows[c].total, "ex": example.get(c), "t": end})
            rule = rules["field_mismatch"]
            w = windows["field_mismatch"]
            sconn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, example_record_id, raised_at,"
                " updated_at, active, auto_paused) VALUES (:r, :rule, :sev, :title, :msg, :fix, :n, :ex, :t0, :t,"
                " true, false)"),
                {"r": run_id, "rule": rule.name, "sev": rule.severity, "title": rule.title,
                 "msg": f"The endpoint sends reasoning in `reasoning`; this run reads `reasoning_content`. {w.fail}"
                        f" of the last {w.total} records ({n_fail['field_mismatch']} of {n_total['field_mismatch']}"
                        " in the whole run) have it there (so their stored reasoning is empty).",
                 "fix": 'Set reasoning.mode = "reasoning" (or "auto") in the run config and run the affected'
                        " records again; records stored so far have their reasoning only in the raw unread field.",
                 "n": n_fail["field_mismatch"], "ex": example.get("field_mismatch"), "t0": start + 1, "t": end})
    finally:
        engine.dispose()
    return int(run_id)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("db")
    p.add_argument("n", type=int)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--no-fts", action="store_true", help="skip the full-text index (faster; not searchable)")
    a = p.parse_args(argv)
    t = time.perf_counter()
    rid = fill(a.db, a.n, rate_per_s=a.rate, fts=not a.no_fts)
    print(f"run {rid}: {a.n:,} records in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
