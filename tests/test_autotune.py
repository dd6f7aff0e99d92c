"""Self-tuning concurrency: the tuner's steps, and a real worker finding the simulator's knee with no timeout."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text
from workerkit import Background, make_config, run_row, wait_for

from synthwatch.store import queue as store
from synthwatch.workers.autotune import Interval, Tuner


def test_tuner_raises_while_tokens_grow_and_backs_off_on_trouble() -> None:
    t = Tuner(8, 1, 100)
    assert t.step(Interval(100.0, 1.0, 8)) == (12, "raise: output tokens/s grew to 100")
    assert t.step(Interval(150.0, 1.0, 12)) is not None and t.current == 18
    assert t.step(Interval(152.0, 1.1, 18)) is None  # a plateau: hold
    assert t.step(Interval(152.0, 1.0, 5)) is None  # too little in flight to judge
    n, why = t.step(Interval(150.0, 1.0, 18, timeouts=3))  # type: ignore[misc]
    assert n == 12 and "3 timed out" in why
    n, why = t.step(Interval(150.0, 1.0, 12, server_waiting=4, server_running=10))  # type: ignore[misc]
    assert n == 10 and "queue 4" in why
    assert Tuner(2, 2, 4).step(Interval(1.0, 1.0, 2, rate_limited=1)) is None  # never below min
    assert [h[1] for h in t.history] == [12, 18, 12, 10]
    knee = Tuner(40, 1, 100)  # once the servers' queue showed their batch size, no raise goes past it
    assert knee.step(Interval(100.0, 1.0, 40, server_waiting=5, server_running=30, in_flight_now=40)) is not None
    assert knee.current == 30 and knee.ceiling == 30
    assert knee.step(Interval(500.0, 1.0, 30, in_flight_now=30)) is None  # more tokens/s, but at the knee
    slow = Tuner(8, 1, 100)
    assert slow.step(Interval(100.0, 1.0, 8)) is not None and slow.current == 12
    n, why = slow.step(Interval(104.0, 3.0, 12))  # type: ignore[misc]
    assert n == 8 and "time per output token" in why  # past the best concurrency, it tripled: back to the best


def test_slower_tokens_alone_are_not_the_knee_and_the_published_ceiling_holds() -> None:
    """On a real vLLM the old guard stopped the tuner at 12 (8 -> 12 -> 18 -> 12, "61 ms is over 2x the lowest
    seen") while the server's queue stayed empty and it had room for 1,024 sequences: fixed 32 gave a third more
    tokens/s. Slower tokens in a bigger batch alone do not make a back-off; with a queue behind them they do."""
    flat = Tuner(8, 1, 512)
    metrics = {"server_waiting": 0.0, "server_running": 8.0, "server_ceiling": 36.0}
    per_token = 0.02
    while flat.current < 36:
        cur = flat.current
        per_token *= 1.4  # every raise makes each token slower, total tokens/s still rises
        step = flat.step(Interval(cur * 12.0 / per_token * 0.02, per_token, cur, **metrics))  # type: ignore[arg-type]
        assert step is not None, flat.history
        assert "raise" in step[1]
    assert flat.current == 36 and "36 requests the server says fit" in flat.history[-1][2]
    assert [h[1] for h in flat.history] == [12, 18, 27, 36]
    assert flat.step(Interval(10_000.0, 1.0, 36, **metrics)) is None  # type: ignore[arg-type]  # at its ceiling
    # the same slower tokens once the server has shown a queue: the guard applies
    queued = Tuner(8, 1, 512)
    assert queued.step(Interval(100.0, 0.02, 8, server_waiting=0.0, server_running=8.0)) is not None
    # a queue at the server that is not ours (we run 10 of its 20): hold, but it is pressure seen
    assert queued.step(Interval(101.0, 0.03, 12, server_waiting=3.0, server_running=20.0, in_flight_now=10)) is None
    back = queued.step(Interval(101.0, 0.09, 12, server_waiting=0.0, server_running=12.0))
    assert back is not None and back[0] == 8 and "with the server queueing or preempting" in back[1]
    # and without server metrics at all, as before: nothing says the queue is empty
    blind = Tuner(8, 1, 512)
    assert blind.step(Interval(100.0, 0.02, 8)) is not None
    back = blind.step(Interval(101.0, 0.09, 12))
    assert back is not None and back[0] == 8


def _events(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT * FROM control_event WHERE run_id = :r AND actor = 'autotune' ORDER BY id"), {"r": run_id}).mappings()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vllm-old", "vllm"])
def test_worker_finds_the_knee_without_timeouts(kind, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """An older vLLM publishes no ceiling: the knee shows through its queue. A current one says in
    cache_config_info how many requests fit at once: the tuner stops there without queueing first."""
    knee = 8
    url = sim(capacity=knee, tokens_per_s=100, reasoning_tokens="20-30", content_tokens="10-20", seed=81,
              server_kind=kind)
    config = make_config(url, prompts(3000), name="auto", concurrency=1, server_metrics={"interval_s": 0.25},
                         autotune={"enabled": True, "min": 1, "max": 64, "start": 2, "interval_s": 0.75},
                         timeouts={"connect_s": 5, "total_s": 20, "idle_s": 10})
    bg = Background(engine, config).start()
    try:
        wait_for(lambda: len(_events(engine, bg.run_id)) >= 4, timeout_s=60, what="tuning steps")
        t_end = time.monotonic() + 12
        seen: list[int] = []
        while time.monotonic() < t_end:
            seen.append(int(run_row(engine, bg.run_id)["concurrency"]))
            time.sleep(0.5)
        settled = seen[-6:]
        assert all(knee * 0.6 <= c <= knee * 1.6 for c in settled), (seen, _events(engine, bg.run_id))
        run = run_row(engine, bg.run_id)
        assert run["n_timeout"] == 0 and run["n_error"] == 0
        ev = _events(engine, bg.run_id)
        assert ev[0]["detail"].startswith("self-tuning concurrency starts at 2")
        assert any("raise:" in (e["detail"] or "") for e in ev)
        if kind == "vllm-old":
            assert any("queue" in (e["detail"] or "") for e in ev)  # it found the knee through the server's queue
        else:
            assert any("the 8 requests the server says fit" in (e["detail"] or "") for e in ev), ev
            assert max(seen) <= knee
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


@pytest.mark.slow
def test_each_endpoint_is_tuned_to_its_own_knee(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """Two servers with different knees (4 and 12): each endpoint gets its own limit, each step names its endpoint,
    and the run's concurrency is the sum."""
    # servers that publish no ceiling (older vLLM): each knee shows through that server's own queue
    small = sim(capacity=4, tokens_per_s=100, reasoning_tokens="20-30", content_tokens="10-20", seed=82,
                server_kind="vllm-old")
    big = sim(capacity=12, tokens_per_s=100, reasoning_tokens="20-30", content_tokens="10-20", seed=83,
              server_kind="vllm-old")
    config = make_config([small, big], prompts(4000), name="auto2", concurrency=1,
                         server_metrics={"interval_s": 0.25},
                         autotune={"enabled": True, "min": 1, "max": 64, "start": 2, "interval_s": 0.75},
                         timeouts={"connect_s": 5, "total_s": 20, "idle_s": 10})
    bg = Background(engine, config).start()
    try:
        label_small = "127.0.0.1:" + small.split(":")[2].split("/")[0]
        label_big = "127.0.0.1:" + big.split(":")[2].split("/")[0]
        # settled: each server's knee found through its own queue, and the run's stored concurrency caught up with
        # the endpoints' limits (the tuner writes it after each step)
        for label in (label_big, label_small):
            wait_for(lambda label=label: any("queue" in (e["detail"] or "") and label in (e["detail"] or "")
                                             for e in _events(engine, bg.run_id)), timeout_s=60,
                     what=f"the knee of {label}")
        wait_for(lambda: run_row(engine, bg.run_id)["concurrency"] == sum(ep.limit for ep in bg.worker.pool.endpoints),
                 timeout_s=30, what="the stored concurrency to match the limits")
        limits = {ep.label: ep.limit for ep in bg.worker.pool.endpoints}
        assert 2 <= limits[label_small] <= 6 and 8 <= limits[label_big] <= 18, limits
        assert run_row(engine, bg.run_id)["concurrency"] == sum(limits.values())
        details = [e["detail"] or "" for e in _events(engine, bg.run_id)[1:]]
        assert all(label_small in d or label_big in d for d in details)
        run = run_row(engine, bg.run_id)
        assert run["n_timeout"] == 0 and run["n_error"] == 0
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


def test_preemptions_make_the_tuner_back_off(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(capacity=4, rate_preempt=1.0, tokens_per_s=100, reasoning_tokens="30-40", content_tokens="10-20",
              seed=84)
    config = make_config(url, prompts(2000), name="preempt", concurrency=1, server_metrics={"interval_s": 0.25},
                         autotune={"enabled": True, "min": 1, "max": 64, "start": 8, "interval_s": 0.75},
                         timeouts={"connect_s": 5, "total_s": 20, "idle_s": 10})
    bg = Background(engine, config).start()
    try:
        wait_for(lambda: any("preempted" in (e["detail"] or "") for e in _events(engine, bg.run_id)),
                 timeout_s=60, what="a back-off on preemptions")
        with engine.connect() as conn:
            pre = conn.execute(text("SELECT MAX(preemptions_s) FROM server_metric WHERE run_id = :r"),
                               {"r": bg.run_id}).scalar()
        assert pre and pre > 0  # the simulator's num_preemptions counter, scraped as a rate
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
