"""Several workers share one run: atomic batch claims, leases taken over when a worker dies, exact cap.

SQLite: two workers on one host. PostgreSQL (a real server): four workers.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import popen_cli
from sqlalchemy import text
from workerkit import answer_ok, counts, records, run_row, wait_for

from synthwatch.store.db import open_engine


def _toml(tmp_path: Path, url: str, dataset: Path, cap: int) -> Path:
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
name = "shared"
model = "sim-reasoner"
concurrency = 6
cap = {cap}
lease_s = 3
flush_interval_ms = 50
[dataset]
path = "{dataset}"
[[endpoints]]
base_url = "{url}"
[timeouts]
idle_s = 5
""")
    return cfg


# Over 30 s on SQLite (~50 s here): worker processes on one run against a paced simulator (15 tokens/s), one killed
# with SIGKILL while it holds claims, and the others must wait out its lease before they may take them over, then
# finish the cap: the pacing and the lease are the time.
@pytest.mark.slow
def test_workers_share_a_run_and_take_over_a_dead_workers_claims(any_db, tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    n_workers = 4 if any_db.startswith("postgresql") else 2
    cap = 150
    url = sim(seed=9, tokens_per_s=15, reasoning_tokens="10-30", content_tokens="5-10")
    cfg = _toml(tmp_path, url, prompts(600), cap)
    first = popen_cli("run", "--config", str(cfg), "--db", any_db, "--quiet")
    procs = [first]
    try:
        _share_and_kill(any_db, n_workers, procs)
    finally:
        for p in procs:  # a failed assertion must not leave workers running
            if p.poll() is None:
                p.kill()
                p.wait()
    engine = open_engine(any_db)
    victim = procs[1]  # killed while it held claims (checked in _share_and_kill)
    run = run_row(engine, "shared")
    c = counts(engine, run["id"])
    assert c["ok"] == cap == run["n_ok"], c
    assert c.get("in_flight", 0) == 0
    ok = records(engine, run["id"], "status = 'ok'")
    assert len({r["idx"] for r in ok}) == cap and all(answer_ok(r) for r in ok)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT pid, status, claimed FROM worker WHERE run_id = :r"), {"r": run["id"]}).all()
        # the dead worker's claims were finished by the others: no record is left claimed
        assert conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND worker_id IS NOT NULL"),
                            {"r": run["id"]}).scalar() == 0
    statuses = {pid: status for pid, status, _ in rows}
    assert statuses[victim.pid] == "dead"
    assert sum(1 for _, _, claimed in rows if claimed > 0) >= 2  # the work was shared


def _share_and_kill(any_db: str, n_workers: int, procs: list) -> None:  # type: ignore[type-arg]
    engine = open_engine(any_db)
    wait_for(lambda: _ok(engine) >= 1, timeout_s=60, what="the first worker to start")
    procs += [popen_cli("run", "--join", "shared", "--db", any_db, "--quiet") for _ in range(n_workers - 1)]
    try:
        wait_for(lambda: _live_workers(engine) == n_workers, timeout_s=60, what="all workers running")
    except AssertionError as exc:
        exited = [p.communicate()[1][-1500:] for p in procs if p.poll() is not None]
        raise AssertionError(f"{exc}; live: {_live_workers(engine)}; exited workers said:\n" + "\n".join(exited)) from None
    victim = procs[1]
    wait_for(lambda: _in_flight_of(engine, victim.pid) > 0, timeout_s=30, what="the victim to hold claims")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for p in procs:
        if p is not victim:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err


def _ok(engine) -> int:  # type: ignore[no-untyped-def]
    try:
        return int(run_row(engine, "shared")["n_ok"])
    except Exception:
        return 0


def _live_workers(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM worker WHERE status = 'running' AND heartbeat_at > :t"),
                                {"t": time.time() - 5}).scalar_one())


def _in_flight_of(engine, pid: int) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT COUNT(*) FROM record r JOIN worker w ON w.id = r.worker_id WHERE w.pid = :p AND r.status = 'in_flight'"),
            {"p": pid}).scalar_one())
