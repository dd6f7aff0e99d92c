"""A stateful property test of the pausing-alarm state (#26 item 7): random sequences of pause, resume (plain:
refused while an alarm holds the run), acknowledge and resume for N records, fault injection on the server
(it switches its reasoning field: every record then fails field_mismatch), the fix (the reading set to what the
server sends, a new config version), re-derive, re-run and undo of the field-mismatch records, a cap change, and
an immediate stop followed by a restart of the worker, with the real in-process worker against the simulator over
a real SQLite file.

Invariants, checked after every step:
- no claim while a pausing alarm is open and not snoozed: once a check saw an alarm holding the run, no record
  is claimed after that moment for as long as the same alarm still holds it and nothing acknowledged it;
- a run never reaches ``completed`` without naming every open data-quality alarm in its status message;
- the run's counters (what the status line prints) equal the records in the database.

Examples and steps: the "ci" profile runs 6 examples of at most 8 steps (10-60 s here on one shared core); the
"fuzz" profile (SYNTHWATCH_HYPOTHESIS_PROFILE=fuzz, `./dev fuzz`) takes its max_examples and 20 steps.
Not covered: a kill -9 of a worker process (an immediate stop and a restart stand in for it here; the lease
return after a kill -9 has tests of its own in test_worker.py)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from sqlalchemy import text
from test_alarms import patch_sim
from test_checks_kit import writer_hooks
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.quality.open_items import open_items_text
from synthwatch.repair.actions import RepairError, rederive_records, rerun_records, select
from synthwatch.repair.history import list_repairs, undo
from synthwatch.store import queue as store
from synthwatch.store.versions import VersionError, change_settings

FUZZ = os.environ.get("SYNTHWATCH_HYPOTHESIS_PROFILE") == "fuzz"
EXAMPLES = settings.default.max_examples if FUZZ else 6
STEPS = 20 if FUZZ else 8


def _sim_config(url: str) -> str:
    with urllib.request.urlopen(f"{url}/sim/config", timeout=5) as resp:
        return resp.read().decode()


def _gate(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        r = run_row(engine, run_id)
        return store.alarm_gate(conn, run_id, int(r["total"] - r["n_pending"]), time.time(), reopen=False)[0]


class AlarmMachine(RuleBasedStateMachine):
    def __init__(self, engine: Any, url: str, dataset: Any, n: int) -> None:
        super().__init__()
        self.engine, self.url = engine, url
        self.dataset, self.n = dataset, n
        self.held: tuple[frozenset[int], float] | None = None  # alarms seen holding the run, and when

    @initialize(sends=st.sampled_from(["reasoning", "reasoning_content"]))
    def start(self, sends: str) -> None:
        """The run reads `reasoning`; the server sends that (healthy) or `reasoning_content` (a mismatch from the
        first record)."""
        patch_sim(self.url, reasoning_field=sends)
        self.config = make_config(self.url, self.dataset, concurrency=4, reasoning={"mode": "reasoning"},
                                  name=f"sm-{self.n}")
        self.bg = Background(self.engine, self.config,
                             hooks=lambda rid: writer_hooks(self.engine, rid, self.config)).start()
        self.run_id = self.bg.run_id
        self._registered()

    def _registered(self) -> None:
        # a control written before the worker registered would be overwritten by its start (desired = 'run')
        wait_for(lambda: getattr(self.bg.worker, "writer", None) is not None, timeout_s=20, what="worker started")

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

    @rule()
    def stop_and_restart(self) -> None:
        self.bg.worker.local_stop = "stop_now"  # a second Ctrl-C: in-flight records go back to pending
        self.bg.worker._wake.set()
        self.bg.join(30)
        self.bg = Background(self.engine, self.config, run_id=self.run_id,
                             hooks=lambda rid: writer_hooks(self.engine, rid, self.config)).start()
        self._registered()

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
        if not hasattr(self, "bg"):
            return
        self.bg.worker.local_stop = "stop_now"
        self.bg.worker._wake.set()
        self.bg.join(30)


@pytest.mark.slow
def test_alarm_state_machine(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=5, ttft_ms=10)
    dataset = prompts(400)
    made = iter(range(10_000))
    run_state_machine_as_test(
        lambda: AlarmMachine(engine, url, dataset, next(made)),
        settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None),
    )
