"""The token view's logprobs hover (#38 item 5), in a real browser: a record the real worker wrote from the simulator
with ``logprobs`` and ``top_logprobs`` shows, hovering a completion token, the chosen token's p and logprob and its
top alternatives; every completion token has its own, and alternatives the server named by hostile text are shown as
text, never as markup."""

from __future__ import annotations

import math
import re
from typing import Any

import orjson
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text

from synthwatch.capture.logprobs import pack, unpack
from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser]

HOSTILE = '"><img src=x onerror="window.__pwned=1">'


def _run(engine: Any, sim: Any, prompts: Any) -> tuple[int, int]:
    from workerkit import make_config, records, run_to_end

    url = sim(seed=11, token_ids="deepseek", reasoning_field="reasoning", reasoning_tokens="8-12",
              content_tokens="4-8")
    cfg = make_config(url, prompts(1), name="lp-view", concurrency=1, request_token_ids=True,
                      sampling={"logprobs": True, "top_logprobs": 3}, tokenizer={"name_or_path": "deepseek-v4"})
    run_id, final = run_to_end(engine, cfg, timeout_s=120)
    assert final == "completed"
    (rec,) = records(engine, run_id)
    return run_id, rec["id"]


def _hover_text(page: Page, chip: Any) -> str:
    chip.scroll_into_view_if_needed()
    chip.hover()
    return str(chip.evaluate("e => getComputedStyle(e, '::after').content"))


def test_hovering_a_token_shows_its_p_and_top_alternatives(page: Page, live_app: Any, engine: Any, sim: Any,
                                                           prompts: Any, browser_problems: Any) -> None:
    run_id, rid = _run(engine, sim, prompts)
    with engine.connect() as conn:
        col, ids_json = conn.execute(text("SELECT logprobs_json, token_ids_json FROM record WHERE id = :i"),
                                     {"i": rid}).one()
    packed = unpack(col)
    completion = orjson.loads(ids_json)["completion"]
    assert packed is not None and packed.ids == completion and packed.k == 3
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/records/{rid}/tokens")
    expect(page.locator("#chips")).to_be_visible(timeout=60_000)
    with_lp = page.locator("#chips .chip.has-lp")
    # The view re-renders the record with the run's template: a hover goes on each re-rendered token that is the
    # server's token there (the ids aligned as in the export); the template's own tokens (its <think>) get none.
    n = with_lp.count()
    assert len(completion) * 0.6 <= n <= len(completion), (n, len(completion))
    before = str(with_lp.first.evaluate("e => getComputedStyle(e, '::after').content"))
    assert before in ("none", "normal", "")  # nothing until hovered
    for k in range(n):
        chip = with_lp.nth(k)
        tid = int(re.match(r"id (\d+)", chip.get_attribute("title") or "").group(1))  # type: ignore[union-attr]
        shown = _hover_text(page, chip)
        m = re.search(r"p (\d\.\d{3}) \(logprob (-?\d+\.\d{3})\) · top: (.*)", shown)
        assert m, shown
        # the numbers of a server position holding this very token, its sampled token first among the alternatives
        at = [j for j, t in enumerate(completion) if t == tid]
        assert at, (tid, completion)
        assert any(math.isclose(float(m.group(2)), packed.lp[j], abs_tol=1e-3) for j in at), (shown, at)
        j = next(j for j in at if math.isclose(float(m.group(2)), packed.lp[j], abs_tol=1e-3))
        assert math.isclose(float(m.group(1)), math.exp(packed.lp[j]), abs_tol=1e-3)
        assert m.group(3).count(", ") == len(packed.top_ids[j]) - 1

    # alternatives named by hostile text: shown as text
    content = [{"token": f"token_id:{t}", "logprob": -0.25,
                "top_logprobs": [{"token": f"token_id:{t}", "logprob": -0.25}, {"token": HOSTILE, "logprob": -2.0}]}
               for t in completion]
    hostile, problems = pack({"content": content}, completion, 1 << 20)
    assert hostile is not None and problems == []
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE record SET logprobs_json = :c WHERE id = :i"), {"c": hostile, "i": rid})
    page.goto(f"{srv.url}/runs/{run_id}/records/{rid}/tokens")
    expect(page.locator("#chips")).to_be_visible(timeout=60_000)
    shown = _hover_text(page, page.locator("#chips .chip.has-lp").first)
    assert "p 0.779" in shown and "<img" in shown  # exp(-0.25): the text as text
    assert page.locator("#chips img").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    assert not browser_problems, browser_problems
