"""Rate limits done right: a 429 storm on one of two endpoints slows only that endpoint, Retry-After is honoured
(seconds or an HTTP date), and no record fails for good because of 429 alone within its retry budget."""

from __future__ import annotations

import email.utils
import time

import httpx
from workerkit import make_config, records, run_to_end

from synthwatch.config import EndpointConfig, EndpointPoolConfig
from synthwatch.workers.client import retry_after
from synthwatch.workers.endpoints import EndpointPool


def _chat_requests(url: str) -> int:
    return int(httpx.get(url.removesuffix("/v1") + "/sim/stats").json()["chat_requests"])


def test_retry_after_seconds_and_http_date() -> None:
    now = time.time()
    assert retry_after("7") == 7.0 and retry_after(" 0 ") == 0.0 and retry_after("99999") == 300.0
    assert abs(retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) - 30) < 1.5  # type: ignore[operator]
    assert retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert retry_after("soon") is None and retry_after(None) is None and retry_after("") is None


def test_backoff_then_slow_start_keeps_the_other_endpoint_open() -> None:
    pool = EndpointPool([EndpointConfig(base_url="http://127.0.0.1:9/v1", name="a"),
                         EndpointConfig(base_url="http://127.0.0.1:10/v1", name="b")], EndpointPoolConfig())
    a, b = pool.endpoints
    assert pool.rate_limited(a, 0.3) == 0.3
    assert a.public()["state"].startswith("backing off until ")
    assert {pool.pick().label for _ in range(10)} == {"b"} and pool.wait_s() == 0.0
    pool.rate_limited(b, None)  # no Retry-After: 1 s, doubling while 429s go on
    assert 0 < pool.wait_s() <= 0.3
    time.sleep(0.35)
    assert pool.pick() is a and a.public()["state"] == "slow start (1 at once)"
    a.outstanding = 1
    assert pool.wait_s() > 0  # a is at its window of 1, b still backs off
    a.outstanding = 0
    for want in (2, 4, 8):
        pool.success(a)
        assert a.window == want
    assert b.consecutive_limits == 1 and pool.rate_limited(b, None) == 2.0  # the second in a row waits twice as long


def test_429_storm_on_one_of_two_endpoints(engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    storm = sim(seed=71, tokens_per_s=200, reasoning_tokens="8-16", content_tokens="4-8", rate_429=1.0, retry_after_s=2)
    calm = sim(seed=72, tokens_per_s=200, reasoning_tokens="8-16", content_tokens="4-8")
    config = make_config([storm, calm], prompts(120), concurrency=8, name="storm",
                         retries={"max_attempts": 4, "backoff_base_s": 0.05, "backoff_max_s": 0.2})
    t0 = time.monotonic()
    run_id, final = run_to_end(engine, config, timeout_s=120)
    took = time.monotonic() - t0
    assert final == "completed"
    rows = records(engine, run_id)
    assert len(rows) == 120 and all(r["status"] == "ok" for r in rows), {r["status"] for r in rows}
    assert {r["endpoint"] for r in rows} == {"127.0.0.1:" + calm.split(":")[2].split("/")[0]}
    # the storming endpoint got a request, then one per Retry-After (2 s) at most: not one per record
    assert _chat_requests(storm) <= 2 + 8 + 8 * (took / 2 + 1), (_chat_requests(storm), took)
    assert _chat_requests(calm) == 120
