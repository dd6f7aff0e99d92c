"""Nothing can leave the worker alive but stuck, and stopping has a deadline (#25).

The real `synthwatch run` process, against the simulator or a server that trickles one byte a second:
- its writer thread killed from inside (the ``writer`` fault stage, armed in that process) -> the process says
  why in one line, exits 1 within seconds, and no record is left in flight; a restart completes the run;
- SIGTERM -> in-flight requests get the grace period (``--shutdown-grace-s``), then are interrupted: their
  records go back to pending with the attempt recorded as ``interrupted``, and the process exits 3 within the
  grace plus a bounded margin; a second signal exits at once; a resume completes the records.
In-process (SQLite and PostgreSQL): the same release when the writer dies, and a helper task that dies.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_env, popen_cli
from workerkit import Background, counts, make_config, records, run_row, wait_for

from synthwatch.store.db import open_engine
from synthwatch.workers import faults
from synthwatch.workers.supervisor import FAILED_EXIT_S, HURRY_S, STOP_MARGIN_S
from tests.hostileserver import GOOD_EVENTS, HostileServer, chunked, head

# The `synthwatch` program with a fault armed in its own process (faults.armed is per process).
ARMED = ("import sys; from synthwatch.workers import faults; faults.armed[sys.argv.pop(1)] = "
         "OverflowError('Python int too large to convert to SQLite INTEGER (injected)'); "
         "from synthwatch.cli import entry; entry()")


class Lines:
    """A process's stderr read line by line in a thread: wait for a line, keep them all."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def wait(self, needle: str, timeout_s: float = 60) -> str:
        with self._cond:
            if not self._cond.wait_for(lambda: any(needle in x for x in self.lines), timeout_s):
                raise AssertionError(f"no line with {needle!r} within {timeout_s} s:\n{self.text[-3000:]}")
            return next(x for x in self.lines if needle in x)

    def join(self) -> str:
        self._thread.join(10)
        return self.text

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _sigdfl() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # whatever the test runner's own handling


def _armed(stage: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", ARMED, stage, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=ROOT, preexec_fn=_sigdfl)


def _wait_exit(proc: subprocess.Popen[str], timeout_s: float, err: Lines) -> float:
    t0 = time.monotonic()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {timeout_s} s later:\n{err.join()[-3000:]}") from None
    return time.monotonic() - t0


def _statuses(db: Path) -> dict[str, int]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT status, COUNT(*) FROM record GROUP BY status").fetchall())


def _last_attempts(db: Path, where: str) -> list[dict[str, Any]]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(f"SELECT * FROM record WHERE {where} ORDER BY idx")]


# ------------------------------------------------------------------ the writer thread dies


@pytest.mark.slow
@pytest.mark.parametrize("signals", [0, 2], ids=["on_its_own", "two_sigterms"])
def test_writer_thread_killed_from_inside_exits_and_releases(signals: int, tmp_path: Path, sim: Any,
                                                             prompts: Any) -> None:
    """The issue's reproduction: a reply the writer could not store killed the writer thread; the log said
    "writer crashed" and "worker failed", yet the process stayed alive, ignored two SIGTERMs and held its claims.
    Now: one line names the writer thread and the exception's class, the process exits 1 within seconds (also
    when two SIGTERMs come meanwhile), no record is left in flight, and running the command again completes."""
    url = sim(seed=4, tokens_per_s=60, reasoning_tokens="20", content_tokens="10")
    db = tmp_path / "w.db"
    args = ["run", "--dataset", str(prompts(30)), "--base-url", url, "--model", "sim-reasoner", "--db", str(db),
            "--name", "dies", "--concurrency", "4", "--quiet"]
    proc = _armed("writer", *args)
    err = Lines(proc)
    err.wait("writer crashed")  # the first finished record killed the writer thread; three requests were running
    for _ in range(signals):
        proc.send_signal(signal.SIGTERM)
    elapsed = _wait_exit(proc, FAILED_EXIT_S + 5, err)
    text = err.join()
    # two SIGTERMs may land before the failure is noticed (then the stop they ask for is what ends it: 3)
    assert proc.returncode == 1 if not signals else proc.returncode in (1, 3), text[-3000:]
    assert elapsed < FAILED_EXIT_S, (elapsed, text[-3000:])
    if not signals:
        line = err.wait("worker stopping:")
        assert "the database writer thread died (OverflowError: Python int too large" in line, line
        assert "exit code 1" in line, line
    st = _statuses(db)
    assert "in_flight" not in st and st.get("pending", 0) >= 1, st
    interrupted = [r for r in _last_attempts(db, "status = 'pending' AND attempts > 0")]
    for r in interrupted:
        last = json.loads(r["attempts_json"])[-1]
        assert last["kind"] == "interrupted" and "went back to pending" in last["error"], last
    engine = open_engine(str(db))
    run = run_row(engine, 1)
    assert run["status"] in ("failed", "stopped") and run["n_in_flight"] == 0, run
    with engine.connect() as conn:
        from sqlalchemy import text as sql

        assert conn.execute(sql("SELECT status FROM worker")).scalars().all() == ["exited"]
    # a restart resumes from the released claims and finishes the run
    again = popen_cli(*args, preexec_fn=_sigdfl)
    _, err2 = again.communicate(timeout=120)
    assert again.returncode == 0, err2[-3000:]
    assert counts(engine, 1) == {"ok": 30}


def test_writer_death_releases_claims_in_process(any_engine: Any, sim: Any, prompts: Any) -> None:
    """The same in-process, on SQLite and PostgreSQL: the worker ends "failed" on its own within seconds and every
    claim is back to pending, the interrupted requests' attempts recorded (a connection of the worker's own,
    since the writer is gone)."""
    url = sim(seed=5, tokens_per_s=50, reasoning_tokens="5-150", content_tokens="10")  # they end one by one
    config = make_config(url, prompts(40), concurrency=5)
    faults.armed["writer"] = OverflowError("injected")
    try:
        bg = Background(any_engine, config).start()
        assert bg.join(FAILED_EXIT_S + 20) == "failed"
    finally:
        faults.armed.clear()
    run = run_row(any_engine, bg.run_id)
    assert run["status"] == "failed" and "database writer thread died (OverflowError: injected)" in \
        run["status_message"], run["status_message"]
    c = counts(any_engine, bg.run_id)
    assert c == {"pending": 40}, c  # the one finished record was never written: it is pending again too
    back = records(any_engine, bg.run_id, "attempts > 0")
    assert 1 <= len(back) <= 5, back
    for r in back:
        last = json.loads(r["attempts_json"])[-1]
        assert last["kind"] == "interrupted" and "database writer thread died" in last["error"], last
        assert r["error_kind"] == "interrupted"
    assert run["n_in_flight"] == 0 and run["n_pending"] == 40


def test_a_helper_task_that_dies_stops_the_worker(engine: Any, sim: Any, prompts: Any) -> None:
    """The concurrency tuner's task dies (the ``tuner`` fault stage): the worker stops within seconds, says
    which task died and why, and its claims go back to pending."""
    url = sim(seed=6, tokens_per_s=40, reasoning_tokens="30", content_tokens="10")
    config = make_config(url, prompts(200), concurrency=4,
                         autotune={"enabled": True, "start": 4, "min": 1, "max": 8, "interval_s": 0.5})
    faults.armed["tuner"] = KeyError("injected")
    try:
        t0 = time.monotonic()
        bg = Background(engine, config).start()
        assert bg.join(30) == "failed"
        assert time.monotonic() - t0 < 20
    finally:
        faults.armed.clear()
    run = run_row(engine, bg.run_id)
    assert "the concurrency tuner task died (KeyError: 'injected')" in run["status_message"], run["status_message"]
    c = counts(engine, bg.run_id)
    assert "in_flight" not in c and run["n_in_flight"] == 0, c


# ------------------------------------------------------------------ a server that trickles


class Trickle:
    """Replies to marked prompts one byte a second, for ever (a long total timeout never ends them), until
    ``healed``: then with a valid streamed reply."""

    def __init__(self) -> None:
        self.healed = threading.Event()
        self.running = 0

    async def __call__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if self.healed.is_set():
            w.write(head() + chunked(*GOOD_EVENTS))
            await w.drain()
            return True
        self.running += 1
        try:
            w.write(head())
            while True:
                w.write(chunked(b":", end=False))  # an SSE comment that never ends its line
                await w.drain()
                await asyncio.sleep(1.0)
        finally:
            self.running -= 1


def _trickle_run(tmp_path: Path, url: str, *flags: str) -> tuple[list[str], Path]:
    db = tmp_path / "t.db"
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"HOSTILE {i}"}]}) + "\n"
                            for i in range(12)))
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'name = "trickle"\nmodel = "sim-reasoner"\nconcurrency = 4\ndataset = {{ path = "{data}" }}\n'
        f'endpoints = [{{ base_url = "{url}" }}]\nserver_metrics = {{ enabled = false }}\n'
        f'timeouts = {{ connect_s = 5, total_s = 600, idle_s = 60 }}\nretries = {{ max_attempts = 1 }}\n')
    return ["run", "--config", str(cfg), "--db", str(db), "--quiet", *flags], db


def _four_trickling(reply: Trickle, proc: subprocess.Popen[str], err: Lines) -> None:
    wait_for(lambda: reply.running == 4 or proc.poll() is not None, timeout_s=60, what="four requests trickling")
    assert proc.poll() is None, err.join()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("grace", [2, pytest.param(None, id="default")])
def test_sigterm_waits_the_grace_period_then_interrupts(grace: int | None, tmp_path: Path) -> None:
    """SIGTERM while four requests trickle (one byte a second, 600 s total timeout): the worker claims nothing more,
    waits the grace period (2 s here, the default 10 s in the slow variant), interrupts them and exits 3 within the
    grace plus the stop's margin; their records are pending with an ``interrupted`` attempt; a resume completes
    every record."""
    reply = Trickle()
    with HostileServer(reply) as srv:
        args, db = _trickle_run(tmp_path, srv.url, *(["--shutdown-grace-s", str(grace)] if grace else []))
        expect = grace if grace is not None else 10
        proc = popen_cli(*args, preexec_fn=_sigdfl)
        err = Lines(proc)
        _four_trickling(reply, proc, err)
        proc.send_signal(signal.SIGTERM)
        elapsed = _wait_exit(proc, expect + STOP_MARGIN_S + 10, err)
        text = err.join()
        assert proc.returncode == 3, text[-3000:]
        assert expect - 0.5 <= elapsed < expect + STOP_MARGIN_S, (elapsed, text[-3000:])
        assert f"SIGTERM: stopping gracefully (in-flight requests have {expect:g} s to finish)" in text, text
        assert f"the grace period of {expect:g} s is over; interrupting 4 in-flight requests" in text, text
        assert _statuses(db) == {"pending": 12}
        cut = _last_attempts(db, "attempts > 0")
        assert len(cut) == 4, cut
        for r in cut:
            last = json.loads(r["attempts_json"])[-1]
            assert last == {**last, "kind": "interrupted", "n": 1,
                            "error": f"interrupted: the grace period of {expect:g} s after SIGTERM ran out; the "
                                     "record went back to pending"}, last
            assert r["error_kind"] == "interrupted" and r["attempts"] == 1
        engine = open_engine(str(db))
        run = run_row(engine, 1)
        assert run["status"] == "stopped" and "interrupted after the grace period" in run["status_message"], run
        # the same command again, the server now answering: every record completes, the cut ones on their 2nd try
        reply.healed.set()
        again = popen_cli(*args, preexec_fn=_sigdfl)
        _, err2 = again.communicate(timeout=120)
        assert again.returncode == 0, err2[-3000:]
        assert counts(engine, 1) == {"ok": 12}
        assert sorted(r["attempts"] for r in records(engine, 1, "attempts > 1")) == [2, 2, 2, 2]


def test_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    """A second SIGTERM during the grace period (60 s here) stops at once: exit 3 by HURRY_S, the trickling
    requests' records pending with their attempt recorded as interrupted by the second signal."""
    reply = Trickle()
    with HostileServer(reply) as srv:
        args, db = _trickle_run(tmp_path, srv.url, "--shutdown-grace-s", "60")
        proc = popen_cli(*args, preexec_fn=_sigdfl)
        err = Lines(proc)
        _four_trickling(reply, proc, err)
        proc.send_signal(signal.SIGTERM)
        err.wait("SIGTERM: stopping gracefully")  # the first one was handled
        proc.send_signal(signal.SIGTERM)
        elapsed = _wait_exit(proc, HURRY_S + 10, err)
        text = err.join()
        assert proc.returncode == 3, text[-3000:]
        # the process ends by the second signal's deadline (HURRY_S) at the latest, plus scheduling on a busy machine
        assert elapsed < HURRY_S + 1.0, (elapsed, text[-3000:])
        assert "SIGTERM: stopping now" in text, text
    assert _statuses(db) == {"pending": 12}
    cut = _last_attempts(db, "attempts > 0")
    assert len(cut) == 4, cut
    for r in cut:
        assert json.loads(r["attempts_json"])[-1]["error"].startswith("interrupted by a second SIGTERM"), r


def test_grace_setting_is_validated(tmp_path: Path, prompts: Any) -> None:
    from conftest import run_cli

    proc = run_cli("run", "--dataset", str(prompts(2)), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--shutdown-grace-s", "-1", "--db", str(tmp_path / "x.db"))
    assert proc.returncode == 2 and "shutdown_grace_s" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_stop_deadline_holds_when_the_database_does_not_answer(tmp_path: Path) -> None:
    """SIGTERM while another connection holds the database's write lock: the worker can neither hand its claims
    back nor flush, yet the process exits 3 at the grace period plus the stop's margin, saying so; once the lock
    is gone, running the command again returns the claims it still held (its process is gone) and completes."""
    import sqlite3

    reply = Trickle()
    with HostileServer(reply) as srv:
        args, db = _trickle_run(tmp_path, srv.url, "--shutdown-grace-s", "1")
        proc = popen_cli(*args, preexec_fn=_sigdfl)
        err = Lines(proc)
        _four_trickling(reply, proc, err)
        lock = sqlite3.connect(db, isolation_level=None, timeout=30)
        lock.execute("BEGIN IMMEDIATE")  # every write of the worker now waits, then fails as "locked"
        try:
            proc.send_signal(signal.SIGTERM)
            elapsed = _wait_exit(proc, 1 + STOP_MARGIN_S + 15, err)
            text = err.join()
            assert proc.returncode == 3, text[-3000:]
            assert 1 + STOP_MARGIN_S - 0.5 <= elapsed < 1 + STOP_MARGIN_S + 1.5, (elapsed, text[-3000:])
            assert f"SIGTERM: stopping: not finished within {1 + STOP_MARGIN_S:g} s; exiting now (exit code 3)" \
                in text, text[-3000:]
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert _statuses(db).get("in_flight") == 4  # held by a process that is gone
        reply.healed.set()
        again = popen_cli(*args, preexec_fn=_sigdfl)
        _, err2 = again.communicate(timeout=120)
        assert again.returncode == 0, err2[-3000:]
        assert _statuses(db) == {"ok": 12}
