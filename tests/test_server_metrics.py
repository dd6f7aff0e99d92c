"""The server's own view: the simulator's vLLM- and SGLang-shaped /metrics scraped by a real worker, stored,
served by the API, and shown on the run page in a real browser; parsing against the facts of real servers."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest
from conftest import HTTP_TIMEOUT_S
from sqlalchemy import text
from workerkit import Background, make_config, wait_for
from workerkit import records as records_of

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
    assert row["gen_tokens_s"] == 200.0 and row["preemptions_s"] == 2.0 and row["preemptions"] == 4.0
    # the 4 new ones all queued < 0.5 s: the first bucket has no lower bound, so the buckets say only "< 0.5 s"
    assert row["queue_p50_s"] is None
    assert orjson.loads(row["quantiles"])["queue"]["p50"] == {"below": 0.5}
    sg = parse("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 7\n"
               "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 1\n"
               "# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n"
               "# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput{model_name=\"m\"} 321\n", 1.0)
    assert sg.kind == "sglang" and sg.gauges == {"running": 7, "waiting": 1, "kv_usage": 0.5, "gen_throughput": 321}
    assert interval_row(None, sg)["gen_tokens_s"] == 321
    assert parse("# TYPE x gauge\nx 1\n", 1.0).kind == "unknown"
    assert quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


# vLLM 0.32's queue-time buckets start at 0.3 s; a server that never queues puts every request in the first one
def _queue_page(count: float, total_s: float, first: float, second: float, preempt: float = 0.0,
                aborted: float = 0.0) -> str:
    return f"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 4.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preempt}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {count}
vllm:request_success_total{{engine="0",finished_reason="abort",model_name="m"}} {aborted}
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{{engine="0",le="0.3",model_name="m"}} {first}
vllm:request_queue_time_seconds_bucket{{engine="0",le="0.5",model_name="m"}} {second}
vllm:request_queue_time_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {count}
vllm:request_queue_time_seconds_count{{engine="0",model_name="m"}} {count}
vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {total_s}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",engine="0",kv_cache_max_concurrency="1024.00",num_gpu_blocks="9"}} 1.0
"""


def test_server_histograms_are_read_honestly() -> None:
    """The issue's numbers: the card showed queue p50/p95 150/285 ms (interpolated inside the first bucket, from 0)
    while _sum/_count gave a mean of 0.07 ms. Means come from the deltas; quantiles only where buckets resolve."""
    from synthwatch.app.routes_server import describe

    a = parse(_queue_page(100, 0.007, 100, 100), 10.0)
    b = parse(_queue_page(300, 0.021, 300, 300, preempt=3, aborted=2), 10.5)  # 200 more, 0.014 s of queueing
    first = interval_row(None, a)
    # the first scrape covers the server's whole lifetime, not an interval: gauges only
    assert first["running"] == 4.0 and first["max_concurrency"] == 1024.0
    assert "gen_tokens_s" not in first and "quantiles" not in first and "preemptions" not in first
    row = interval_row(a, b)
    assert row["interval_s"] == 0.5
    assert row["queue_mean_s"] == pytest.approx(0.014 / 200)
    words = describe(orjson.loads(row["quantiles"])["queue"])
    assert words == {"mean": "70 µs", "p50": "< 300 ms", "p95": "< 300 ms"}
    # counted over the interval scraped (0.5 s here), never a rate times an assumed 2 s
    assert row["preemptions"] == 3.0 and row["aborted"] == 2.0 and row["errored"] == 0.0
    # a quantile inside a bounded bucket is interpolated, past the last bound only "> bound"
    assert quantile([(0.3, 0.0), (0.5, 10.0), (float("inf"), 10.0)], 0.5) == {"value": pytest.approx(0.4)}
    assert quantile([(0.3, 0.0), (0.5, 0.0), (float("inf"), 10.0)], 0.5) == {"above": 0.5}
    # a server that restarted between scrapes: its counters start over, what it counted since is the interval
    c = parse(_queue_page(50, 0.5, 40, 50), 11.0)
    assert interval_row(b, c)["queue_mean_s"] == pytest.approx(0.01)


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
        srv = live_app()

        def per_endpoint() -> list[dict[str, Any]]:
            ts = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/timeseries", params={"window": "5m"},
                           timeout=HTTP_TIMEOUT_S).json()
            return [p["server_by_endpoint"] for p in ts["points"] if p.get("server_by_endpoint")]

        # a chart point holds both endpoints once a bucket has rows of both (the scrapes are not in step)
        per = wait_for(lambda: (lambda x: x if x and max(len(y) for y in x) == 2 else None)(per_endpoint()),
                       timeout_s=30, what="a timeseries point with both endpoints")
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


@pytest.mark.slow
def test_young_run_card_tiles_and_workers_agree(live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """A run younger than the 60 s window: the Server card's client tok/s, the tiles and the workers table all divide
    by the time the window covers (the card used to divide 28 s of tokens by 60: "server 545 vs client 102")."""
    url = sim(server_kind="vllm", tokens_per_s=200, ttft_ms=20, seed=7, reasoning_tokens="40-60",
              content_tokens="20-30")
    config = make_config(url, prompts(400), concurrency=8, name="young", server_metrics={"interval_s": 0.5})
    bg = Background(engine, config).start()
    try:
        wait_for(lambda: len(_rows(engine, bg.run_id)) >= 6, timeout_s=60, what="six scrapes")
        srv = live_app()

        def both() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
            card = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/server", timeout=30).json()
            stats = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/stats", timeout=30).json()
            workers = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/workers", timeout=30).json()
            return card, stats, workers

        card, stats, workers = both()
        assert card["live"] and card["client_window_s"] < 60  # the run is younger than the window
        [ep] = card["endpoints"]
        tile_tok_s, tile_req_s = stats["recent"]["tok_s"], stats["recent"]["req_s"]
        assert tile_tok_s > 0
        # read a moment apart, by different queries over the same series: the same number, not a factor of 60/age
        assert ep["client_tokens_s"] == pytest.approx(tile_tok_s, rel=0.35)
        [w] = workers["workers"]
        assert w["recent_rate_s"] == pytest.approx(tile_req_s, rel=0.35)
        [stat_ep] = stats["endpoints"]
        assert stat_ep["tok_s"] == pytest.approx(tile_tok_s, rel=0.05)
        # the server's interval rows: the first scrape has no interval quantities, the others do
        rows = _rows(engine, bg.run_id)
        assert rows[0]["interval_s"] is None and rows[0]["gen_tokens_s"] is None
        assert all(r["interval_s"] and r["interval_s"] > 0 for r in rows[1:])
        assert any(r["queue_mean_s"] is not None for r in rows[1:])
        assert "other_clients_est" in ep and ep["other_clients_est"] >= 0
    finally:
        from synthwatch.store import queue as store

        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


def _recent(engine: Any, run_id: int, now: float, window_s: int) -> tuple[int, int, float]:
    """(ok, completion tokens, seconds covered) of the series buckets in the window ending at ``now``: what the
    tiles must show, computed here from the rows (app.stats.covered_s's rule, written out)."""
    with engine.connect() as conn:
        ok, tokens, t_min = conn.execute(text(
            "SELECT SUM(ok), SUM(completion_tokens), MIN(t) FROM series WHERE run_id = :r AND t >= :since"),
            {"r": run_id, "since": int(now - window_s)}).one()
    return int(ok or 0), int(tokens or 0), max(5.0, min(float(window_s), now - float(t_min)))


def _sim_counter(url: str, name: str) -> float:
    """A counter of the simulator's own /metrics, read with prometheus_client's parser (not synthwatch's)."""
    from prometheus_client.parser import text_string_to_metric_families

    page = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(page) for s in f.samples if s.name == name)


@pytest.mark.slow
def test_old_run_card_tiles_workers_and_tokens(live_app, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """A run older than the window (set to 10 s: settings.rate_window_s, so the test need not run for minutes): the
    tiles, the per-endpoint rows, the workers table and the Server card's client tok/s divide the window's tokens by
    the part of the window the buckets cover, never by the run's age; the server's counters, summed over the
    scraped intervals, are the simulator's own; the tokens API agrees with the records and the simulator."""
    window = 10
    url = sim(server_kind="vllm", tokens_per_s=200, ttft_ms=20, seed=17, reasoning_tokens="40-60",
              content_tokens="20-30")
    before = _sim_counter(url, "vllm:generation_tokens_total")
    config = make_config(url, prompts(4000), concurrency=8, name="old", server_metrics={"interval_s": 0.5},
                         request_token_ids=True)
    bg = Background(engine, config).start()
    srv = live_app(rate_window_s=window)
    try:
        def first_t() -> float | None:
            with engine.connect() as conn:
                return conn.execute(text("SELECT MIN(t) FROM series WHERE run_id = :r"), {"r": bg.run_id}).scalar()

        # older than the window by more than a bucket (5 s): the window holds no bucket from the run's start
        wait_for(lambda: first_t() is not None and time.time() - first_t() > window + 6, timeout_s=90,
                 what="a run older than the window")
        card = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/server", timeout=30).json()
        stats = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/stats", timeout=30).json()
        workers = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/workers", timeout=30).json()
        ok, tokens, covered = _recent(engine, bg.run_id, stats["now"], window)
        age = stats["now"] - float(first_t() or 0)
        assert covered <= window < age  # the window's seconds, not the run's
        tile_tok_s, tile_req_s = stats["recent"]["tok_s"], stats["recent"]["req_s"]
        # the rows read right after the API: a worker flushes in between, so within a flush's worth
        assert tile_req_s == pytest.approx(ok / covered, rel=0.2)
        assert tile_tok_s == pytest.approx(tokens / covered, rel=0.2)
        [stat_ep] = stats["endpoints"]
        assert stat_ep["tok_s"] == pytest.approx(tile_tok_s, rel=0.05)
        [ep] = card["endpoints"]
        assert 5 <= card["client_window_s"] <= window
        assert ep["client_tokens_s"] == pytest.approx(tile_tok_s, rel=0.3)
        [w] = workers["workers"]
        assert workers["recent_s"] == window and w["recent_rate_s"] == pytest.approx(tile_req_s, rel=0.3)
        assert stats["window_s"] == window
        assert ep["latest"]["running"] <= 8 and ep["latest"]["gen_tokens_s"] > 0
        assert ep["latest"]["queue_mean_s"] is not None and ep["queue"]["mean"] is not None
    finally:
        from synthwatch.store import queue as store

        store.apply_control(engine, bg.run_id, "stop")  # in-flight requests finish: the counters close exactly
        bg.join(60)
    # the server's side: every interval counted once, none assumed; the first scrape (the server's lifetime) is
    # not an interval. The simulator's own counter says how many tokens it generated for this run
    rows = [r for r in _rows(engine, bg.run_id) if r["error"] is None]
    assert rows[0]["interval_s"] is None and all(r["interval_s"] for r in rows[1:])
    generated = _sim_counter(url, "vllm:generation_tokens_total") - before
    ok_rows = [r for r in records_of(engine, bg.run_id) if r["status"] == "ok"]
    assert generated == sum(r["completion_tokens"] for r in ok_rows)
    t = httpx.get(f"{srv.url}/api/runs/{bg.run_id}/tokens", timeout=30).json()
    assert t["total"]["completion"] == generated and t["total"]["prompt"] == sum(r["prompt_tokens"] for r in ok_rows)
    assert t["total"]["reasoning"] == sum(r["reasoning_tokens"] for r in ok_rows) == sum(
        v["reasoning"] for v in t["by_config_version"])
    assert {r["reasoning_tokens_source"] for r in ok_rows} == {"ids"} and t["total"]["reasoning_estimated"] == 0
    assert (t["total"]["billed_prompt"], t["total"]["billed_completion"]) == (t["total"]["prompt"], generated)


@pytest.mark.parametrize("stream", [True, False])
def test_simulator_metrics_count_every_request(stream, engine, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    """--tokens-per-s 0 sends replies at once: /metrics counted none of the streamed ones (request_success_total
    stayed at 1 after tens of thousands)."""
    from prometheus_client.parser import text_string_to_metric_families

    url = sim(server_kind="vllm", seed=3, reasoning_tokens="5-10", content_tokens="3-6")
    config = make_config(url, prompts(60), concurrency=4, name=f"count-{stream}", stream=stream)
    Background(engine, config).start().join(60)
    with engine.connect() as conn:
        ok = conn.execute(text("SELECT n_ok FROM run WHERE name = :n"), {"n": f"count-{stream}"}).scalar()
    assert ok == 60
    body = httpx.get(url.removesuffix("/v1") + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    done = sum(s.value for s in fams["vllm:request_success"].samples if s.name.endswith("_total"))
    assert done == 60
    gen = sum(s.value for s in fams["vllm:generation_tokens"].samples if s.name.endswith("_total"))
    with engine.connect() as conn:
        tokens = conn.execute(text("SELECT SUM(completion_tokens) FROM record")).scalar()
    assert gen == tokens
