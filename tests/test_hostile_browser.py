"""Hostile model output through the real pipeline: simulator -> worker -> SQLite -> dashboard -> Chromium.

The simulator echoes `ECHO:` prompts, so every string of tests/hostile.py comes back as both reasoning and
content. In a real browser no script may run (`window.__pwned` stays unset, no dialog opens; an inline
script blocked by the CSP or an injected <img> would also fail the test through the browser-problem checks),
and every string is shown literally: the textContent of the element showing it equals what synthwatch.review.display
renders (invisible and bidi characters as visible markers).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from synthwatch.check_catalog import DEFAULT_RULES
from synthwatch.review import display as review_display
from synthwatch.review import queries as review
from synthwatch.store.db import open_engine
from synthwatch.workers.refusals import NUL_STAND_IN
from tests.conftest import HTTP_TIMEOUT_S
from tests.hostile import HOSTILE
from tests.test_checks_kit import CheckedBackground
from tests.workerkit import counts, make_config, records, wait_for

# Strings that would open a dialog if they ran (the corpus itself sets window.__pwned).
DIALOG = [
    "<img src=x onerror=alert(1)>",
    "<svg/onload=confirm(1)>",
    "\"><iframe srcdoc=\"<script>parent.alert(1)</script>\">",
]
BIG = "1MB " + "<script>window.__pwned=1</script>&amp;\u202e" * (1_000_000 // 40)
STRINGS = HOSTILE + DIALOG + [BIG]
assert len(HOSTILE) >= 40 and any("\x00" in s for s in STRINGS)

RUN_NAME = "<script>window.__pwned=1</script> run \u202e\"'&amp;"
FINGERPRINT = "<img src=x onerror=window.__pwned=1>vllm\u202e"

GUARD = """
window.__pwnedDialogs = 0;
Object.defineProperty(window, '__pwned', {configurable: false,
  get() { return window.__pwnedHit; }, set(v) { window.__pwnedHit = 'set:' + String(v); }});
"""


def shown(value: str, stored: bool = True) -> str:
    """What the viewer's <pre> shows: segments as rendered; the HTML parser turns CR and CRLF into LF. A model's
    text is stored with NUL as U+2400 (docs/limits.md); a prompt (JSON) keeps it."""
    if stored:
        value = value.replace("\x00", NUL_STAND_IN)
    text = "".join(s for _kind, s in review_display.segments(value))
    return text.replace("\r\n", "\n").replace("\r", "\n")


@pytest.fixture
def hostile_run(tmp_path: Path, db_path: Path, sim: Any) -> dict[str, Any]:
    dataset = tmp_path / "hostile.jsonl"
    with dataset.open("w") as fh:
        for i, s in enumerate(STRINGS):
            fh.write(json.dumps({"id": f"h{i}", "messages": [{"role": "user", "content": "ECHO:" + s}]}) + "\n")
    # a slow first token keeps the run alive long enough to change the server's fingerprint half-way: the
    # drift alarm then quotes a hostile server string in the banner
    url = sim(max_model_len=4_000_000, ttft_ms=40)
    engine = open_engine(str(db_path))
    # the `<think>` strings fire the field-mismatch alarm: keep it, but let the run go on
    no_pause = {"rules": {rule: {"auto_pause": False} for rule in DEFAULT_RULES}}
    config = make_config(url, dataset, name=RUN_NAME, concurrency=2, checks=no_pause,
                         tokenizer={"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"})
    bg = CheckedBackground(engine, config).start()  # with the checks, so alarms fire
    wait_for(lambda: counts(engine, bg.run_id).get("ok", 0) >= 6, what="first records")
    req = urllib.request.Request(url.rstrip("/").removesuffix("/v1") + "/sim/config", method="PATCH",
                                 data=orjson.dumps({"fingerprint": FINGERPRINT}),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S).read()
    assert bg.join(60) == "completed"
    recs = records(engine, bg.run_id)
    engine.dispose()
    assert len(recs) == len(STRINGS)
    by_idx = {r["idx"]: r for r in recs}
    for i, s in enumerate(STRINGS):  # the pipeline keeps every string exactly (1 MB included; NUL: docs/limits.md)
        assert by_idx[i]["status"] == "ok", (i, by_idx[i]["error"])
        kept = s.replace("\x00", NUL_STAND_IN)
        assert by_idx[i]["content"] == kept and by_idx[i]["reasoning"] == kept, i
        if "\x00" in s:  # the exact text, NUL and all, is in the record's raw fields
            assert orjson.loads(by_idx[i]["extra_json"])["nul_text"] == {"reasoning": s, "content": s}, i
    return {"run_id": bg.run_id, "recs": [by_idx[i] for i in range(len(STRINGS))]}


class Guard:
    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        page.add_init_script(GUARD)
        page.on("dialog", self._dialog)

    def _dialog(self, d: Any) -> None:
        self.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    def visit(self, url: str) -> None:
        self.page.goto(url)
        self.check(url)

    def check(self, where: str) -> None:
        self.page.wait_for_load_state("load")
        hit = self.page.evaluate("window.__pwned")
        frames = [f.evaluate("window.__pwnedHit || null") for f in self.page.frames[1:] if not f.is_detached()]
        assert hit is None and not any(frames), f"script ran on {where}: {hit} {frames}"
        assert not self.dialogs, f"dialog opened on {where}: {self.dialogs}"


# Over 30 s under load (~32 s with -n 2): every hostile string of the corpus opened on every page that shows it,
# in a real browser, watching for dialogs and script; one page load per string and view.
@pytest.mark.browser
def test_viewer_shows_every_hostile_string_literally(hostile_run: dict[str, Any], live_app: Any, page: Any) -> None:
    app = live_app()
    guard = Guard(page)
    run_id = hostile_run["run_id"]
    for i, rec in enumerate(hostile_run["recs"]):
        url = f"{app.url}/runs/{run_id}/records/{rec['id']}"
        guard.visit(url)
        s = STRINGS[i]
        assert page.locator("#side-reasoning pre.text").text_content() == shown(s), i
        assert page.locator("#side-content pre.text").text_content() == shown(s), i
        assert page.locator(".side-prompt .turn pre.text").text_content() == shown("ECHO:" + s, stored=False), i
        # the raw tab: the stored fields as JSON text, shown as text
        page.click("button.tab[data-tab=raw]")
        assert page.locator("#raw-json").is_visible()
        assert page.locator("#raw-json").text_content() == review.raw_fields(rec), i
        content = page.locator("#side-content pre.text").text_content() or ""
        for ch, marker in (("\u202e", "⟨U+202E RLO⟩"), ("\u200b", "⟨U+200B ZWSP⟩"), ("\x00", NUL_STAND_IN)):
            if ch in s:  # bidi, zero-width and NUL characters are made visible
                assert marker in content, (i, marker)
        guard.check(url)


@pytest.mark.browser
def test_token_chips_escape_hostile_text(hostile_run: dict[str, Any], live_app: Any, page: Any) -> None:
    from synthwatch.app.routes_review import MAX_CHIPS
    from synthwatch.app.token_chips import chip_views
    from synthwatch.tokens import render as tokens_render
    from synthwatch.tokens import tokenizer as tokens

    app = live_app()
    guard = Guard(page)
    run_id = hostile_run["run_id"]
    lt = tokens.load_tokenizer(tokens.TokenizerSpec("deepseek-v4", chat_template="deepseek-v4"))
    # a third of the corpus (each page tokenizes the record twice: ~1 s), the markup-breaking ones first; the 1 MB
    # record is left out: tokenizing 3 MB of text for the token view takes > 30 s
    picked = [i for i, s in enumerate(STRINGS[:-1]) if i % 3 == 0 or s.startswith("</")]
    for i in picked:
        rec = hostile_run["recs"][i]
        url = f"{app.url}/runs/{run_id}/records/{rec['id']}/tokens"
        guard.visit(url)
        r = tokens_render.render_record(lt, orjson.loads(rec["prompt_json"]), rec["reasoning"], rec["content"])
        want = [v.shown for v in chip_views(lt, r.chips[:MAX_CHIPS])[0]]
        got = page.locator("#chips span.chip").evaluate_all("els => els.map(e => e.textContent)")
        want = [w.replace("\r\n", "\n").replace("\r", "\n") for w in want]
        assert got == want, i
    # the Tokens tab inside the viewer loads the same chips
    rec = hostile_run["recs"][0]
    guard.visit(f"{app.url}/runs/{run_id}/records/{rec['id']}")
    page.click("button.tab[data-tab=tokens]")
    page.locator("#tokens-pane #chips span.chip").first.wait_for()
    guard.check("viewer tokens tab")


@pytest.mark.browser
def test_table_search_run_banner_export_pages(hostile_run: dict[str, Any], live_app: Any, page: Any) -> None:
    app = live_app()
    guard = Guard(page)
    run_id = hostile_run["run_id"]
    recs = hostile_run["recs"]
    by_id = {r["id"]: r for r in recs}

    seen: set[int] = set()
    url: str | None = f"{app.url}/runs/{run_id}/records"
    while url:
        guard.visit(url)
        page.locator("#records-count").first.wait_for(state="attached")
        for row in page.locator("#records tbody tr").all():
            rid = int(row.get_attribute("data-record-id") or 0)
            got = row.locator("td.preview a").text_content()
            if by_id[rid]["content"] == BIG:  # the table reads a cut prompt: its preview is the JSON's start
                assert got is not None and "ECHO:1MB <script>window.__pwned=1</script>" in got
            else:
                # the table previews raw text (the viewer marks invisibles); the HTML parser drops a NUL
                want = review.prompt_preview(by_id[rid]["prompt_json"]).replace("\x00", "")
                assert got == want.replace("\r\n", "\n").replace("\r", "\n"), rid
            seen.add(rid)
        nxt = page.locator("#page-next")
        url = app.url + (nxt.get_attribute("href") or "") if nxt.count() else None
        if url and not url.startswith(app.url + "/"):
            url = f"{app.url}/runs/{run_id}/records" + (nxt.get_attribute("href") or "")
    assert seen == set(by_id)

    # a search for part of the strings finds them and shows them literally
    for needle, must in (("rtl", "rtl override"), ("onerror", "onerror")):
        guard.visit(f"{app.url}/runs/{run_id}/records?q={needle}")
        cells = page.locator("#records td.preview a").all_text_contents()
        assert cells and any(must in c for c in cells), (needle, cells)
        guard.check(f"search {needle}")

    # the run page (name, fragments), the runs list, the banner with the drift alarm, checks and export
    guard.visit(f"{app.url}/runs/{run_id}")
    assert page.locator("h1").first.text_content().strip().startswith(RUN_NAME.strip()[:30])
    banner = page.locator("section.alarm-banner[data-rule=server_drift] .alarm-message")
    banner.wait_for(state="attached")  # maybe behind the cards' "N more" (#28 item 1): its text is what counts
    guard.check("run page")
    # the drift alarm quotes the hostile server string literally
    assert FINGERPRINT.replace("\u202e", "") in banner.text_content().replace("\u202e", "")
    for path in ("/runs", f"/runs/{run_id}/checks", f"/runs/{run_id}/export", f"/runs/{run_id}/alarms/banner"):
        guard.visit(app.url + path)
        if path != f"/runs/{run_id}/alarms/banner":
            assert RUN_NAME[:20] in page.locator("body").text_content(), path
