"""Cost counts every billed token (#29 item 4): ok records and failed, timed-out and retried attempts, from the
server's usage where it reported it, else counted (ids exactly, stream chunks and request bytes as an estimate,
said so); prices from TOML, the same-named flags and the start form; cost per endpoint and per config version.
Real runs against simulators that drop and stall streams and answer 500."""

from __future__ import annotations

import httpx
import orjson
import pytest
from conftest import run_cli
from workerkit import make_config, records, run_to_end

from synthwatch.store.db import open_engine

FAULTS = {"rate_drop": 0.25, "rate_stall": 0.2, "stall_s": 3.0, "rate_500": 0.15, "tokens_per_s": 400}


def _expected(r: dict) -> tuple[int, int]:  # type: ignore[type-arg]
    """What one single-attempt record is billed, from what it stored: usage when the reply finished, else the
    ids it received (the simulator sends the prompt's ids first); a 500 generated nothing."""
    usage = orjson.loads(r["usage_json"]) if r["usage_json"] else None
    if usage:
        return usage["prompt_tokens"], usage["completion_tokens"]
    if not r["token_ids_json"]:
        return 0, 0
    ids = orjson.loads(r["token_ids_json"])
    return len(ids["prompt"] or ()), len(ids["completion"] or ())


def _series(engine, run_id: int) -> dict[str, tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    with engine.connect() as conn:
        return {ep: (int(p), int(c), int(e)) for ep, p, c, e in conn.execute(text(
            "SELECT endpoint, SUM(billed_prompt_tokens), SUM(billed_completion_tokens), SUM(billed_estimated)"
            " FROM series WHERE run_id = :r AND endpoint != '' GROUP BY endpoint"), {"r": run_id})}


@pytest.mark.browser
def test_failed_and_timed_out_attempts_are_billed(engine, sim, prompts, live_app, page) -> None:  # type: ignore[no-untyped-def]
    a = sim(seed=41, reasoning_tokens="30-60", content_tokens="10-20", **FAULTS)
    b = sim(seed=42, reasoning_tokens="30-60", content_tokens="10-20", **FAULTS)
    cfg = make_config([a, b], prompts(60), name="billed", concurrency=6, request_token_ids=True,
                      timeouts={"connect_s": 5, "total_s": 30, "idle_s": 0.5}, retries={"max_attempts": 1})
    cfg = cfg.model_copy(update={"endpoints": [
        cfg.endpoints[0].model_copy(update={"name": "a", "price_in_per_mtok": 2.0, "price_out_per_mtok": 8.0}),
        cfg.endpoints[1].model_copy(update={"name": "b", "price_in_per_mtok": 1.0, "price_out_per_mtok": 3.0})]})
    run_id, final = run_to_end(engine, cfg, timeout_s=120)
    assert final == "completed"
    rows = records(engine, run_id)
    statuses = {r["status"] for r in rows}
    assert {"ok", "error", "timeout"} <= statuses, statuses  # the faults happened
    failed_billed = 0
    for r in rows:  # each record: one attempt, billed what it received
        want = _expected(r)
        assert (r["billed_prompt_tokens"], r["billed_completion_tokens"]) == want, r["error_kind"]
        assert r["billed_estimated"] == 0  # ids or usage everywhere: nothing estimated
        if r["status"] != "ok":
            failed_billed += sum(want)
    assert failed_billed > 0  # dropped and stalled streams generated tokens before they failed
    series = _series(engine, run_id)
    prices = {"a": (2.0, 8.0), "b": (1.0, 3.0)}
    t = httpx.get(f"{live_app().url}/api/runs/{run_id}/tokens").json()
    by = {e["endpoint"]: e for e in t["endpoints"]}
    want_cost = 0.0
    for label in ("a", "b"):
        mine = [r for r in rows if r["endpoint"] == label]
        bp = sum(r["billed_prompt_tokens"] for r in mine)
        bc = sum(r["billed_completion_tokens"] for r in mine)
        assert series[label] == (bp, bc, 0)  # the series (failures as they happen) and the records agree
        assert (by[label]["billed_prompt"], by[label]["billed_completion"]) == (bp, bc)
        ok = [r for r in mine if r["status"] == "ok"]
        assert by[label]["prompt"] == sum(r["prompt_tokens"] for r in ok) < bp  # ok-only counts stay as they were
        cost = bp * prices[label][0] / 1e6 + bc * prices[label][1] / 1e6
        assert by[label]["cost"] == pytest.approx(cost, rel=1e-12)
        want_cost += cost
    assert t["total"]["cost"] == pytest.approx(want_cost, rel=1e-12)
    [v1] = t["by_config_version"]
    assert (v1["billed_prompt"], v1["billed_completion"]) == (t["total"]["billed_prompt"], t["total"]["billed_completion"])
    assert v1["cost"] == pytest.approx(want_cost, rel=1e-12)
    page.goto(f"{live_app().url}/runs/{run_id}")
    assert page.get_by_test_id("cost-so-far").inner_text() == f"{want_cost:,.2f}"
    row_a = page.locator('#run-cost tr[data-endpoint="a"]')
    assert row_a.get_by_test_id("billed").inner_text() == f"{by['a']['billed_prompt']:,} · {by['a']['billed_completion']:,}"
    assert page.get_by_test_id("cost-versions").locator('tr[data-version="1"]').inner_text().endswith(f"{want_cost:,.2f}")


def test_retried_attempts_and_estimates_without_ids(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    # retries: a record's columns add up all of its attempts; the series counted each failure as it happened.
    # No ids and no usage on a failed stream: its chunks and the request's bytes / 4 are counted, as an estimate
    url = sim(seed=43, reasoning_tokens="30-60", content_tokens="10-20", **FAULTS)
    cfg = make_config(url, prompts(50), name="retried", concurrency=6,
                      timeouts={"connect_s": 5, "total_s": 30, "idle_s": 0.5},
                      retries={"max_attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.05})
    run_id, final = run_to_end(engine, cfg, timeout_s=120)
    assert final == "completed"
    rows = records(engine, run_id)
    retried = [r for r in rows if r["status"] == "ok" and r["attempts"] > 1]
    assert retried, "no record was retried"
    for r in rows:
        if r["status"] == "ok":
            assert r["billed_prompt_tokens"] >= r["prompt_tokens"] and r["billed_completion_tokens"] >= r["completion_tokens"]
    assert any(r["billed_completion_tokens"] > r["completion_tokens"] for r in retried)
    [(bp, bc, est)] = _series(engine, run_id).values()
    assert (bp, bc, est) == (sum(r["billed_prompt_tokens"] for r in rows), sum(r["billed_completion_tokens"] for r in rows),
                             sum(r["billed_estimated"] for r in rows))
    assert est > 0
    t = httpx.get(f"{live_app().url}/api/runs/{run_id}/tokens").json()
    assert t["total"]["billed_estimated"] == est and t["by_config_version"][0]["billed_estimated"] == est


def test_price_flags_share_the_toml_keys_names(tmp_path, sim, prompts) -> None:  # type: ignore[no-untyped-def]
    url, url2 = sim(seed=44), sim(seed=45)
    db = tmp_path / "p.db"
    common = ["run", "--dataset", str(prompts(4)), "--base-url", url, "--base-url", url2, "--model",
              "sim-reasoner", "--db", str(db), "--quiet"]
    bad = run_cli(*common, "--name", "bad", "--price-in-per-mtok", "-1")
    assert bad.returncode == 2
    assert "--price-in-per-mtok" in bad.stderr and "price_in_per_mtok" in bad.stderr, bad.stderr
    toml = tmp_path / "p.toml"
    toml.write_text(f"[[endpoints]]\nbase_url = '{url}'\nprice_in_per_mtok = 9.0\nprice_out_per_mtok = 9.0\n")
    run_cli(*common, "--name", "priced", "--price-in-per-mtok", "0.5", "--price-out-per-mtok", "2",
            check=True)
    run_cli("run", "--config", str(toml), "--dataset", str(prompts(4)), "--model", "sim-reasoner", "--db", str(db),
            "--name", "toml-priced", "--quiet", "--price-out-per-mtok", "4", check=True)
    engine = open_engine(str(db))
    from workerkit import run_row

    eps = orjson.loads(run_row(engine, "priced")["config_json"])["endpoints"]
    assert [(e["price_in_per_mtok"], e["price_out_per_mtok"]) for e in eps] == [(0.5, 2.0), (0.5, 2.0)]
    [ep] = orjson.loads(run_row(engine, "toml-priced")["config_json"])["endpoints"]
    assert (ep["price_in_per_mtok"], ep["price_out_per_mtok"]) == (9.0, 4.0)  # the flag over the TOML key
