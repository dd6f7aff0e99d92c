"""Tokens and cost: per endpoint from the time series, per config version from the records, with prices a
cost so far and a projection; over real HTTP from a run made by a real worker against two simulators."""

from __future__ import annotations

import httpx
import pytest
from workerkit import make_config, records, run_to_end


@pytest.mark.browser
def test_tokens_and_cost_per_endpoint_version_and_projection(engine, sim, prompts, live_app, page) -> None:  # type: ignore[no-untyped-def]
    a = sim(seed=91, reasoning_tokens="20-40", content_tokens="10-20")
    b = sim(seed=92, reasoning_tokens="20-40", content_tokens="10-20")
    config = make_config([a, b], prompts(60), name="cost", cap=30, concurrency=4)
    cfg = config.model_copy(update={"endpoints": [
        config.endpoints[0].model_copy(update={"name": "a", "price_in_per_mtok": 1.0, "price_out_per_mtok": 4.0}),
        config.endpoints[1].model_copy(update={"name": "b"})]})
    run_id, final = run_to_end(engine, cfg)
    assert final == "completed"
    ok = records(engine, run_id, "status = 'ok'")
    srv = live_app()
    t = httpx.get(f"{srv.url}/api/runs/{run_id}/tokens").json()
    by = {e["endpoint"]: e for e in t["endpoints"]}
    for label in ("a", "b"):
        mine = [r for r in ok if r["endpoint"] == label]
        assert by[label]["prompt"] == sum(r["prompt_tokens"] for r in mine)
        assert by[label]["completion"] == sum(r["completion_tokens"] for r in mine)
    assert by["b"]["cost"] is None  # no price given for b
    want = by["a"]["prompt"] * 1.0 / 1e6 + by["a"]["completion"] * 4.0 / 1e6
    assert t["priced"] and abs(t["total"]["cost"] - want) < 1e-12
    assert t["target"] == 30 and abs(t["projected_cost"] - want / 30 * 30) < 1e-12  # the cap is reached
    [v1] = t["by_config_version"]
    assert {k: v1[k] for k in ("config_version", "records", "prompt", "completion", "reasoning")} == {
        "config_version": 1, "records": 30, "prompt": sum(r["prompt_tokens"] for r in ok),
        "completion": sum(r["completion_tokens"] for r in ok), "reasoning": sum(r["reasoning_tokens"] for r in ok)}
    # no faults: every billed token is an ok record's; the version's cost is endpoint a's (b has no price)
    assert (v1["billed_prompt"], v1["billed_completion"]) == (v1["prompt"], v1["completion"])
    assert v1["cost"] == pytest.approx(want, rel=1e-12)
    page.goto(f"{srv.url}/runs/{run_id}")
    assert page.locator('[data-testid="cost-so-far"]').inner_text() == f"{want:,.2f}"
    assert "Projected at 30 ok records" in page.locator('[data-testid="cost-projection"]').inner_text()
