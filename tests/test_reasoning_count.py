"""Reasoning tokens counted from token ids (#29 item 3): split at the think-close id of the run's tokenizer, or
from the stream's reasoning chunks; a text-length estimate, marked as one, only where a reply has no ids. The
record's column, the run's totals (GET /api/runs/{id}/tokens) and its per-version breakdown agree."""

from __future__ import annotations

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from workerkit import make_config, records, run_to_end

from synthwatch.capture.token_count import reasoning_from_ids
from synthwatch.simulator.config import THINK_CLOSE_ID, THINK_OPEN_ID

OPEN, C = [THINK_OPEN_ID], [THINK_CLOSE_ID]


@pytest.mark.parametrize(("ids", "reasoning", "content", "want"), [
    ([5, 6, 7, *C, 8, 9, 1], "abc", "de", 3),  # prefilled <think>: everything before the close
    ([*OPEN, 5, 6, *C, 8], "ab", "d", 2),  # the completion opens the block itself: the open id is not reasoning
    ([*C, 8, 9], "", "de", 0),  # an empty think block
    ([5, 6, 7], "abc", "", 3),  # cut while thinking: no close, no content
    ([*OPEN, 5, 6], "ab", "", 2),
    ([8, 9], "", "de", 0),  # no reasoning at all
    ([5, 6, 8, 9], "ab", "de", None),  # both texts, no close id: the tags are not this tokenizer's
    ([5, 90, 91, 8, 90, 91, 9], "a", "b", 1),  # a two-id close tag: its first run
])
def test_named_splits(ids: list[int], reasoning: str, content: str, want: int | None) -> None:
    close = [90, 91] if 90 in ids else C
    assert reasoning_from_ids(ids, OPEN, close, reasoning, content) == want


def test_no_close_tag_configured() -> None:
    assert reasoning_from_ids([1, 2, 3], OPEN, [], "a", "b") is None


_TEXT_IDS = st.lists(st.integers(2, 128_000), max_size=60)


@given(_TEXT_IDS, _TEXT_IDS, st.booleans(), st.lists(st.integers(2, 128_000), max_size=3))
def test_split_counts_the_reasoning_ids(r_ids: list[int], c_ids: list[int], opened: bool, tail: list[int]) -> None:
    # a completion = [<think>] reasoning </think> content: the count is the reasoning's length, whatever the ids
    ids = ([*OPEN] if opened else []) + r_ids + C + c_ids + tail
    assert reasoning_from_ids(ids, OPEN, C, "r" if r_ids else "", "c") == len(r_ids)


def _tokens(url: str, run_id: int) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{url}/api/runs/{run_id}/tokens").json()


def _agree(t: dict, ok: list[dict]) -> int:  # type: ignore[type-arg]
    """The column's sum, the run's total and the per-version breakdown are one number; returns it."""
    col = sum(r["reasoning_tokens"] for r in ok)
    assert t["total"]["reasoning"] == col
    assert sum(v["reasoning"] for v in t["by_config_version"]) == col
    assert sum(e["reasoning"] for e in t["endpoints"]) == col
    return col


def test_inline_tags_split_at_the_tokenizers_close_id(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    # no reasoning parser: the think tags are in content and usage has no reasoning_tokens; the ids (the DeepSeek
    # tokenizer's own ids for the tags) split at </think>
    url = sim(seed=31, reasoning_field="inline", reasoning_tokens="20-40", content_tokens="5-15")
    cfg = make_config(url, prompts(24), name="ids-inline", concurrency=4, request_token_ids=True,
                      tokenizer={"name_or_path": "deepseek-v4"})
    run_id, final = run_to_end(engine, cfg, timeout_s=120)
    assert final == "completed"
    ok = records(engine, run_id, "status = 'ok'")
    assert len(ok) == 24
    for r in ok:
        ids = orjson.loads(r["token_ids_json"])["completion"]
        assert THINK_CLOSE_ID in ids
        start = ids.index(THINK_OPEN_ID) + 1 if THINK_OPEN_ID in ids[:ids.index(THINK_CLOSE_ID)] else 0
        assert r["reasoning_tokens"] == ids.index(THINK_CLOSE_ID) - start > 0
        assert r["reasoning_tokens_source"] == "ids"
        assert "completion_tokens_details" not in (orjson.loads(r["usage_json"]) or {})
    t = _tokens(live_app().url, run_id)
    assert _agree(t, ok) > 0
    assert t["total"]["reasoning_estimated"] == 0


def test_parser_mode_counts_the_reasoning_chunks_ids_without_a_tokenizer(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    # a reasoning parser: each reasoning chunk carries its ids; the count needs no tokenizer and equals the
    # simulator's own count of reasoning tokens
    url = sim(seed=32, reasoning_field="reasoning", reasoning_tokens="20-40", content_tokens="5-15")
    cfg = make_config(url, prompts(20), name="ids-parser", concurrency=4, request_token_ids=True)
    run_id, final = run_to_end(engine, cfg)
    assert final == "completed"
    ok = records(engine, run_id, "status = 'ok'")
    for r in ok:
        assert r["reasoning_tokens_source"] == "ids"
        usage = orjson.loads(r["usage_json"])
        assert r["reasoning_tokens"] == usage["completion_tokens_details"]["reasoning_tokens"] > 0
    _agree(_tokens(live_app().url, run_id), ok)


def test_deepseek_ids_split_at_the_close_id_after_a_prefilled_think(engine, sim, prompts, live_app) -> None:  # type: ignore[no-untyped-def]
    # vLLM 0.32-like: the DeepSeek tokenizer's real ids (several per word), the prompt ends with <think>, the
    # completion holds </think> and ends with EOS; the split at the tokenizer's close id is the server's count
    url = sim(seed=34, token_ids="deepseek", reasoning_field="reasoning", reasoning_tokens="20-40",
              content_tokens="5-15")
    cfg = make_config(url, prompts(12), name="ids-deepseek", concurrency=4, request_token_ids=True,
                      tokenizer={"name_or_path": "deepseek-v4"})
    run_id, final = run_to_end(engine, cfg, timeout_s=120)
    assert final == "completed"
    ok = records(engine, run_id, "status = 'ok'")
    for r in ok:
        ids = orjson.loads(r["token_ids_json"])
        assert ids["prompt"][-2:] == [THINK_OPEN_ID, 201] and THINK_OPEN_ID not in ids["completion"]
        assert r["reasoning_tokens"] == ids["completion"].index(THINK_CLOSE_ID)
        usage = orjson.loads(r["usage_json"])
        assert r["reasoning_tokens"] == usage["completion_tokens_details"]["reasoning_tokens"] > 0
        assert r["reasoning_tokens_source"] == "ids"
    _agree(_tokens(live_app().url, run_id), ok)


@pytest.mark.browser
def test_without_ids_the_estimate_is_marked(engine, sim, prompts, live_app, page) -> None:  # type: ignore[no-untyped-def]
    # inline tags and no ids: the only count is the text-length share, marked as an estimate in the API and UI
    url = sim(seed=33, reasoning_field="inline", reasoning_tokens="20-40", content_tokens="5-15")
    run_id, final = run_to_end(engine, make_config(url, prompts(16), name="estimate", concurrency=4))
    assert final == "completed"
    ok = records(engine, run_id, "status = 'ok'")
    assert {r["reasoning_tokens_source"] for r in ok} == {"estimate"}
    srv = live_app()
    t = _tokens(srv.url, run_id)
    col = _agree(t, ok)
    assert t["total"]["reasoning_estimated"] == col > 0
    assert t["by_config_version"][0]["reasoning_estimated"] == col
    page.goto(f"{srv.url}/runs/{run_id}")
    assert page.get_by_test_id("reasoning-total").inner_text() == f"≈{col:,}"
    assert f"≈ {col:,} reasoning tokens are estimated" in page.get_by_test_id("reasoning-estimated").inner_text()
    page.goto(f"{srv.url}/runs/{run_id}/records/{ok[0]['id']}")
    page.locator("#meta-row summary").click()  # the record's details, folded by default
    want = f"reasoning ≈{ok[0]['reasoning_tokens']:,} (estimated from text length)"
    assert want in page.locator("#rec-meta").inner_text()


def _extracted(reasoning: str, content: str, usage: object, ids: list[int] | None, prompt_ids: list[int] | None,
               n_chunks: int, reasoning_ids: int | None):  # type: ignore[no-untyped-def]
    from synthwatch.capture.reasoning import Extracted

    return Extracted(reasoning=reasoning, content=content, content_was_null=False, reasoning_source="reasoning",
                     finish_reason="stop", usage=usage, token_ids=ids, prompt_token_ids=prompt_ids, response_id=None,
                     model=None, system_fingerprint=None, extra={}, unread_fields={}, duplicate_fields=[],
                     n_chunks=n_chunks, reasoning_ids=reasoning_ids)


_COUNT = st.one_of(st.integers(-5, 10**6), st.none(), st.booleans(), st.floats(), st.text(max_size=3))
_USAGE = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "prompt_tokens": _COUNT, "completion_tokens": _COUNT,
    "completion_tokens_details": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"reasoning_tokens": _COUNT}))}))
_IDS = st.one_of(st.none(), st.lists(st.integers(0, 200_000), max_size=40))


@given(st.text(max_size=30), st.text(max_size=30), _USAGE, _IDS, _IDS, st.integers(0, 500),
       st.one_of(st.none(), st.integers(0, 100)), st.integers(0, 10_000))
def test_counts_are_whole_and_consistent(reasoning: str, content: str, usage: object, ids: list[int] | None,
                                         prompt_ids: list[int] | None, n_chunks: int, reasoning_ids: int | None,
                                         body: int) -> None:
    """Whatever a server sends: reasoning + content = completion, nothing negative, the source says which rule
    gave the count, and a billed attempt's estimated part is at most what it bills."""
    from synthwatch.capture.safety import MAX_COUNT
    from synthwatch.capture.token_count import REASONING_SOURCES, billed_tokens, completion_count, reasoning_count

    ex = _extracted(reasoning, content, usage, ids, prompt_ids, n_chunks, reasoning_ids)
    reported = usage.get("completion_tokens") if isinstance(usage, dict) else None
    prompt, completion, counted = completion_count(ex)
    r, source = reasoning_count(ex, completion)
    assert source in REASONING_SOURCES and 0 <= r <= completion and prompt >= 0
    assert (source == "ids") == (reasoning_ids is not None)
    if source == "estimate":
        assert reasoning  # an estimate only for text there is; without text the count is 0 ("none")
    assert not counted or type(reported) is not int or not 0 <= reported <= MAX_COUNT
    bp, bc, est = billed_tokens(ex, body)
    assert bp >= 0 and bc >= 0 and 0 <= est <= bp + bc
    if type(reported) is int and 0 <= reported <= MAX_COUNT:
        assert bc == reported == completion  # the server's count wins, for the bill and the series alike
