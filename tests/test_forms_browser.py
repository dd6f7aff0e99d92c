"""Forms in a real browser (#19): every error beside its field at once, values kept; the tokenizer field.

Real chromium, a real dashboard on a real port, real SQLite, a real worker against the simulator. The
conftest's problem checks fail a test on any JS error, failed request or HTTP >= 400 (the expected 400s of
a refused form are taken out by name)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import write_prompts
from workerkit import make_config, run_row, run_to_end, wait_for

pytestmark = pytest.mark.browser


def _take_expected_400(page: Any, problems: list[str], url: str) -> None:
    page.wait_for_timeout(200)  # the console line of the 400 arrives after the response
    expected = [f"HTTP 400: POST {url}",
                "console.error: Failed to load resource: the server responded with a status of 400 (Bad Request)"]
    assert expected[0] in problems, problems
    for p in expected:
        while p in problems:
            problems.remove(p)


def _submit_refused(page: Any, problems: list[str], button: str, url: str, needles: dict[str, str]) -> None:
    """Submit; the answer is 400 with exactly these fields' problems, each beside its field."""
    with page.expect_response(lambda r: r.url == url and r.request.method == "POST") as resp:
        page.locator(f'[data-testid="{button}"]').click()
    assert resp.value.status == 400
    _take_expected_400(page, problems, url)
    assert page.locator(".field-error").count() == len(needles)
    for name, needle in needles.items():
        assert needle in _beside(page, name), name


def _beside(page: Any, name: str) -> str:
    """The message shown right under the field: the field is invalid and described by it."""
    field = page.locator(f'[name="{name}"]')
    assert field.get_attribute("aria-invalid") == "true", name
    error = page.locator(f"#{field.get_attribute('aria-describedby')}")
    assert error.is_visible(), name
    fb, eb = field.bounding_box(), error.bounding_box()
    below = 0 <= eb["y"] - (fb["y"] + fb["height"]) < 40  # on the next line ...
    overlaps = eb["x"] <= fb["x"] + fb["width"] and eb["x"] + eb["width"] >= fb["x"]  # ... under the field
    assert below and overlaps, (name, fb, eb)
    return error.inner_text()  # type: ignore[no-any-return]


def test_start_form_shows_three_errors_at_once_then_starts_with_a_tokenizer(
        page: Any, browser_problems: Any, live_app: Any, engine: Any, sim: Any, tmp_path: Path) -> None:
    data, toks = tmp_path / "data", tmp_path / "tokenizers"
    data.mkdir()
    toks.mkdir()
    write_prompts(data / "p.jsonl", 4)
    srv = live_app(launch_dataset_dirs=str(data), launch_tokenizer_dirs=str(toks))
    url = sim(seed=4, token_ids="deepseek")
    page.set_viewport_size({"width": 1024, "height": 900})
    page.goto(f"{srv.url}/runs/new")
    page.fill('[name="name"]', "form-tokens")
    page.fill('[name="dataset"]', str(tmp_path / "elsewhere.jsonl"))  # outside the allowed folder
    page.fill('[name="endpoints"]', url)
    page.fill('[name="model"]', "sim-reasoner")
    page.fill('[name="concurrency"]', "0")  # RunConfig: at least 1
    page.fill('[name="temperature"]', "9")  # RunConfig: at most 5
    page.fill('[name="tokenizer"]', "deepseek-v4")
    _submit_refused(page, browser_problems, "start-run", f"{srv.url}/runs/new", {
        "dataset": "outside the folders the dashboard may read datasets from",
        "concurrency": "must be between 1 and 100,000", "temperature": "must be between 0 and 5"})
    assert "3 problems" in page.locator('[data-testid="form-error"]').inner_text()
    for name in ("name", "endpoints", "model", "tokenizer"):
        assert page.locator(f'[name="{name}"]').get_attribute("aria-invalid") is None, name
    # what was typed is still there
    assert page.input_value('[name="name"]') == "form-tokens"
    assert page.input_value('[name="concurrency"]') == "0" and page.input_value('[name="temperature"]') == "9"
    assert page.input_value('[name="tokenizer"]') == "deepseek-v4"
    assert page.input_value('[name="endpoints"]') == url
    # the summary links to a field
    page.locator('[data-testid="form-error"] a[href="#f-temperature"]').click()
    assert page.evaluate("location.hash") == "#f-temperature"

    page.fill('[name="dataset"]', str(data / "p.jsonl"))
    page.fill('[name="concurrency"]', "2")
    page.fill('[name="temperature"]', "0.7")
    page.locator('[data-testid="start-run"]').click()
    page.wait_for_url(re.compile(r".*/runs/\d+$"), timeout=30_000)
    run_id = int(page.url.rsplit("/", 1)[1])
    wait_for(lambda: run_row(engine, run_id)["status"] == "completed", timeout_s=60, what="the form's run")
    with engine.connect() as conn:
        from sqlalchemy import text

        rec_id = conn.execute(text("SELECT id FROM record WHERE run_id = :r AND status = 'ok' ORDER BY id LIMIT 1"),
                              {"r": run_id}).scalar_one()
    # the Tokens tab works: the run's tokenizer renders the record's chips, the trained span marked
    page.goto(f"{srv.url}/runs/{run_id}/records/{rec_id}")
    page.click("button.tab[data-tab=tokens]")
    chips = page.locator("#tokens-pane #chips span.chip")
    chips.first.wait_for()
    assert chips.count() > 10
    assert page.locator("#tokens-pane #chips span.chip.asst").count() > 0
    assert "no tokenizer configured" not in page.locator("#tokens-pane").inner_text()


def test_settings_form_shows_three_errors_at_once_then_saves_a_new_version(
        page: Any, browser_problems: Any, live_app: Any, engine: Any, sim: Any, prompts: Any) -> None:
    run_id, final = run_to_end(engine, make_config(sim(seed=6), prompts(3), name="settings-form"))
    assert final == "completed"
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/repair")
    page.fill('[name="set.sampling.temperature"]', "hot")
    page.fill('[name="set.sampling.max_tokens"]', "0")
    page.fill('[name="set.tokenizer.name_or_path"]', "/etc")
    page.fill('[name="reason"]', "try the token view")
    _submit_refused(page, browser_problems, "save-settings", f"{srv.url}/runs/{run_id}/settings", {
        "set.sampling.temperature": "not a number", "set.sampling.max_tokens": "must be between 1 and 10,000,000",
        "set.tokenizer.name_or_path": "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS"})
    assert page.input_value('[name="set.sampling.temperature"]') == "hot"
    assert page.input_value('[name="reason"]') == "try the token view"
    assert run_row(engine, run_id)["config_version"] == 1

    page.fill('[name="set.sampling.temperature"]', "0.5")
    page.fill('[name="set.sampling.max_tokens"]', "64")
    page.fill('[name="set.tokenizer.name_or_path"]', "deepseek-v4")
    page.locator('[data-testid="save-settings"]').click()
    page.locator('[data-testid="repair-message"]').wait_for()
    assert page.locator('[data-testid="current-version"]').inner_text() == "2"
    row = page.locator('tr[data-version="2"]').inner_text()
    assert "tokenizer" in row and "sampling.temperature" in row and "try the token view" in row
    assert page.locator('tr[data-version="1"]').count() == 1  # the first version is kept
