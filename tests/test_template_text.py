"""Template text in a record's text (#35): `template_tokens_in_text` finds a chat template's control strings written
as text (the built-in list and the run's tokenizer's special tokens), and `think_tags_in_content` tells a tag the
model emitted from one an answer discusses (code spans, fenced blocks, quotes).

Named cases from the labelled corpus, Hypothesis properties over the rule, and a real `synthwatch import` of leaked
text into a real SQLite file, read back from the dashboard over HTTP (catalogue, checks page, alarm)."""

from __future__ import annotations

import json
from pathlib import Path

import check_corpus
import httpx
import pytest
from conftest import HTTP_TIMEOUT_S, run_cli
from hypothesis import given
from hypothesis import strategies as st
from workerkit import run_row

from synthwatch.check_catalog import BIT, CHECK_NAMES
from synthwatch.quality.checks import RecordChecker, RecordView, RunContext
from synthwatch.quality.template_leaks import BUILTIN_MARKERS, MarkerFinder, find_tags, run_markers
from synthwatch.store.db import open_engine

THINK = ("<think>", "</think>")


def fired(content: str, reasoning: str = "Some reasoning.", tokenizer: dict[str, str] | None = None) -> set[str]:
    cfg: dict[str, object] = {"reasoning": {"mode": "reasoning"}}
    if tokenizer:
        cfg["tokenizer"] = tokenizer
    checker = RecordChecker(RunContext.from_config(1, "t", cfg))
    _a, failed, _d = checker.check(RecordView(1, 0, "ok", reasoning, content, "stop", 10))
    return {n for n in CHECK_NAMES if failed & BIT[n]}


@pytest.fixture(scope="module")
def results() -> list[check_corpus.Result]:
    runs, records = check_corpus.load()
    return check_corpus.check_all(runs, records)


def test_the_five_legitimate_answers_that_quote_the_close_tag_pass(results) -> None:  # type: ignore[no-untyped-def]
    quoted = [r for r in results if r.record["scenario"] == "answer-quotes-close-tag"]
    assert len(quoted) == 5
    for r in quoted:
        assert "</think>" in r.record["response"]["choices"][0]["message"]["content"]
        assert "think_tags_in_content" not in r.fired, r.record["id"]
    discussions = [r for r in results if r.record["scenario"] == "answer-discusses-markers-in-code"]
    assert len(discussions) >= 8 and not [r.record["id"] for r in discussions if r.fired]


def test_every_leak_of_the_corpus_fires_and_nothing_else_does(results) -> None:  # type: ignore[no-untyped-def]
    leaks = [r for r in results if r.record["scenario"].startswith("leaked-")]
    assert len(leaks) >= 15
    for r in leaks:
        assert r.fired == {"template_tokens_in_text"}, (r.record["id"], r.fired)
    s = check_corpus.score(results)["template_tokens_in_text"]
    assert s.precision == 1.0 and s.recall == 1.0


@pytest.mark.parametrize("content", [
    "The answer is 4.<｜end▁of▁sentence｜>",
    "4<|im_end|><|im_start|>user\nthanks",
    "4<|eot_id|>",
    "4<|im_end|><|im_user|>user<|im_middle|>more",
    "<｜Assistant｜>4",
])
def test_leaked_special_token_text_fails(content: str) -> None:
    assert fired(content) == {"template_tokens_in_text"}
    assert fired("Fine answer.", reasoning=f"thinking {content}") == {"template_tokens_in_text"}


@pytest.mark.parametrize("content", [
    "R1 closes its reasoning with `</think>` and then answers.",
    "The tag \"</think>\" ends the reasoning.",
    "Strip up to '</think>' to keep the answer.",
    "```\n<think>notes</think>answer\n```",
    "Stop at `<|im_end|>`; Llama 3 uses “<|eot_id|>”.",
])
def test_a_marker_in_code_or_quotes_is_discussed_not_emitted(content: str) -> None:
    assert fired(content) == set()


def test_the_runs_tokenizer_adds_its_own_special_tokens() -> None:
    tok = {"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"}
    assert "<|place_holder_mm_span_0021|>" not in run_markers(None)
    assert "<|place_holder_mm_span_0021|>" in run_markers(tok)
    assert not set(THINK) & run_markers(tok, exclude=THINK)
    content = "The answer is 4.<|place_holder_mm_span_0021|>"
    assert fired(content) == set()  # without the tokenizer: not a marker anyone's template is known to use
    assert fired(content, tokenizer=tok) == {"template_tokens_in_text"}


def test_a_disabled_check_is_not_applied() -> None:
    ctx = RunContext.from_config(1, "t", {"checks": {"disabled": ["template_tokens_in_text"]}})
    applied, failed, _ = RecordChecker(ctx).check(RecordView(1, 0, "ok", "r", "4<|eot_id|>", "stop", 3))
    assert not (applied | failed) & BIT["template_tokens_in_text"]


# ------------------------------------------------------------------------------------------- properties

PROSE = st.text(st.characters(blacklist_characters="`'\"“”‘’«»„~<|｜", blacklist_categories=("Cs",)), max_size=40)
MARKERS = st.sampled_from(sorted(BUILTIN_MARKERS))
FINDER = MarkerFinder(run_markers(None, exclude=THINK))


@given(PROSE, MARKERS, PROSE)
def test_property_a_bare_marker_is_found(before: str, marker: str, after: str) -> None:
    assert marker in FINDER.find(before + marker + after)


@given(PROSE, MARKERS, PROSE, st.sampled_from(["`{}`", "``{}``", "\"{}\"", "'{}'", "“{}”", "```\n{}\n```\n"]))
def test_property_a_quoted_or_code_marker_is_not_found(before: str, marker: str, after: str, wrap: str) -> None:
    text = before + ("\n" if wrap.startswith("```") else "") + wrap.format(marker) + after
    assert FINDER.find(text) == []


@given(PROSE, st.sampled_from(THINK), PROSE, st.sampled_from(["`{}`", "\"{}\"", "'{}'", "```\n{}\n```\n", "{}"]))
def test_property_think_tags_bare_or_discussed(before: str, tag: str, after: str, wrap: str) -> None:
    text = before + ("\n" if wrap.startswith("```") else "") + wrap.format(tag) + after
    assert find_tags(text, THINK) == ([tag] if wrap == "{}" else [])


# ------------------------------------------------------------------------------------------- end to end


def test_an_import_with_leaked_text_alarms_and_shows_on_the_pages(tmp_path: Path, db_path: Path, live_app) -> None:  # type: ignore[no-untyped-def]
    lines = tmp_path / "gen.jsonl"
    with lines.open("w") as fh:
        for i in range(30):
            content = f"The answer is {i}." + ("<|im_end|>\n<|im_start|>user\nthanks" if i % 3 == 0 else "")
            if i % 3 == 1:
                content += " (ChatML ends a turn with `<|im_end|>`.)"  # discussed: passes
            fh.write(json.dumps({"id": f"r{i}", "object": "chat.completion", "model": "m", "choices": [{
                "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content,
                                                                 "reasoning_content": f"Thinking about {i}."}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 12}}) + "\n")
    run_cli("import", str(lines), "--run", "leaky", "--db", str(db_path), "--quiet", check=True)
    res = run_cli("checks", "leaky", "--db", str(db_path), "--json", check=True)
    body = json.loads(res.stdout)
    rate = next(r for r in body["checks"] if r["check_name"] == "template_tokens_in_text")
    assert (rate["n_fail"], rate["n_total"]) == (10, 30)
    alarm = next(a for a in body["alarms"] if a["rule"] == "template_tokens_in_text")
    assert "<|im_end|>" in alarm["message"] and "rerun" in alarm["fix"]
    srv = live_app()
    run_id = run_row(open_engine(str(db_path)), "leaky")["id"]
    help_page = httpx.get(f"{srv.url}/help/checks", timeout=HTTP_TIMEOUT_S).text
    assert "template_tokens_in_text" in help_page
    page = httpx.get(f"{srv.url}/runs/{run_id}/checks", timeout=HTTP_TIMEOUT_S)
    assert page.status_code == 200 and "Template tokens written as text" in page.text
    api = httpx.get(f"{srv.url}/api/runs/{run_id}/alarms", timeout=HTTP_TIMEOUT_S).json()
    assert any(a["rule"] == "template_tokens_in_text" for a in api["alarms"])


def test_a_local_tokenizers_special_tokens_and_template_markers_count(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 1, "content": "<|my_turn_end|>", "special": True}, {"id": 2, "content": "<s>", "special": True}]}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {"3": {"content": "<my_role_start>", "special": True}},
        "eos_token": "<|my_eos|>", "chat_template": "{{ '<|my_header|>' + m }}"}))
    tok = {"name_or_path": str(folder)}
    markers = run_markers(tok)
    assert {"<|my_turn_end|>", "<my_role_start>", "<|my_eos|>", "<|my_header|>"} <= markers
    assert "<s>" not in markers  # an HTML tag's shape: never a marker (strikethrough in an answer)
    for leak in ("<|my_turn_end|>", "<my_role_start>", "<|my_header|>"):
        assert fired(f"4{leak}", tokenizer=tok) == {"template_tokens_in_text"}
        assert fired(f"4{leak}") == set()
    assert fired("an <s>old</s> price", tokenizer=tok) == set()
