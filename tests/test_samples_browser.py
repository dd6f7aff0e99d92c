"""k samples per prompt, pass@k, export selection and the judge in a real browser (#30): the run page's Prompts tile
with pass@1 / pass@4 from the live math verifier, the export page's per-prompt choice started by a click, the
record viewer's judge verdict beside the person's, and the checks page's agreement after a person flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from workerkit import Background, make_config, records

from synthwatch.quality.live import writer_hooks
from synthwatch.workers.judge import start_in_thread

pytestmark = pytest.mark.browser


def _refs(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            a, b = 3 + i % 97, 5 + (i * 7) % 89
            fh.write(json.dumps({"id": f"q{i}", "prompt": f"What is {a} + {b}?", "reference": str(a + b)}) + "\n")
    return path


def test_samples_pass_at_k_export_select_and_judge(page: Page, engine: Any, sim: Any, tmp_path: Path,
                                                   live_app: Any) -> None:
    from synthwatch.config import JudgeConfig

    url = sim(seed=13, rate_wrong_answer=0.4, boxed_answers=True, reasoning_tokens="8-20", content_tokens="8-12")
    judge_url = sim(judge=True, model="sim-judge")
    config = make_config(url, _refs(tmp_path / "r.jsonl", 8), samples_per_prompt=4, name="k4b",
                         checks={"verifiers": [{"kind": "math"}]})
    bg = Background(engine, config, hooks=lambda run_id: writer_hooks(engine, run_id, config)).start()
    assert bg.join(120) == "completed"
    run_id = bg.run_id
    # the judge grades every record (in its own thread and loop, as `synthwatch run` starts it)
    cfg = JudgeConfig.model_validate({"endpoint": {"base_url": judge_url}, "model": "sim-judge"})
    judge = start_in_thread(engine, run_id, cfg, "k4b")
    judge.finish(120)
    assert judge.error is None and judge.runner.judged == 32
    recs = records(engine, run_id)
    with engine.connect() as conn:
        judged_bad = [r for (r,) in conn.execute(text(
            "SELECT record_id FROM check_verdict WHERE run_id = :r AND check_name = 'judge' AND state = 'fail'"
            " ORDER BY record_id"), {"r": run_id})]
    assert judged_bad
    srv = live_app()

    page.goto(f"{srv.url}/runs/{run_id}")
    tile = page.locator('[data-tile="samples"]')
    expect(tile).to_contain_text("Prompts (4 samples each)")
    expect(page.get_by_test_id("prompts-complete")).to_have_text("8")
    expect(page.get_by_test_id("pass-at-1")).to_contain_text("pass@1 ")
    expect(page.get_by_test_id("pass-at-k")).to_contain_text("pass@4 ")

    page.goto(f"{srv.url}/runs/{run_id}/export")
    page.get_by_test_id("export-select").select_option("first-passing")
    allow = page.locator('input[name="allow_open_alarms"]')
    if allow.count():  # the judge's alarm is another check's: it still needs the yes
        allow.check()
    page.locator("button.export-start").click()
    expect(page.locator(".export-done")).to_contain_text("Done: ", timeout=60_000)
    with engine.connect() as conn:
        manifest = json.loads(conn.execute(text("SELECT manifest_json FROM export_job WHERE run_id = :r"),
                                           {"r": run_id}).scalar())
    sel = manifest["selection"]["per_prompt"]
    assert sel["mode"] == "first-passing" and sel["check"] == "verify_math"
    assert manifest["counts"]["exported"] == sel["prompts_selected"] == len(
        {r["prompt_idx"] for r in recs if r["id"] in {v for v in _passing(engine, run_id)}})

    # the viewer: the judge's flag beside the person's verdict; a person agrees with the judge
    page.goto(f"{srv.url}/runs/{run_id}/records/{judged_bad[0]}")
    expect(page.get_by_test_id("judge-verdict")).to_contain_text("judge: bad — ")
    expect(page.locator("#verdict")).to_have_text("not reviewed")
    page.locator("#advance-toggle").uncheck()  # stay on this record after the verdict
    page.locator("#flag-bad").click()
    expect(page.locator("#verdict")).to_contain_text("bad")
    expect(page.get_by_test_id("judge-verdict")).to_contain_text("judge: bad")  # still there after the swap
    page.goto(f"{srv.url}/runs/{run_id}/checks")
    expect(page.get_by_test_id("judge-agreement")).to_contain_text("agree on 1 of 1")
    expect(page.get_by_test_id("judge-cost")).to_contain_text("32 requests")


def _passing(engine: Any, run_id: int) -> set[int]:
    with engine.connect() as conn:
        return {r for (r,) in conn.execute(text(
            "SELECT record_id FROM check_verdict v WHERE run_id = :r AND check_name = 'verify_math' AND state = 'pass'"
            " AND id = (SELECT MAX(id) FROM check_verdict w WHERE w.record_id = v.record_id"
            " AND w.check_name = v.check_name)"), {"r": run_id})}
