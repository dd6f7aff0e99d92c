"""A stateful property test of the pausing-alarm state (#26 item 7): random sequences of pause, resume (plain:
refused while an alarm holds the run), acknowledge and resume for N records, fault injection on the server
(it switches its reasoning field: every record then fails field_mismatch), the fix (the reading set to what the
server sends, a new config version), re-derive, re-run and undo of the field-mismatch records, a cap change, an
immediate stop followed by a restart of the worker, and a kill -9 of a real `synthwatch run` process mid-run
followed by a restart (in-process or another `synthwatch run --name RUN` process), against the simulator over a
real SQLite file.

Invariants, checked after every step:
- no claim while a pausing alarm is open and not snoozed: once a check saw an alarm holding the run, no record
  is claimed after that moment for as long as the same alarm still holds it and nothing acknowledged it;
- a run never reaches ``completed`` without naming every open data-quality alarm in its status message;
- the run's counters (what the status line prints) equal the records in the database.

Examples and steps: the "ci" profile runs 6 examples of at most 8 steps (a minute or two on one shared core: each
`synthwatch run` process costs its start-up); the "fuzz" profile (`./dev fuzz --suite alarms`) runs examples of 20
steps, 30 examples at a time, until its time share (SYNTHWATCH_FUZZ_SECONDS) is spent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from conftest import ROOT, cli_env
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from sqlalchemy import text
from test_alarms import patch_sim
from test_checks_kit import writer_hooks
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.quality.detection.open_items import open_items_text
from synthwatch.repair.actions import RepairError, rederive_records, rerun_records, select
from synthwatch.repair.history import list_repairs, undo
from synthwatch.store import queue as store
from synthwatch.store.versions import VersionError, change_settings
from tests.fuzzkit import FUZZ_SECONDS

FUZZ = os.environ.get("SYNTHWATCH_HYPOTHESIS_PROFILE") == "fuzz"
EXAMPLES = 30 if FUZZ else 6  # per batch: under ./dev fuzz, batches follow one another until its time share ends
STEPS = 20 if FUZZ else 8


def _sim_config(url: str) -> str:
    with urllib.request.urlopen(f"{url}/sim/config", timeout=5) as resp:
        return resp.read().decode()


def _gate(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        r = run_row(engine, run_id)
        return store.alarm_gate(conn, run_id, int(r["total"] - r["n_pending"]), time.time(), reopen=False)[0]


class InProcess:
    """The real worker (RunWorker) in a thread of this process, with the checks' writer hooks."""

    def __init__(self, engine: Any, config: Any, run_id: int | None = None) -> None:
        self.bg = Background(engine, config, run_id=run_id,
                             hooks=lambda rid: writer_hooks(engine, rid, config)).start()
        self.run_id = self.bg.run_id

    def registered(self) -> None:
        # a control written before the worker registered would be overwritten by its start (desired = 'run')
        wait_for(lambda: getattr(self.bg.worker, "writer", None) is not None, timeout_s=60, what="worker started")

    def stop_now(self) -> None:
        self.bg.worker.local_stop = "stop_now"  # a second Ctrl-C: in-flight records go back to pending
        self.bg.worker._wake.set()
        self.bg.join(60)


class CliProcess:
    """A real `synthwatch run --name RUN --db DB` process (a resume from the stored settings); its output goes to
    a file (a pipe nobody reads could fill and block it)."""

    def __init__(self, engine: Any, db: str, name: str, run_id: int, log: Any) -> None:
        self.engine, self.run_id, self.log = engine, run_id, log
        self.proc = subprocess.Popen([sys.executable, "-m", "synthwatch", "run", "--name", name, "--db", db,
                                      "--quiet"], stdout=log, stderr=subprocess.STDOUT, env=cli_env(), cwd=ROOT)
        self.started = time.time()

    def worker_id(self) -> int | None:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT MAX(id) FROM worker WHERE run_id = :r AND pid = :p"),
                                {"r": self.run_id, "p": self.proc.pid}).scalar_one()

    def registered(self) -> None:
        """Its worker row exists (it has taken the run over), or it ended on its own (a finished run)."""
        wait_for(lambda: self.worker_id() is not None or self.proc.poll() is not None, timeout_s=180,
                 what="the synthwatch run process to register")
        if self.proc.poll() is not None and self.worker_id() is None:
            raise AssertionError(f"synthwatch run exited {self.proc.returncode} before it started:\n{self.output()}")

    def claimed(self) -> int:
        with self.engine.connect() as conn:  # the worker row's count, written in each claim's transaction
            return int(conn.execute(text("SELECT COALESCE(MAX(claimed), 0) FROM worker WHERE run_id = :r AND pid = :p"),
                                    {"r": self.run_id, "p": self.proc.pid}).scalar_one())

    def output(self) -> str:
        self.log.flush()
        return open(self.log.name, errors="replace").read()[-3000:]

    def kill_9(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)

    def stop_now(self) -> None:
        """Ctrl-C twice: the second stops at once (in-flight records go back to pending). Sent again until the
        process ends: two signals sent back to back may reach its handler as one."""
        deadline = time.monotonic() + 120
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"synthwatch run did not stop on Ctrl-C:\n{self.output()}")


class AlarmMachine(RuleBasedStateMachine):
    def __init__(self, engine: Any, db: str, url: str, dataset: Any, n: int, logs: Any) -> None:
        super().__init__()
        self.engine, self.db, self.url = engine, db, url
        self.dataset, self.n, self.logs = dataset, n, logs
        self.held: tuple[frozenset[int], float] | None = None  # alarms seen holding the run, and when
        self.worker: InProcess | CliProcess | None = None
        self.left: list[int] = []  # per kill -9: the records its process died holding

    @initialize(sends=st.sampled_from(["reasoning", "reasoning_content"]))
    def start(self, sends: str) -> None:
        """The run reads `reasoning`; the server sends that (healthy) or `reasoning_content` (a mismatch from the
        first record)."""
        patch_sim(self.url, reasoning_field=sends)
        # lease_s 2 (the least allowed): a worker killed with claims held is taken over soon
        self.config = make_config(self.url, self.dataset, concurrency=4, reasoning={"mode": "reasoning"},
                                  name=f"sm-{self.n}", lease_s=2)
        self.worker = InProcess(self.engine, self.config)
        self.run_id = self.worker.run_id
        self.worker.registered()

    def _cli(self) -> CliProcess:
        log = open(self.logs / f"sm-{self.n}-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
        return CliProcess(self.engine, self.db, self.config.name, self.run_id, log)

    def _acked(self) -> None:
        self.held = None  # an acknowledgement (or a new worker's view of it) starts a new observation

    # ---------------------------------------------------------------- rules

    @rule(field=st.sampled_from(["reasoning", "reasoning_content"]))
    def server_switches_field(self, field: str) -> None:
        patch_sim(self.url, reasoning_field=field)

    @rule()
    def pause(self) -> None:
        store.apply_control(self.engine, self.run_id, "pause", actor="test")

    @rule()
    def plain_resume(self) -> None:
        try:
            store.apply_control(self.engine, self.run_id, "resume", actor="test")
        except store.AlarmOpen:
            assert _gate(self.engine, self.run_id), "refused without an alarm holding the run"

    @rule()
    def resume_behind_the_back(self) -> None:
        """Any path that sets the run going without asking (an old client, a script): the claim must hold."""
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE run SET desired = 'run' WHERE id = :r AND desired = 'pause'"),
                         {"r": self.run_id})

    @rule(n=st.integers(1, 30))
    def ack_and_resume(self, n: int) -> None:
        store.apply_control(self.engine, self.run_id, "resume", actor="test", ack_records=n)
        self._acked()

    @rule(cap=st.one_of(st.none(), st.integers(20, 400)))
    def change_cap(self, cap: int | None) -> None:
        store.apply_control(self.engine, self.run_id, "cap", "none" if cap is None else cap, actor="test")

    @rule(cli=st.booleans())
    def stop_and_restart(self, cli: bool) -> None:
        """An immediate stop (two Ctrl-C), then the same command again: in this process or as `synthwatch run`."""
        assert self.worker is not None
        self.worker.stop_now()
        self.worker = self._cli() if cli else InProcess(self.engine, self.config, self.run_id)
        self.worker.registered()

    @rule(after=st.integers(0, 12), then_cli=st.booleans())
    def kill_9_and_restart(self, after: int, then_cli: bool) -> None:
        """kill -9 of a real `synthwatch run` process mid-run (once it claimed ``after`` records, or the run is
        held or over), then a restart: its claims are taken over, nothing else."""
        assert self.worker is not None
        if not isinstance(self.worker, CliProcess):
            self.worker.stop_now()  # the run goes on in a real process, the one that is killed
            self.worker = self._cli()
            self.worker.registered()
        victim = self.worker
        wait_for(lambda: victim.proc.poll() is not None or victim.claimed() >= after
                 or run_row(self.engine, self.run_id)["desired"] != "run", timeout_s=120,
                 what=f"the process to claim {after} records")
        victim.kill_9()
        with self.engine.connect() as conn:  # the claims it died holding (taken over by the next worker)
            self.left.append(int(conn.execute(text(
                "SELECT COUNT(*) FROM record r JOIN worker w ON w.id = r.worker_id WHERE r.run_id = :r"
                " AND w.pid = :p AND r.status = 'in_flight'"), {"r": self.run_id, "p": victim.proc.pid}).scalar_one()))
        self.worker = self._cli() if then_cli else InProcess(self.engine, self.config, self.run_id)
        self.worker.registered()

    @rule()
    def fix_reading(self) -> None:
        """The person sets the reading to the field the server sends now (a new config version)."""
        field = json.loads(_sim_config(self.url))["reasoning_field"]
        try:
            change_settings(self.engine, self.run_id, {"reasoning.mode": field}, actor="test")
        except VersionError:
            pass  # it reads that field already: a clear refusal

    @rule()
    def rederive(self) -> None:
        try:
            with self.engine.connect() as conn:
                sel = select(conn, self.run_id, check="field_mismatch")
            rederive_records(self.engine, self.run_id, sel, actor="test")
        except RepairError:
            pass  # nothing to re-derive: a clear refusal, not a fault

    @rule()
    def rerun(self) -> None:
        try:
            with self.engine.connect() as conn:
                sel = select(conn, self.run_id, check="field_mismatch")
            rerun_records(self.engine, self.run_id, sel, actor="test")
        except RepairError:
            pass

    @rule()
    def undo_last_repair(self) -> None:
        with self.engine.connect() as conn:
            done = [r for r in list_repairs(conn, self.run_id) if r["can_undo"]]
        if done:
            try:
                undo(self.engine, self.run_id, done[0]["id"], actor="test")
            except RepairError:
                pass

    @rule()
    def let_it_run(self) -> None:
        start = run_row(self.engine, self.run_id)
        done0 = start["n_ok"] + start["n_error"] + start["n_timeout"]
        with_progress = lambda: (lambda r: r["status"] != "running" or  # noqa: E731
                                 r["n_ok"] + r["n_error"] + r["n_timeout"] >= done0 + 8)(run_row(self.engine,
                                                                                                  self.run_id))
        wait_for(with_progress, timeout_s=20, what="progress or a pause")

    # ---------------------------------------------------------------- invariants

    @invariant()
    def no_claim_while_held(self) -> None:
        blocked = frozenset(a["id"] for a in _gate(self.engine, self.run_id) if a["acked_at"] is None)
        now = time.time()
        if self.held is not None and self.held[0] and self.held[0] <= blocked:
            with self.engine.connect() as conn:
                late = conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND claimed_at > :t"),
                                    {"r": self.run_id, "t": self.held[1]}).scalar_one()
            assert late == 0, f"{late} records claimed while alarms {sorted(self.held[0])} held the run"
            return
        self.held = (blocked, now) if blocked else None

    @invariant()
    def completion_names_open_alarms(self) -> None:
        r = run_row(self.engine, self.run_id)
        if r["status"] != "completed":
            return
        with self.engine.connect() as conn:
            want = open_items_text(conn, self.run_id)  # every open item named, as stored at the end
        if want:
            assert (r["status_message"] or "").startswith(want), (r["status_message"], want)

    @invariant()
    def counters_equal_the_records(self) -> None:
        with self.engine.connect() as conn:
            row = dict(conn.execute(text("SELECT n_ok, n_error, n_timeout, n_pending, n_in_flight FROM run"
                                         " WHERE id = :r"), {"r": self.run_id}).mappings().one())
            got = dict.fromkeys(("ok", "error", "timeout", "pending", "in_flight"), 0)
            for status, n in conn.execute(text("SELECT status, COUNT(*) FROM record WHERE run_id = :r"
                                               " GROUP BY status"), {"r": self.run_id}):
                got[status] = n
        assert (row["n_ok"], row["n_error"], row["n_timeout"]) == (got["ok"], got["error"], got["timeout"]), (row, got)
        assert row["n_pending"] + row["n_in_flight"] == got["pending"] + got["in_flight"], (row, got)

    def teardown(self) -> None:
        if self.worker is not None:
            self.worker.stop_now()


@pytest.mark.slow
def test_alarm_state_machine(engine, db_path, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=5, ttft_ms=10)
    dataset = prompts(400)
    made = iter(range(1_000_000))
    # A time budget is spent between whole Hypothesis runs (each with fresh random choices), never inside one: a
    # skip raised mid-example makes Hypothesis see a replay that draws less than the first time (flaky strategy).
    deadline = time.monotonic() + FUZZ_SECONDS
    while True:
        run_state_machine_as_test(
            lambda: AlarmMachine(engine, str(db_path), url, dataset, next(made), tmp_path),
            settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None),
        )
        if time.monotonic() > deadline:
            break


def _steps(machine: AlarmMachine, *steps: Any) -> None:
    """Named steps, each followed by the invariants (as the state machine checks them)."""
    try:
        for step in steps:
            step()
            machine.no_claim_while_held()
            machine.completion_names_open_alarms()
            machine.counters_equal_the_records()
    finally:
        machine.teardown()


@pytest.mark.slow
def test_kill_9_mid_run_then_restart_keeps_an_alarms_hold(engine, db_path, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The named case next to the property: a real `synthwatch run` process killed with SIGKILL while it holds
    claims, on a healthy run and then on one that an alarm paused; after each restart (another process, then the
    in-process worker) the hold stands, nothing is claimed behind it, and the counters equal the records."""
    url = sim(reasoning_field="reasoning", seed=7, ttft_ms=10)
    m = AlarmMachine(engine, str(db_path), url, prompts(400), 0, tmp_path)

    def kill(after: int, then_cli: bool) -> Any:
        return lambda: m.kill_9_and_restart(after=after, then_cli=then_cli)

    def held() -> None:
        wait_for(lambda: _gate(engine, m.run_id), timeout_s=120, what="the field-mismatch alarm to hold the run")
        m.no_claim_while_held()  # records the hold and its moment

    _steps(m, lambda: m.start(sends="reasoning"), kill(8, True), m.let_it_run,
           lambda: m.server_switches_field("reasoning_content"), held, kill(0, True), held,
           m.resume_behind_the_back, kill(0, False), held)
    assert len(m.left) == 3 and m.left[0] > 0, m.left  # the first one died mid-run, holding claims
    with engine.connect() as conn:
        pids = conn.execute(text("SELECT COUNT(DISTINCT pid) FROM worker WHERE run_id = :r"), {"r": m.run_id}).scalar()
    assert pids >= 3  # this process, and the two `synthwatch run` processes killed


# ------------------------------------------------------------------------------------ detection as one owner (#35)


class DetectionMachine(RuleBasedStateMachine):
    """The detection module itself (quality.detection, the keeper, the claim gate, overrides) over a real SQLite file,
    driven as the writer drives it: claims through store.claim (the gate), finished records written with their
    check flags, check_stat counted, alarms evaluated. Rules: a restart every k records (a new keeper, windows
    rebuilt from the database), a check-setting change (with or without a reason), an acknowledgement for N at
    concurrency C, a failing share oscillating around the threshold.

    Invariants: no record failing an alarmed check leaves the run's problems without a named override (its item
    is open, repaired, excluded, or accepted with a reason); claims after an acknowledgement for N are at most N
    while its alarm holds the run; alarm episodes are at most the crossings of the rule's line."""

    def __init__(self, engine: Any, dataset: Any, n: int) -> None:
        super().__init__()
        from synthwatch.check_catalog import BIT, CheckSettings
        from synthwatch.quality.checks import RecordChecker, RunContext
        from synthwatch.quality.detection.alarms import AlarmKeeper, effective_rules

        self.BIT, self.CheckSettings, self.AlarmKeeper = BIT, CheckSettings, AlarmKeeper
        self.effective_rules, self.RecordChecker, self.RunContext = effective_rules, RecordChecker, RunContext
        self.engine = engine
        from workerkit import create

        cfg = make_config("http://127.0.0.1:9/v1", dataset, name=f"det-{n}",
                          checks={"rules": {"empty_reasoning": {"pause_threshold": 0.3, "pause_min_records": 20}}})
        self.run_id = create(engine, cfg)
        self.snapshot = cfg.snapshot()
        with engine.begin() as conn:
            self.worker_id = store.register_worker(conn, self.run_id)
        self.crossings = 0
        self.was_firing = False
        self.ack: tuple[int, int] | None = None  # (claimed when acknowledged, N)
        self.since_restart = 0
        self.t = 1_000_000.0
        self._restart()

    def _restart(self) -> None:
        from synthwatch.quality.detection import Hysteresis, recent_windows

        with self.engine.connect() as conn:
            cfg = json.loads(conn.execute(text("SELECT config_json FROM run WHERE id = :r"),
                                          {"r": self.run_id}).scalar_one())
            ctx = self.RunContext.from_config(self.run_id, "det", cfg)
            self.rules = self.effective_rules(ctx.settings.rules)
            self.keeper = self.AlarmKeeper(self.run_id, "det")
            self.keeper.hysteresis = Hysteresis.of(ctx.settings)
            self.windows = recent_windows(conn, self.run_id, self.RecordChecker(ctx), self.rules)
            self.keeper.load(conn)
            conn.rollback()
        self.since_restart = 0

    def _claimed(self) -> int:
        r = run_row(self.engine, self.run_id)
        return int(r["total"] - r["n_pending"])

    def _finish(self, n: int, fail_share: float, concurrency: int) -> None:
        """Claim up to n records, at most `concurrency` per claim (a worker's batches), and finish each: record i
        fails empty_reasoning when its running share would stay under fail_share."""
        name, bit = "empty_reasoning", self.BIT["empty_reasoning"]
        done = 0
        while done < n:
            with self.engine.connect() as conn, store.write_begin(conn):
                store.lock_run(conn, self.run_id)
                got, _why = store.claim(conn, self.run_id, self.worker_id, min(concurrency, n - done), 60)
            if not got:
                return
            with self.engine.connect() as conn, store.write_begin(conn):
                fails = 0
                for c in got:
                    self.t += 0.1
                    failed = (done + 1) * fail_share >= fails + 1
                    fails += failed
                    done += 1
                    conn.execute(text(
                        "UPDATE record SET status = 'ok', finished_at = :t, reasoning = :re, content = 'a',"
                        " reasoning_tokens = 5, check_flags = :f, rnd = 1 WHERE id = :i"),
                        {"t": self.t, "re": "" if failed else "thought", "f": bit if failed else 0, "i": c.id})
                    self.windows[name].add(failed)
                store.recount(conn, self.run_id)
                w = self.windows[name]
                row = conn.execute(text(
                    "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, updated_at)"
                    " VALUES (:r, :c, :f, :n, :wf, :wn, :t) ON CONFLICT (run_id, check_name) DO UPDATE SET"
                    " n_fail = check_stat.n_fail + excluded.n_fail, n_total = check_stat.n_total + excluded.n_total,"
                    " win_fail = excluded.win_fail, win_total = excluded.win_total RETURNING n_fail, n_total"),
                    {"r": self.run_id, "c": name, "f": fails, "n": len(got), "wf": w.fail, "wn": w.total,
                     "t": self.t}).one()
                from synthwatch.quality.detection.alarms import fires

                firing = fires(self.rules[name], w.fail, w.total)
                self.crossings += firing and not self.was_firing
                self.was_firing = firing
                self.keeper.evaluate(conn, self.t, {name: self.rules[name]}, {name: (w.fail, w.total)},
                                     {name: (int(row[0]), int(row[1]), None)}, {},
                                     new_fail={name: self.t} if fails else None)
                from synthwatch.quality.detection import open_items

                open_items.sync(conn, self.run_id, t=self.t)
            self.since_restart += len(got)

    # ---------------------------------------------------------------- rules

    @rule(n=st.integers(1, 40), share=st.sampled_from([0.0, 0.02, 0.5, 1.0]), k=st.integers(5, 30))
    def records_with_a_restart_every_k(self, n: int, share: float, k: int) -> None:
        """n records at a failing share; the worker restarts every k records (its state rebuilt from the DB)."""
        while n > 0:
            step = min(n, k - self.since_restart) if self.since_restart < k else 0
            if step <= 0:
                self._restart()
                continue
            self._finish(step, share, 8)
            n -= step
            if self.since_restart >= k:
                self._restart()
            if self._claimed() >= run_row(self.engine, self.run_id)["total"]:
                return

    @rule(n=st.integers(40, 120))
    def a_rate_oscillating_around_the_threshold(self, n: int) -> None:
        for i in range(0, n, 10):
            self._finish(10, 0.04 if (i // 10) % 2 else 0.06, 8)

    @rule(n=st.integers(1, 8), concurrency=st.sampled_from([1, 4, 16]))
    def ack_for_n_at_concurrency_c(self, n: int, concurrency: int) -> None:
        claimed = self._claimed()
        out = store.apply_control(self.engine, self.run_id, "resume", actor="test", ack_records=n)
        self.ack = (claimed, n) if out.get("acknowledged") else None  # nothing held the run: nothing to count
        self._finish(concurrency * 3, 1.0, concurrency)

    @rule(weaken=st.sampled_from(["disabled", "threshold", "min_records", "enabled"]), reason=st.booleans())
    def a_check_setting_change(self, weaken: str, reason: bool) -> None:
        from synthwatch.quality.checks import ChecksConfigError
        from synthwatch.quality.recompute import save_settings

        change: dict[str, Any] = {"threshold": {"threshold": 0.9}, "min_records": {"min_records": 5000},
                                  "enabled": {"enabled": False}}.get(weaken, {})
        pausing = {"pause_threshold": 0.3, "pause_min_records": 20}
        raw: dict[str, Any] = {"rules": {"empty_reasoning": {**change, **pausing}}}
        if weaken == "disabled":
            raw["disabled"] = ["empty_reasoning"]
        try:
            save_settings(self.engine, self.run_id, raw, actor="test", reason="agreed in review" if reason else None)
        except ChecksConfigError as exc:
            assert not reason and "reason" in str(exc), exc
            return
        assert reason, "a weakening was saved without a reason"
        with self.engine.connect() as conn:
            kinds = {r[0] for r in conn.execute(text("SELECT kind FROM check_override WHERE run_id = :r"),
                                                {"r": self.run_id})}
        assert kinds, "the override was not recorded"
        # back to the defaults that pause (a strengthening: no reason needed)
        save_settings(self.engine, self.run_id, {"rules": {"empty_reasoning": {"pause_threshold": 0.3,
                                                                                "pause_min_records": 20}}},
                      actor="test")
        self._restart()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def claims_after_an_ack_at_most_n(self) -> None:
        if self.ack is None:
            return
        at, n = self.ack
        if _gate(self.engine, self.run_id):  # the alarm holds the run again: the acknowledgement was used up
            assert self._claimed() - at <= n, (self._claimed(), at, n)

    @invariant()
    def episodes_at_most_one_per_crossing(self) -> None:
        with self.engine.connect() as conn:
            episodes = conn.execute(text("SELECT COUNT(*) FROM alarm WHERE run_id = :r AND rule = 'empty_reasoning'"
                                         " AND reraised_from IS NULL"), {"r": self.run_id}).scalar_one()
        assert episodes <= self.crossings, (episodes, self.crossings)

    @invariant()
    def no_bad_record_without_a_named_override(self) -> None:
        from synthwatch.quality.detection import open_items

        with self.engine.connect() as conn:
            alarmed = conn.execute(text("SELECT 1 FROM alarm WHERE run_id = :r AND rule = 'empty_reasoning'"),
                                   {"r": self.run_id}).first()
            if alarmed is None:
                return
            failing = open_items.count_failing(conn, self.run_id, "empty_reasoning").failing
            latest = [i for i in open_items.items(conn, self.run_id, include_closed=True)
                      if i["check_name"] == "empty_reasoning"]
        if not failing or not latest:
            return
        item = latest[0]
        assert item["state"] in ("open", "accepted", "excluded"), item
        if item["state"] == "accepted":
            assert (item["reason"] or "").strip(), item


def test_detection_state_machine(engine, prompts) -> None:  # type: ignore[no-untyped-def]
    dataset = prompts(600)
    made = iter(range(1_000_000))
    run_state_machine_as_test(lambda: DetectionMachine(engine, dataset, next(made)),
                              settings=settings(max_examples=30 if FUZZ else 6, stateful_step_count=STEPS,
                                                deadline=None))
