"""The server's own view: the simulator's vLLM- and SGLang-shaped /metrics scraped by a real worker, stored,
served by the API, and shown on the run page in a real browser; parsing against the facts of real servers."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from workerkit import Background, make_config, wait_for

from synthwatch.workers.server_metrics import interval_row, parse, quantile

VLLM_032 = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 5.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1.0",model_name="m"} 8.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 6.0
"""


def test_parse_real_names_old_and_new_and_rates() -> None:
    a = parse(VLLM_032, 100.0)
    assert a.kind == "vllm" and a.gauges == {"running": 3.0, "waiting": 5.0, "kv_usage": 0.75}
    old = parse(VLLM_032.replace("kv_cache_usage_perc", "gpu_cache_usage_perc"), 100.0)
    assert old.gauges["kv_usage"] == 0.75  # the name before vLLM renamed it
    b = parse(VLLM_032.replace("1000.0", "1400.0").replace("num_preemptions_total{engine=\"0\",model_name=\"m\"} 2.0",
                                                           "num_preemptions_total{engine=\"0\",model_name=\"m\"} 6.0")
              .replace('le="0.5",model_name="m"} 5.0', 'le="0.5",model_name="m"} 9.0')
              .replace('le="1.0",model_name="m"} 8.0', 'le="1.0",model_name="m"} 12.0')
              .replace('le="+Inf",model_name="m"} 10.0', 'le="+Inf",model_name="m"} 14.0'), 102.0)
    row = interval_row(a, b)
    assert row["gen_tokens_s"] == 200.0 and row["preemptions_s"] == 2.0
    assert row["queue_p50_s"] is not None and row["queue_p50_s"] <= 0.5  # the 4 new ones all queued < 0.5 s
    sg = parse("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 7\n"
               "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 1\n"
               "# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n"
               "# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput{model_name=\"m\"} 321\n", 1.0)
    assert sg.kind == "sglang" and sg.gauges == {"running": 7, "waiting": 1, "kv_usage": 0.5, "gen_throughput": 321}
    assert interval_row(None, sg)["gen_tokens_s"] == 321
    assert parse("# TYPE x gauge\nx 1\n", 1.0).kind == "unknown"
    assert quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


def _rows(engine: Any, run_id: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text("SELECT * FROM server_metric WHERE run_id = :r ORDER BY id"),
                                              {"r": run_id}).mappings()]


@pytest.mark.browser
@pytest.mark.parametrize("kind", ["vllm", "sglang", "none"])
def test_worker_scrapes_and_the_run_page_shows_the_server(kind, page, live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url = sim(server_kind=kind, server_version="0.32.0", capacity=2, tokens_per_s=60, seed=61,
              reasoning_tokens="20-40", content_tokens="10-20")
    config = make_config(url, prompts(200), concurrency=6, name=f"srv-{kind}",
                         server_metrics={"interval_s": 0.3})
    bg = Background(engine, config).start()
    try:
        wait_for(lambda: len(_rows(engine, bg.run_id)) >= 4, timeout_s=30, what="server metric rows")
        rows = _rows(engine, bg.run_id)
        if kind == "none":
            assert all(r["error"] and r["error"].startswith("no metrics") for r in rows)
            assert all(r["kind"] == "unknown" for r in rows)
        else:
            wait_for(lambda: any((r["waiting"] or 0) > 0 for r in _rows(engine, bg.run_id)), timeout_s=30,
                     what="a queue past the knee (6 in flight, capacity 2)")
            rows = _rows(engine, bg.run_id)
            assert all(r["error"] is None for r in rows), rows[-1]
            assert rows[-1]["kind"] == kind and rows[-1]["version"] == "0.32.0"
            assert max(r["running"] for r in rows) <= 2
        srv = live_app()
        api = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/server").json()
        [ep] = api["endpoints"]
        assert ep["has_metrics"] is (kind != "none")
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        row = page.locator(f'#run-server tr[data-kind="{kind if kind != "none" else "unknown"}"]')
        row.wait_for()
        if kind == "none":
            assert "no metrics" in row.inner_text()
            assert page.locator('#run-charts [data-chart="server"]').count() == 0
        else:
            assert f"{kind} 0.32.0" in row.inner_text()
            # the server's queue beside the client's in-flight requests, and its KV cache and tokens charted
            page.locator('#run-charts [data-chart="server"]').wait_for()
            assert page.locator('#run-charts [data-chart="server_tokens"]').count() == 1
            assert "server: waiting (queue)" in page.locator('#run-charts [data-chart="inflight"]').inner_html()
            ts = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/timeseries", params={"window": "5m"}).json()
            assert ts["server"] and any((p.get("server_waiting") or 0) > 0 for p in ts["points"])
    finally:
        from synthwatch.store import queue as store

        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


@pytest.mark.browser
def test_two_endpoints_each_have_their_own_server_lines(page, live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    a = sim(capacity=2, tokens_per_s=60, seed=62, reasoning_tokens="20-40", content_tokens="10-20")
    b = sim(capacity=3, tokens_per_s=60, seed=63, reasoning_tokens="20-40", content_tokens="10-20",
            server_kind="sglang")
    config = make_config([a, b], prompts(300), concurrency=10, name="srv-two", server_metrics={"interval_s": 0.3})
    bg = Background(engine, config).start()
    try:
        wait_for(lambda: len({r["endpoint"] for r in _rows(engine, bg.run_id) if r["error"] is None}) == 2,
                 timeout_s=30, what="metrics from both endpoints")
        time.sleep(1.5)
        srv = live_app()
        ts = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/timeseries", params={"window": "5m"}).json()
        per = [p["server_by_endpoint"] for p in ts["points"] if p.get("server_by_endpoint")]
        assert per and max(len(x) for x in per) == 2
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        page.locator('#run-charts [data-chart="server"]').wait_for()
        for ep in per[-1]:
            assert f"KV % @{ep}" in page.locator('#run-charts [data-chart="server"]').inner_html()
            assert f"waiting @{ep}" in page.locator('#run-charts [data-chart="inflight"]').inner_html()
        assert page.locator("#run-server tr[data-endpoint]").count() == 2
    finally:
        from synthwatch.store import queue as store

        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
