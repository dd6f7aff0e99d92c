"""The checks' precision and recall on the labelled corpus (tests/data/check_corpus/), and field_mismatch's rule:
a record whose read field holds the reasoning never counts as a field mismatch (issue #26)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import check_corpus
import pytest
from hypothesis import given
from hypothesis import strategies as st

from synthwatch.capture.reasoning import extract_response
from synthwatch.capture.stream import StreamAccumulator
from synthwatch.check_catalog import BIT, CHECK_NAMES
from synthwatch.quality.checks import RecordChecker, RunContext, parse_settings, view_from_outcome

# What the corpus measured (tests/check_corpus.py; docs/checks.md): a change that lowers one fails here. Raise a
# floor when a check gets better; never lower one to make a change pass.
FLOORS: dict[str, tuple[float, float]] = {  # check: (precision, recall)
    "empty_reasoning": (1.0, 1.0),
    "empty_content": (1.0, 1.0),
    "both_empty_with_tokens": (1.0, 1.0),
    "truncated": (1.0, 1.0),
    "truncated_in_reasoning": (1.0, 1.0),
    "think_tags_in_content": (1.0, 1.0),
    "field_mismatch": (1.0, 0.98),
    "reasoning_tokens_no_text": (1.0, 1.0),
    "repetition": (0.875, 1.0),
    "duplicate_output": (1.0, 1.0),
    "token_count_mismatch": (1.0, 1.0),
    "template_drops_reasoning": (1.0, 1.0),
    "canary_failed": (1.0, 0.83),
    "server_drift": (1.0, 1.0),
    "timeout": (1.0, 1.0),
    "error": (1.0, 1.0),
    "template_tokens_in_text": (1.0, 1.0),
}


@pytest.fixture(scope="module")
def results() -> list[check_corpus.Result]:
    runs, records = check_corpus.load()
    return check_corpus.check_all(runs, records)


def test_the_corpus_covers_every_check_and_its_near_misses(results) -> None:  # type: ignore[no-untyped-def]
    assert len(results) >= 300
    assert set(FLOORS) == set(CHECK_NAMES)
    scenarios = {r.record["scenario"] for r in results}
    # the failure modes and near-misses the issue names
    for name in ("model-sampled-close-tag", "model-sampled-open-tag", "reasoning-mentions-tags",
                 "short-answer-no-reasoning", "reading-mode-mismatch", "inline-think-read-as-field",
                 "truncated-in-reasoning", "truncated-in-content", "duplicate-output", "answer-quotes-close-tag",
                 "leaked-template-tokens", "leaked-template-tokens-in-reasoning", "answer-discusses-markers-in-code",
                 "leaked-tokenizer-special-token"):
        assert name in scenarios, name
    scores = check_corpus.score(results)
    for name in CHECK_NAMES:
        s = scores[name]
        assert s.labelled >= 2, f"{name}: fewer than 2 records must fail it"
        # near-misses: records the check applies to that must pass it
        passing = sum(1 for r in results if name in r.applied and name not in r.record["expect"])
        assert passing >= 5, f"{name}: only {passing} records it applies to must pass it"


def test_field_mismatch_precision_is_one_and_a_read_field_with_reasoning_never_counts(results) -> None:  # type: ignore[no-untyped-def]
    s = check_corpus.score(results)["field_mismatch"]
    assert s.fired >= 50 and s.precision == 1.0
    with_reasoning = [r for r in results if r.stored_reasoning.strip()]
    assert len(with_reasoning) >= 150
    assert not [r.record["id"] for r in with_reasoning if "field_mismatch" in r.fired]
    # the vLLM 0.32 records of issue #26: a second `</think>` in the content, the reasoning stored
    sampled = [r for r in results if r.record["scenario"] == "model-sampled-close-tag"]
    assert len(sampled) == 15
    for r in sampled:
        assert "</think>" in r.record["response"]["choices"][0]["message"]["content"]
        assert r.fired == {"think_tags_in_content"}, r.record["id"]


def test_every_check_is_at_least_as_precise_and_complete_as_measured(results) -> None:  # type: ignore[no-untyped-def]
    scores = check_corpus.score(results)
    worse = []
    for name, (p_floor, r_floor) in FLOORS.items():
        s = scores[name]
        if (s.precision or 0.0) < p_floor or (s.recall or 0.0) < r_floor - 0.005:
            worse.append(f"{name}: precision {s.precision} < {p_floor} or recall {s.recall} < {r_floor}")
    assert not worse, "\n".join(worse + check_corpus.disagreements(results))


def test_the_docs_table_is_the_corpus_result(results) -> None:  # type: ignore[no-untyped-def]
    doc = check_corpus.DOC.read_text()
    inside = doc.split(check_corpus.START, 1)[1].split(check_corpus.END, 1)[0]
    assert inside == "\n" + check_corpus.table(results), (
        "docs/checks.md is out of date: run .venv/bin/python -m tests.check_corpus --write-docs")


def test_the_generator_writes_the_checked_in_corpus() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", check_corpus.CORPUS / "generate.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    c = gen.build()
    gen.fill_usage(c)
    runs, records = check_corpus.load()
    assert c.runs == runs
    assert c.records == records


# ------------------------------------------------------------------------------------------- property

TAGS = ("<think>", "</think>", "<think>\n", "\n</think>\n\n", "`</think>`", " </think> ")
FIELD_MODES = ("reasoning", "reasoning_content", "thinking", "auto")


@st.composite
def content_with_tags(draw: Any) -> str:
    parts = draw(st.lists(st.one_of(st.text(max_size=40), st.sampled_from(TAGS)), max_size=8))
    return "".join(parts)


def _checked(mode: str, message: dict[str, Any], stream_pieces: int | None) -> tuple[str, set[str]]:
    ctx = RunContext(run_id=1, name="p", mode=mode, settings=parse_settings({}))
    body = {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
            "usage": {"completion_tokens": 50}}
    if stream_pieces is None:
        ex = extract_response(body, mode)
    else:
        acc = StreamAccumulator(mode)
        for key, value in message.items():
            if isinstance(value, str):
                k = max(1, len(value) // stream_pieces)
                for i in range(0, len(value), k):
                    acc.feed({"choices": [{"index": 0, "delta": {key: value[i:i + k]}}]})
        acc.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        ex = acc.result()

    from types import SimpleNamespace

    view = view_from_outcome(SimpleNamespace(record_id=1, idx=0, status="ok", extracted=ex, messages=None,
                                             endpoint=None))
    _a, failed, _d = RecordChecker(ctx).check(view)
    return view.reasoning, {n for n in CHECK_NAMES if failed & BIT[n]}


@given(mode=st.sampled_from(FIELD_MODES), reasoning=st.text(min_size=1, max_size=60).filter(lambda t: t.strip()),
       content=content_with_tags(), other=st.one_of(st.none(), content_with_tags()),
       stream=st.one_of(st.none(), st.integers(1, 5)))
def test_property_reasoning_in_the_read_field_is_never_a_field_mismatch(mode, reasoning, content, other,
                                                                        stream) -> None:  # type: ignore[no-untyped-def]
    """Any content, `<think>`/`</think>` anywhere in it, and any text in another reasoning field: when the field the
    run reads holds reasoning, the record is never a field mismatch."""
    read = "reasoning" if mode == "auto" else mode
    message: dict[str, Any] = {"content": content, read: reasoning}
    if other:
        message["reasoning_content" if read != "reasoning_content" else "reasoning"] = other
    stored, fired = _checked(mode, message, stream)
    assert stored.strip()
    assert "field_mismatch" not in fired


@given(mode=st.sampled_from(("reasoning", "reasoning_content")), reasoning=st.text(min_size=1, max_size=60).filter(
    lambda t: t.strip() and "</think>" not in t and "<think>" not in t), answer=st.text(max_size=40))
def test_property_reasoning_left_inline_with_an_empty_read_field_is_a_mismatch(mode, reasoning, answer) -> None:  # type: ignore[no-untyped-def]
    """The other side: the read field empty and the content `<think>…</think>answer` (no parser ran)."""
    stored, fired = _checked(mode, {"content": f"<think>{reasoning}</think>{answer}"}, None)
    assert not stored.strip() and "field_mismatch" in fired


# ------------------------------------------------------------------------- the run of issue #26, live

ECHOED = "The total is 12 apples.</think>\n\nThe total is 12 apples."


def test_a_model_sampling_close_tags_does_not_pause_a_healthy_run(engine, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue #26's reproduction through the real worker and the simulator: vLLM >= 0.16 (`reasoning` field), the
    run reads `reasoning`, and every answer holds a `</think>` the model sampled (the simulator echoes `ECHO:` prompts
    as both reasoning and answer). Before the fix the run auto-paused on field_mismatch and advised `inline`."""
    from test_checks_kit import alarms, run_checked, stats
    from workerkit import make_config, records

    data = tmp_path / "echo.jsonl"
    data.write_text("".join(json.dumps({"id": f"e{i}", "messages": [
        {"role": "user", "content": f"ECHO:{i} {ECHOED}"}]}) + "\n" for i in range(40)))
    url = sim(reasoning_field="reasoning", seed=5)
    run_id, final = run_checked(engine, make_config(url, data, concurrency=4, reasoning={"mode": "reasoning"},
                                                    name="sampled-close"))
    assert final == "completed"
    recs = records(engine, run_id)
    assert len(recs) == 40 and all(r["reasoning"] and "</think>" in r["content"] for r in recs)
    st_ = stats(engine, run_id)
    assert st_["field_mismatch"]["n_fail"] == 0 and st_["field_mismatch"]["n_total"] == 40
    assert st_["think_tags_in_content"]["n_fail"] == 40
    assert "field_mismatch" not in {a["rule"] for a in alarms(engine, run_id)}
    assert not any("inline" in (a["fix"] or "") and a["rule"] == "field_mismatch" for a in alarms(engine, run_id))
