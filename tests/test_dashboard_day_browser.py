"""A day in the dashboard (#37), in a real browser: token kinds keep their colours in the dark theme's stream, a long
record's jump links (kept in the URL), a bulk flag that flags exactly what it previewed, and no page wider than a
390 px screen."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text
from test_review import add_record
from test_token_view import KEEPING, make_run

from synthwatch.store import queue as store

pytestmark = [pytest.mark.browser]

KINDS = ("think", "role", "bos_eos")


def _long_record(engine: Any, tmp_path: Path, live_url: str, words: int = 3000) -> tuple[int, int, dict[str, Any]]:
    """A record of a few thousand tokens under the DeepSeek-V4 tokenizer, the server's ids differing at one token
    past </think>."""
    run_id = make_run(engine, tmp_path, KEEPING, name="long-tok")
    reasoning = " ".join(f"step{i % 97} holds." for i in range(words))
    rid = add_record(engine, run_id, 0, reasoning=reasoning, content="The answer is 4.")
    data = httpx.get(f"{live_url}/api/runs/{run_id}/records/{rid}/tokens", timeout=120).json()
    prompt_ids = data["input_ids"][: data["prompt_len"]]
    server = list(data["input_ids"][data["prompt_len"]:])
    server[-4] = 4242
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE record SET token_ids_json = :j WHERE id = :i"),
                     {"j": orjson.dumps({"prompt": prompt_ids, "completion": server}).decode(), "i": rid})
    return run_id, rid, data


BG = "e => getComputedStyle(e).backgroundColor"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_token_kinds_keep_their_colours_in_the_stream(page: Page, engine: Any, live_app: Any, tmp_path: Path,
                                                      scheme: str) -> None:
    """#37: in the dark theme `<think>`, `</think>`, role and EOS chips had the colour of plain text (theme.css's
    `.chips .chip` overrode review.css's kinds); only the legend kept them."""
    srv = live_app()
    run_id, rid, _ = _long_record(engine, tmp_path, srv.url, words=20)
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{srv.url}/runs/{run_id}/records/{rid}/tokens")
    expect(page.locator("#chips")).to_be_visible(timeout=60_000)
    plain = page.locator("#chips .chip.k-text").first.evaluate(BG)
    seen = {}
    for kind in KINDS:
        legend = page.locator(f".legend .chip.k-{kind}:not(.asst)").evaluate(BG)
        for trained in (False, True):
            chip = page.locator(f"#chips .chip.k-{kind}{'.asst' if trained else ':not(.asst)'}")
            if not chip.count():
                continue
            colour = chip.first.evaluate(BG)
            seen[(kind, trained)] = colour
            assert colour == legend, (scheme, kind, trained, colour, legend)
            assert colour != plain, (scheme, kind, colour)
    assert {k for k, _ in seen} == set(KINDS), seen
    assert len(set(seen.values())) == len(KINDS)  # three kinds, three colours


def test_a_long_records_jump_links_are_kept_in_the_url(page: Page, engine: Any, live_app: Any,
                                                        tmp_path: Path) -> None:
    srv = live_app()
    run_id, rid, data = _long_record(engine, tmp_path, srv.url)
    n = len(data["input_ids"])
    assert n > 5000
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{srv.url}/runs/{run_id}/records/{rid}")
    page.keyboard.press("t")
    nav = page.locator("#token-jumps")
    expect(nav).to_be_visible(timeout=60_000)
    labels = nav.locator("a").all_inner_texts()
    for want in ("</think>", "the answer", "EOS", "first difference", "first think token", "first role/turn token",
                 "first BOS/EOS token"):
        assert want in labels, labels
    targets = {}
    for label in ("</think>", "the answer", "EOS", "first difference"):
        link = nav.locator(f'a[data-jump="{label}"]')
        href = link.get_attribute("href") or ""
        targets[label] = href
        link.click()
        expect(page).to_have_url(f"{srv.url}/runs/{run_id}/records/{rid}{href}")
        expect(page.locator(f"#chips {href}")).to_be_in_viewport()
    end_think = page.locator(f"#chips {targets['</think>']}")
    assert "k-think" in (end_think.get_attribute("class") or "") and "/think" in end_think.inner_text()
    answer = page.locator(f"#chips {targets['the answer']}")
    assert "asst" in (answer.get_attribute("class") or "") and "k-text" in (answer.get_attribute("class") or "")
    assert "k-bos_eos" in (page.locator(f"#chips {targets['EOS']}").get_attribute("class") or "")
    assert "differs" in (page.locator(f"#chips {targets['first difference']}").get_attribute("class") or "")
    index = {k: int(v.removeprefix("#tok-")) for k, v in targets.items()}
    assert index["</think>"] < index["the answer"] < index["first difference"] < index["EOS"] < n
    # the URL alone brings the reader back to the token: a new visit opens the Tokens tab there
    page.goto("about:blank")
    page.goto(f"{srv.url}/runs/{run_id}/records/{rid}{targets['</think>']}")
    expect(page.locator(f"#chips {targets['</think>']}")).to_be_in_viewport(timeout=60_000)
    assert page.evaluate("window.scrollY") > 2000  # the page moved: </think> is thousands of tokens down


def test_bulk_flag_flags_exactly_what_it_previewed(page: Page, engine: Any, live_app: Any) -> None:
    """#37: 101 in the preview, 102 flagged. A record still pending at the preview finishes (matching the filter)
    before the confirmation; the confirmation flags the previewed records and says how many."""
    from test_review import add_run

    run_id = add_run(engine, "bulk-exact")
    empty = [add_record(engine, run_id, i, reasoning="") for i in range(5)]
    pending = add_record(engine, run_id, 5, status="pending", reasoning=None, content=None)
    empty.append(add_record(engine, run_id, 6, reasoning=""))
    srv = live_app()
    page.goto(f"{srv.url}/runs/{run_id}/records?reasoning_len_max=0")
    page.locator("#bulk summary").click()
    page.locator("#bulk-form select[name=flag_verdict]").select_option("bad")
    page.locator("#bulk-preview").click()
    expect(page.locator("#bulk-count")).to_have_attribute("data-count", "6")
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE record SET status = 'ok', reasoning = '', reasoning_len = 0, content = 'x',"
                          " content_len = 1, finish_reason = 'stop', finished_at = :t WHERE id = :i"),
                     {"t": time.time(), "i": pending})
    page.locator("#bulk-confirm").click()
    expect(page.locator("#bulk-done")).to_have_attribute("data-count", "6")
    expect(page.locator("#bulk-done")).to_contain_text("Flagged 6 records bad")
    with engine.connect() as conn:
        flagged = sorted(r[0] for r in conn.execute(text("SELECT record_id FROM flag WHERE run_id = :r"),
                                                    {"r": run_id}))
    assert flagged == sorted(empty)


_WIDEST = """() => { const w = document.documentElement.clientWidth; const out = [];
  for (const el of document.querySelectorAll('body *')) { const r = el.getBoundingClientRect();
    if (r.right > w + 1 && !(el.parentElement && el.parentElement.getBoundingClientRect().right > w + 1))
      out.push(el.tagName + '.' + el.className + '#' + el.id + ' ' + Math.round(r.right)); }
  return out.slice(0, 6); }"""


def test_no_page_is_wider_than_a_390_px_screen(page: Page, engine: Any, live_app: Any, sim: Any,
                                               prompts: Any) -> None:
    """#37: the checks page was 896 px wide at 390 px. Every page kind, with alarm cards and an audit log."""
    from test_a11y_browser import _alarms
    from workerkit import Background, make_config

    url = sim()
    runs = []
    for name in ("narrow-a", "narrow-b"):
        worker = Background(engine, make_config(url, prompts(6, name=f"{name}.jsonl"), concurrency=3,
                                                name=name)).start()
        assert worker.join(60) == "completed"
        runs.append(worker.run_id)
    a, b = runs
    fixable = _alarms(engine, a)
    with engine.connect() as conn:
        rec = conn.execute(text("SELECT id FROM record WHERE run_id = :r ORDER BY id LIMIT 1"), {"r": a}).scalar_one()
    srv = live_app()
    page.set_viewport_size({"width": 390, "height": 844})
    pages = {
        "runs list": "/runs", "run page": f"/runs/{a}", "records table": f"/runs/{a}/records",
        "record page": f"/runs/{a}/records/{rec}", "token view": f"/runs/{a}/records/{rec}/tokens",
        "review": f"/runs/{a}/sample?mode=unreviewed", "compare": f"/compare?run={a}&run={b}",
        "export": f"/runs/{a}/export", "checks": f"/runs/{a}/checks", "checks help": "/help/checks",
        "settings & repairs": f"/runs/{a}/repair", "new run": "/runs/new", "API docs": "/docs",
        "likely fix": f"/runs/{a}/alarms/{fixable}/fix",
    }
    wide = {}
    for kind, path in pages.items():
        page.goto(srv.url + path)
        page.wait_for_load_state("networkidle")
        width = int(page.evaluate("document.documentElement.scrollWidth"))
        if width > 390:
            wide[kind] = (width, page.evaluate(_WIDEST))
    assert not wide, wide


POLL_BUDGET_BYTES = 100_000  # per 30 s of an open live page (#37: "every live page")


@pytest.mark.slow
def test_every_live_page_polls_within_100kb_per_30s(page: Page, engine: Any, sim: Any, prompts: Any,
                                                    live_app: Any) -> None:
    """#37: the live run page pulled 100-108 KB per 30 s with an alarm card on it. Each live page kind, an open
    warning alarm on the run (its card polls every 2 s), watched for 10 s and scaled to 30 s."""
    import collections
    import os
    from urllib.parse import urlparse

    from test_checks_kit import CheckedBackground
    from workerkit import make_config, run_row, wait_for

    window_s = float(os.environ.get("SYNTHWATCH_POLL_WINDOW_S", "10"))
    url = sim(reasoning_field="reasoning_content", seed=9, ttft_ms=50, rate_429=0.05)
    bg = CheckedBackground(engine, make_config(url, prompts(100_000), concurrency=4,
                                               reasoning={"mode": "reasoning_content"})).start()
    try:
        srv = live_app()
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 10, what="first records")
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text(
                "INSERT INTO alarm (run_id, rule, severity, title, message, fix, count, raised_at, updated_at, active,"
                " auto_paused) VALUES (:r, 'think_tags_in_content', 'warning', 'Think tags in the content',"
                " 'The answer holds `<think>` tags.', 'Set `reasoning.mode = \"tags\"`.', 3, :t, :t, true, false)"),
                {"r": bg.run_id, "t": time.time()})
            rec = conn.execute(text("SELECT id FROM record WHERE run_id = :r AND status = 'ok' ORDER BY id LIMIT 1"),
                               {"r": bg.run_id}).scalar_one()
        pages = {"run page": f"/runs/{bg.run_id}", "records (following)": f"/runs/{bg.run_id}/records?follow=1",
                 "record page": f"/runs/{bg.run_id}/records/{rec}", "checks": f"/runs/{bg.run_id}/checks",
                 "runs list": "/runs", "review": f"/runs/{bg.run_id}/sample?mode=recent"}
        over = {}
        for kind, path in pages.items():
            page.goto(srv.url + path)
            page.wait_for_load_state("load")
            page.wait_for_timeout(3_000)  # the first polls (every widget once) are part of opening the page
            sizes: collections.Counter[str] = collections.Counter()

            def on_finished(request: Any, sizes: collections.Counter[str] = sizes) -> None:
                s = request.sizes()
                sizes[urlparse(request.url).path] += (s["responseBodySize"] + s["responseHeadersSize"]
                                                      + s["requestHeadersSize"])

            page.on("requestfinished", on_finished)
            t0 = time.monotonic()
            page.wait_for_timeout(window_s * 1000)
            elapsed = time.monotonic() - t0
            page.remove_listener("requestfinished", on_finished)
            per_30 = sum(sizes.values()) * 30 / elapsed
            print(f"{kind}: {per_30:,.0f} B per 30 s ({dict(sizes.most_common(4))})")
            if per_30 > POLL_BUDGET_BYTES:
                over[kind] = (round(per_30), dict(sizes.most_common(5)))
        assert run_row(engine, bg.run_id)["status"] == "running"
        assert not over, over
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)


def test_using_every_control_leaves_no_console_error(page: Page, engine: Any, sim: Any, prompts: Any,
                                                     live_app: Any) -> None:
    """#37: CSP errors in the console after using the controls. Pause, cap, concurrency, resume and a graceful stop
    from the page; the autouse browser watch (tests/conftest.py) fails the test on any console error, CSP
    refusals included, or any failed request."""
    from workerkit import Background, make_config, run_row, wait_for

    url = sim(ttft_ms=100)
    bg = Background(engine, make_config(url, prompts(2000), concurrency=2, name="controls")).start()
    try:
        srv = live_app()
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 2, what="first records")
        page.goto(f"{srv.url}/runs/{bg.run_id}")
        page.locator('[data-control="pause"]').click()
        expect(page.get_by_test_id("control-message")).to_contain_text("pause", ignore_case=True)
        page.locator("#cap-input").fill("1500")
        page.locator('[data-control="cap"]').click()
        expect(page.get_by_test_id("control-message")).to_contain_text("1500")
        page.locator("#concurrency-input").fill("3")
        page.locator('[data-control="concurrency"]').click()
        expect(page.get_by_test_id("control-message")).to_contain_text("3")
        page.locator('[data-control="resume"]').click()
        expect(page.get_by_test_id("control-message")).to_contain_text("resume", ignore_case=True)
        wait_for(lambda: run_row(engine, bg.run_id)["status"] == "running", what="resumed")
        page.once("dialog", lambda d: d.accept())
        page.locator('[data-control="stop"]').click()
        assert bg.join(60) in ("stopped", "completed")
        page.reload()
        expect(page.get_by_test_id("controls-ended")).to_be_visible(timeout=10_000)
        assert run_row(engine, bg.run_id)["cap"] == 1500 and run_row(engine, bg.run_id)["concurrency"] == 3
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
