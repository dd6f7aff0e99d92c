"""`GET /metrics`: Prometheus text from a real dashboard over real HTTP, parsed back by the client's own parser."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import httpx
from conftest import HTTP_TIMEOUT_S, ROOT
from prometheus_client.parser import text_string_to_metric_families
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row

from synthwatch.app.metrics import FAMILIES


def _scrape(srv: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    r = httpx.get(f"{srv.url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def _value(m: dict[str, Any], name: str, **labels: str) -> float:
    for key, v in m[name].items():
        if all((k, labels[k]) in key for k in labels):
            return v
    raise AssertionError(f"no {name} with {labels}: {list(m[name])[:5]}")


def test_metrics_parse_back_and_every_documented_family_is_present(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=51, reasoning_tokens="8-24", content_tokens="4-12", rate_429=0.2,
              retry_after_s=0)
    config = make_config(url, prompts(40), concurrency=4, reasoning={"mode": "reasoning_content"}, name="prom",
                         checks={"rules": {"field_mismatch": {"auto_pause": False}}},
                         retries={"max_attempts": 20, "backoff_base_s": 0.01, "backoff_max_s": 0.05})
    assert CheckedBackground(engine, config).start().join(60) == "completed"
    run = run_row(engine, 1)
    srv = live_app()
    m = _scrape(srv)
    # every documented family is exposed (counters as NAME_total samples), and nothing undocumented
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for name in FAMILIES:
        assert f"`{name}`" in doc, f"{name} is not documented in docs/metrics.md"
        assert name in m, f"{name} missing from /metrics"
    ours = {n for n in m if n.startswith("synthwatch_")}
    assert ours <= set(FAMILIES) | {n.removesuffix("_created") for n in ours}, ours
    assert _value(m, "synthwatch_run_info", run="prom", status="completed", kind="generate") == 1
    assert _value(m, "synthwatch_run_records", run="prom", state="ok") == run["n_ok"] == 40
    assert _value(m, "synthwatch_requests_finished_total", run="prom", outcome="ok") == 40
    assert _value(m, "synthwatch_attempt_failures_total", run="prom", kind="http_429") >= 1
    assert _value(m, "synthwatch_tokens_total", run="prom", kind="completion") > 0
    assert _value(m, "synthwatch_check_failing_records", run="prom", check="field_mismatch") == 40
    assert _value(m, "synthwatch_alarms_active", run="prom", severity="error") >= 1
    # the example Grafana dashboard queries only metrics that exist
    dash = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"synthwatch_[a-z_]+", e)}
    assert used and used <= set(FAMILIES), used - set(FAMILIES)


def test_a_worker_serves_its_own_metrics(db_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    import signal
    import time

    from conftest import popen_cli

    from synthwatch.workers.worker_metrics import WORKER_FAMILIES

    url = sim(seed=52, tokens_per_s=50, reasoning_tokens="20-30", content_tokens="10-20")
    p = popen_cli("run", "--db", str(db_path), "--dataset", str(prompts(400)), "--base-url", url, "--model",
                  "sim-reasoner", "--name", "wm", "--concurrency", "4", "--metrics-port", "0", "--quiet")
    try:
        assert p.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = p.stderr.readline()
            m = re.search(r"worker metrics: http://127\.0\.0\.1:(\d+)/metrics", line)
            port = int(m.group(1)) if m else None
        assert port, "the worker printed no metrics address"
        samples: dict[str, float] = {}
        while time.monotonic() < deadline:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=HTTP_TIMEOUT_S).text
            samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name.startswith("synthwatch_worker_") and s.labels.get("outcome", "ok") == "ok"}
            if samples.get("synthwatch_worker_records_total", 0) >= 3:
                break
            time.sleep(0.3)
        for name in WORKER_FAMILIES:
            assert name in samples, (name, sorted(samples))
            assert f"`{name}`" in (ROOT / "docs" / "metrics.md").read_text()
        assert samples["synthwatch_worker_concurrency"] == 4
        assert samples["synthwatch_worker_records_total"] >= 3
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
