"""The demo's healthy run stays healthy (#37): its server adds no fault while the timeout and error alarms' first
window of records is being written (one timeout among the first 20 records is 5 %, and the run ended red); the rate
limits and stalls the charts show come after it, and raise no alarm. A real worker with the checks writes the run
from the demo's own simulator settings."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from sqlalchemy import text
from test_checks_kit import CheckedBackground, alarms
from workerkit import make_config

from synthwatch.commands import demo
from synthwatch.simulator.launch import running_in_thread


def test_the_healthy_run_sees_no_fault_in_the_alarms_window(engine: Any, prompts: Any, monkeypatch: Any) -> None:
    need = demo.fault_free_records()
    seen: dict[str, Any] = {}
    real_patch = demo.patch_sim

    def patch_sim(base_url: str, changes: dict[str, Any]) -> None:  # what the server injected until the switch
        seen["at_switch"] = httpx.get(base_url.removesuffix("/v1") + "/sim/stats", timeout=10).json()
        with engine.connect() as conn:
            seen["finished"] = conn.execute(text("SELECT n_ok + n_error + n_timeout FROM run")).scalar_one()
        real_patch(base_url, changes)

    monkeypatch.setattr(demo, "patch_sim", patch_sim)
    assert need >= 200
    with running_in_thread(demo.healthy_sim(tokens_per_s=4000)) as url:
        config = make_config(url, prompts(need + 100), concurrency=32, name="demo-healthy",
                             timeouts={"connect_s": 5, "total_s": 120, "idle_s": 4},
                             retries={"max_attempts": 2, "backoff_base_s": 0.05, "backoff_max_s": 0.2})
        bg = CheckedBackground(engine, config).start()
        switched: list[bool] = []

        def watch() -> None:
            switched.append(demo.faults_after_window(engine, bg.run_id, url, poll_s=0.05))

        t = threading.Thread(target=watch)
        t.start()
        assert bg.join(180) == "completed"
        t.join(30)
        after = httpx.get(url.removesuffix("/v1") + "/sim/stats", timeout=10).json()
    assert switched == [True]
    with engine.connect() as conn:
        first = [r[0] for r in conn.execute(text(
            "SELECT status FROM record WHERE run_id = :r AND finished_at IS NOT NULL ORDER BY finished_at, id"
            " LIMIT :n"), {"r": bg.run_id, "n": need})]
    assert len(first) == need and set(first) == {"ok"}
    assert seen["finished"] >= need and seen["at_switch"]["chat_requests"] >= need
    assert not any(seen["at_switch"]["errors_injected"].values())  # not one fault among the window's requests
    assert sum(after["errors_injected"].values()) > 0  # the charts' rate limits and stalls came, later
    assert [a["rule"] for a in alarms(engine, bg.run_id)] == []
