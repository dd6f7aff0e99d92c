"""Per-record checks: for each, records crafted to trip it and records that must not; settings validation."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from synthwatch.app.words import check_label
from synthwatch.check_catalog import BIT, CHECK_NAMES, DEFAULT_RULES
from synthwatch.quality.checks import (
    ChecksConfigError,
    RecordChecker,
    RecordView,
    RunContext,
    looping_period,
    parse_settings,
    with_canaries,
)
from synthwatch.quality.detection import Window
from synthwatch.quality.detection.alarms import fires, should_pause
from synthwatch.quality.token_checks import TokenJob, run_token_job

REASONING = ("Let me work through this step by step. The question asks me to compute 2 + 2. "
             "First, 2 + 2 = 4. Let me double-check: 4 - 2 = 2, which matches. So the result is 4.")
CONTENT = "The answer is **4**. Each step can be checked by reversing the operation."


def ctx(**kw: Any) -> RunContext:
    checks = kw.pop("checks", {})
    return RunContext(run_id=1, name="t", settings=parse_settings(checks), **kw)


_next_id = iter(range(1, 10**9))


def rec(**kw: Any) -> RecordView:
    base: dict[str, Any] = {"record_id": next(_next_id), "idx": 0, "status": "ok", "reasoning": REASONING,
                            "content": CONTENT, "finish_reason": "stop", "completion_tokens": 60,
                            "reasoning_tokens": None, "model": "m", "system_fingerprint": "fp1",
                            "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    base.update(kw)
    return RecordView(**base)


def failed(checker: RecordChecker, r: RecordView) -> set[str]:
    _, f, _ = checker.check(r)
    return {n for n in CHECK_NAMES if f & BIT[n]}


def applied(checker: RecordChecker, r: RecordView) -> set[str]:
    a, _, _ = checker.check(r)
    return {n for n in CHECK_NAMES if a & BIT[n]}


def test_healthy_record_trips_nothing() -> None:
    c = RecordChecker(ctx())
    assert failed(c, rec()) == set()
    assert failed(c, rec(reasoning=REASONING + " Again.", content=CONTENT + " More.")) == set()


def test_empty_reasoning() -> None:
    c = RecordChecker(ctx())
    assert "empty_reasoning" in failed(c, rec(reasoning=""))
    assert "empty_reasoning" in failed(c, rec(reasoning="  \n "))
    assert "empty_reasoning" not in failed(c, rec())
    no_expect = RecordChecker(ctx(expects=False))
    assert "empty_reasoning" not in applied(no_expect, rec(reasoning=""))


def test_empty_content() -> None:
    c = RecordChecker(ctx())
    assert "empty_content" in failed(c, rec(content=""))
    assert "empty_content" not in failed(c, rec())
    # cut by max_tokens: counted as truncated_in_reasoning, not as an empty answer
    assert "empty_content" not in failed(c, rec(content="", finish_reason="length"))


def test_both_empty_with_tokens() -> None:
    c = RecordChecker(ctx())
    _, f, det = c.check(rec(reasoning="", content="", completion_tokens=812))
    assert f & BIT["both_empty_with_tokens"] and det["both_empty_with_tokens"] == {"completion_tokens": 812}
    assert "both_empty_with_tokens" not in failed(c, rec(reasoning="", content="", completion_tokens=0))
    assert "both_empty_with_tokens" not in failed(c, rec(reasoning="", content="", completion_tokens=None))
    assert "both_empty_with_tokens" not in failed(c, rec(reasoning=""))


def test_truncated_and_truncated_in_reasoning() -> None:
    c = RecordChecker(ctx())
    assert failed(c, rec(finish_reason="length")) == {"truncated"}
    assert failed(c, rec(finish_reason="length", content="")) == {"truncated", "truncated_in_reasoning"}
    assert not failed(c, rec(finish_reason="stop")) & {"truncated", "truncated_in_reasoning"}


def test_think_tags_in_content() -> None:
    c = RecordChecker(ctx())
    _, f, det = c.check(rec(content="<think>hidden</think>The answer is 4."))
    assert f & BIT["think_tags_in_content"] and det["think_tags_in_content"]["tags"] == ["<think>", "</think>"]
    assert "think_tags_in_content" in failed(c, rec(content="reasoning</think>The answer is 4."))
    assert "think_tags_in_content" not in failed(c, rec(content="I think the answer is 4 (think tags: none)."))
    custom = RecordChecker(ctx(think_open="<reason>", think_close="</reason>"))
    assert "think_tags_in_content" in failed(custom, rec(content="x</reason>y"))
    assert "think_tags_in_content" not in failed(custom, rec(content="x</think>y"))


def test_field_mismatch() -> None:
    c = RecordChecker(ctx(mode="reasoning_content"))
    _, f, det = c.check(rec(reasoning="", unread_fields={"reasoning": REASONING}))
    assert f & BIT["field_mismatch"]
    assert det["field_mismatch"]["fields"] == ["reasoning"] and det["field_mismatch"]["mode"] == "reasoning_content"
    assert det["field_mismatch"]["chars"] == {"reasoning": len(REASONING)}
    assert "field_mismatch" in failed(c, rec(reasoning="", unread_fields={"inline": "thinking inline"}))
    assert "field_mismatch" not in failed(c, rec(reasoning="", unread_fields={"reasoning": "  \n"}))
    assert "field_mismatch" not in failed(c, rec(reasoning="", unread_fields={}))
    # the read field holds reasoning: whatever else the response carries, the run reads the right field (#26)
    assert "field_mismatch" not in failed(c, rec(unread_fields={"inline": "thinking inline"}))
    assert "field_mismatch" not in failed(c, rec(unread_fields={"reasoning": REASONING + " more"}))


def test_reasoning_tokens_without_text() -> None:
    c = RecordChecker(ctx())
    _, f, det = c.check(rec(reasoning="", reasoning_tokens=57))
    assert f & BIT["reasoning_tokens_no_text"] and det["reasoning_tokens_no_text"] == {"reasoning_tokens": 57}
    assert "reasoning_tokens_no_text" not in failed(c, rec(reasoning_tokens=57))
    assert "reasoning_tokens_no_text" not in failed(c, rec(reasoning="", reasoning_tokens=0))
    assert "reasoning_tokens_no_text" not in applied(c, rec(reasoning="", reasoning_tokens=None))


def test_repetition() -> None:
    c = RecordChecker(ctx())
    loop = REASONING + " Wait, let me recount the steps once more to be sure." * 30
    _, f, det = c.check(rec(reasoning=loop, finish_reason="length", content=""))
    assert f & BIT["repetition"] and det["repetition"]["field"] == "reasoning"
    assert det["repetition"]["period_chars"] == len(" Wait, let me recount the steps once more to be sure.")
    assert "repetition" in failed(c, rec(content=CONTENT + "!" * 500))
    assert "repetition" in failed(c, rec(content="\n".join(["| 1 | 2 | 3 |"] * 60) + "\n"))
    # not a loop: varied long text, a short repeat, a phrase repeated only twice
    varied = " ".join(f"Step {i}: {i} + {i * 3} = {i * 4}." for i in range(200))
    assert "repetition" not in failed(c, rec(reasoning=varied))
    assert "repetition" not in failed(c, rec(content="ha " * 20))
    phrase = " This sentence is long enough to matter but it appears exactly twice at the end of the text." * 2
    assert "repetition" not in failed(c, rec(content=varied[:1000] + phrase))


def test_looping_period_cost_is_bounded() -> None:
    long_loop = "abc def ghi " * 500_000  # 6 MB: only the tail is looked at
    t0 = time.perf_counter()
    assert looping_period(long_loop, 400, 3, 8000) == 12
    assert time.perf_counter() - t0 < 0.05


def test_duplicate_output() -> None:
    c = RecordChecker(ctx())
    first = rec()
    assert "duplicate_output" not in failed(c, first)
    _, f, det = c.check(rec(content="\n" + CONTENT + "  "))  # surrounding whitespace does not count
    assert f & BIT["duplicate_output"] and det["duplicate_output"] == {"same_as": first.record_id}
    assert "duplicate_output" not in failed(c, first)  # the same record again (a retried write) is not a copy
    assert "duplicate_output" not in failed(c, rec(content=CONTENT + " Different."))
    assert "duplicate_output" not in applied(c, rec(reasoning="", content="4"))  # too short to judge


def test_duplicate_tracking_is_bounded() -> None:
    c = RecordChecker(ctx(checks={"duplicate_max_tracked": 3}))
    for i in range(10):
        c.check(rec(content=f"{CONTENT} {i}"))
    assert len(c.dups) == 3


def test_canary() -> None:
    canary = {"every_n": 10, "prompts": [{"prompt": "What is 17 + 25?", "answer": "42"}]}
    c = RecordChecker(ctx(checks={"canary": canary}))
    msgs = [{"role": "user", "content": "What is 17 + 25?"}]
    assert "canary_failed" not in failed(c, rec(messages=msgs, content="The answer is **42**."))
    _, f, det = c.check(rec(messages=msgs, content="The answer is **41**."))
    assert f & BIT["canary_failed"] and "42" in det["canary_failed"]["why"]
    _, f, det = c.check(rec(messages=msgs, reasoning="", content="42"))
    assert f & BIT["canary_failed"] and det["canary_failed"]["why"] == "no reasoning"
    assert "canary_failed" not in applied(c, rec())  # not a canary prompt
    assert "canary_failed" not in applied(RecordChecker(ctx()), rec(messages=msgs, content="41"))  # canaries off


def test_server_drift() -> None:
    c = RecordChecker(ctx())
    assert "server_drift" not in failed(c, rec(system_fingerprint="vllm-0.32.0"))
    assert "server_drift" not in failed(c, rec(system_fingerprint="vllm-0.32.0"))
    changed = rec(system_fingerprint="vllm-0.33.1", idx=7)
    _, f, det = c.check(changed)
    assert f & BIT["server_drift"]
    assert det["server_drift"] == {"field": "system_fingerprint", "from": "vllm-0.32.0", "to": "vllm-0.33.1",
                                   "record_id": changed.record_id, "idx": 7, "endpoint": None}
    assert "server_drift" not in failed(c, rec(system_fingerprint="vllm-0.33.1"))
    _, f, det = c.check(rec(model="other-model", system_fingerprint="vllm-0.33.1"))
    assert det["server_drift"]["field"] == "model" and det["server_drift"]["to"] == "other-model"
    assert "server_drift" not in applied(c, rec(model=None, system_fingerprint=None))
    # two servers of different versions in one pool: each is compared with itself only
    pool = RecordChecker(ctx())
    for _ in range(3):
        assert "server_drift" not in failed(pool, rec(endpoint="a:8000", system_fingerprint="vllm-0.32.0"))
        assert "server_drift" not in failed(pool, rec(endpoint="b:8000", system_fingerprint="vllm-0.15.1"))
    assert "server_drift" in failed(pool, rec(endpoint="b:8000", system_fingerprint="vllm-0.16.0"))


def test_timeout_and_error_count_every_finished_record() -> None:
    c = RecordChecker(ctx())
    assert failed(c, rec(status="timeout", reasoning="", content="")) == {"timeout"}
    assert failed(c, rec(status="error", reasoning="", content="")) == {"error"}
    assert applied(c, rec(status="error")) == {"timeout", "error"}
    assert {"timeout", "error"} <= applied(c, rec())


def test_disabled_checks_are_not_computed() -> None:
    c = RecordChecker(ctx(checks={"disabled": ["empty_reasoning", "timeout"]}))
    assert "empty_reasoning" not in applied(c, rec(reasoning=""))
    assert "timeout" not in applied(c, rec(status="timeout"))


# ------------------------------------------------------------------------------------ tokenizer checks

DROPPING_TEMPLATE = (
    "<｜begin▁of▁sentence｜>{% for m in messages %}"
    "{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<｜Assistant｜><think></think>{{ m.content }}<｜end▁of▁sentence｜>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)


@pytest.fixture(scope="module")
def ds_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """Loaded once per module (transformers takes seconds to import); later loads hit the cache."""
    from synthwatch.tokens.tokenizer import DEEPSEEK_V4, TokenizerSpec, load_tokenizer

    template = tmp_path_factory.mktemp("tpl") / "dropping.jinja"
    template.write_text(DROPPING_TEMPLATE, encoding="utf-8")
    good = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=DEEPSEEK_V4))
    dropping = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=str(template)))
    return good, dropping


def test_template_drops_reasoning(ds_tokenizers: tuple[Any, Any]) -> None:
    good, dropping = ds_tokenizers
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    job = TokenJob(5, msgs, REASONING, CONTENT, None, template=True, count=False)
    assert run_token_job(good, job) == [(5, "template_drops_reasoning", False, {})]
    [(rid, name, bad, det)] = run_token_job(dropping, job)
    assert (rid, name, bad) == (5, "template_drops_reasoning", True) and "dropped the reasoning" in det["message"]


def test_token_count_mismatch(ds_tokenizers: tuple[Any, Any]) -> None:
    good, _ = ds_tokenizers
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    n = len(good.encode("<think>" + REASONING + "</think>" + CONTENT)) + 1  # + end of sentence
    ok = run_token_job(good, TokenJob(1, msgs, REASONING, CONTENT, n, template=False, count=True))
    assert ok == [(1, "token_count_mismatch", False, {})]
    [(_, _, bad, det)] = run_token_job(good, TokenJob(2, msgs, REASONING, CONTENT, n * 3, template=False, count=True))
    assert bad and det["usage"] == n * 3 and abs(det["retokenized"] - n) <= 2


# ------------------------------------------------------------------------------------ windows, rules, settings


def test_window_counts_the_last_n() -> None:
    w = Window(3)
    for x in (True, True, False, False):
        w.add(x)
    assert (w.fail, w.total) == (1, 3)
    w.add(False)
    assert (w.fail, w.total) == (0, 3)


def test_window_extend_is_add_in_order() -> None:
    """A flush adds its records to a window at once; the window must end as one add() per record would leave it."""
    rng = random.Random(7)
    for size in (1, 3, 50):
        one, batch = Window(size), Window(size)
        for _ in range(200):
            items = [rng.random() < 0.3 for _ in range(rng.choice((0, 1, 2, size - 1, size, size + 5, 120)))]
            for x in items:
                one.add(x)
            batch.extend(items)
            assert (batch.fail, batch.total, list(batch.buf)) == (one.fail, one.total, list(one.buf))


def test_rule_thresholds() -> None:
    er = DEFAULT_RULES["empty_reasoning"]
    assert not fires(er, 5, 19)  # too few records to judge
    assert not fires(er, 4, 100) and fires(er, 5, 100)
    # half of the window (from 50 records on) pauses: 58% empty is a broken run (#26), a few percent is a model
    # skipping thoughts on trivial prompts
    assert not should_pause(er, 49, 49) and not should_pause(er, 24, 50) and should_pause(er, 25, 50)
    assert should_pause(er, 58, 100) and not should_pause(er, 49, 100) and not should_pause(er, 10, 100)
    fm = DEFAULT_RULES["field_mismatch"]
    assert fires(fm, 1, 1) and should_pause(fm, 1, 1) and not fires(fm, 0, 100)
    to = DEFAULT_RULES["timeout"]
    assert to.window == 200 and not fires(to, 9, 200) and fires(to, 10, 200)
    # every request failing (wrong model, URL without /v1, dead port) pauses from 20 records on; an overloaded
    # server failing a tenth of its requests only raises the alarm
    for rule in (DEFAULT_RULES["error"], DEFAULT_RULES["timeout"]):
        assert rule.auto_pause and should_pause(rule, 20, 20) and should_pause(rule, 18, 20)
        assert not should_pause(rule, 19, 19) and not should_pause(rule, 17, 20) and not should_pause(rule, 20, 200)


@pytest.mark.parametrize(("raw", "named"), [
    ({"treshold": 1}, "checks.treshold: unknown key"),
    ({"rules": {"empty_reasonig": {"threshold": 0.1}}}, "unknown rule 'empty_reasonig'"),
    ({"rules": {"empty_reasoning": {"thresold": 0.1}}}, "checks.rules.empty_reasoning.thresold: unknown key"),
    ({"rules": {"timeout": {"threshold": 5}}}, "checks.rules.timeout.threshold"),
    ({"disabled": ["nope"]}, "unknown check 'nope'"),
    ({"canary": {"every_n": 1}}, "checks.canary.every_n"),
    ({"webhook": {"url": "ftp://x"}}, "checks.webhook.url"),
])
def test_bad_settings_name_the_key(raw: dict[str, Any], named: str) -> None:
    with pytest.raises(ChecksConfigError) as e:
        parse_settings(raw)
    assert named in str(e.value), str(e.value)


def test_settings_and_docs_table_agree() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text()
    for name, r in DEFAULT_RULES.items():
        line = next((ln for ln in doc.splitlines() if ln.startswith(f"| `{name}` |")), None)
        assert line is not None, f"docs/checks.md has no row for {name}"
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[3] == f"{r.threshold:g}" and cells[4] == str(r.window) and cells[5] == str(r.min_records), line
        assert cells[6] == r.severity, line
        assert cells[7] == (f"at {r.pause_threshold:g} of >= {r.pause_min_records}" if r.auto_pause else "no"), line
        assert cells[8] == check_label(name), line  # the same name in the docs as on every page


def test_canaries_are_every_nth_prompt() -> None:
    class P:
        def __init__(self, i: int) -> None:
            self.index, self.line, self.source_id, self.messages = i, i + 1, None, [{"role": "user", "content": "q"}]

    out = list(with_canaries([P(i) for i in range(10)], parse_settings({"canary": {"every_n": 4}})))
    kinds = ["c" if o.index < 0 else "d" for o in out]
    assert "".join(kinds) == "dddcdddcdddcd"
    assert [o.index for o in out if o.index < 0] == [-1, -2, -3]
    assert out[3].source_id == "synthwatch-canary:0"
    assert [o.index for o in out if o.index >= 0] == list(range(10))
    assert len(list(with_canaries([P(i) for i in range(10)], parse_settings({})))) == 10


def test_tokenizer_checks_in_a_running_worker(engine, sim, prompts, ds_tokenizers, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The hook's tokenizer thread: the template check once per run, the count check on a sample."""
    from test_checks_kit import alarms, run_checked, stats
    from workerkit import make_config, records

    url = sim(reasoning_field="reasoning", seed=14, token_ids="deepseek", ttft_ms=30)
    good = make_config(url, prompts(60), name="tok-good", concurrency=4,
                       tokenizer={"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"},
                       checks={"token_sample_every": 5})
    run_id, final = run_checked(engine, good)
    assert final == "completed"
    st = stats(engine, run_id)
    assert st["template_drops_reasoning"]["n_total"] == 1 and st["template_drops_reasoning"]["n_fail"] == 0
    assert st["token_count_mismatch"]["n_total"] >= 5 and st["token_count_mismatch"]["n_fail"] == 0
    assert alarms(engine, run_id) == []
    template = tmp_path / "dropping.jinja"
    template.write_text(DROPPING_TEMPLATE, encoding="utf-8")
    dropping = make_config(url, prompts(60, "p2.jsonl"), name="tok-drop", concurrency=4,
                           tokenizer={"name_or_path": "deepseek-v4", "chat_template": str(template)})
    run_id, final = run_checked(engine, dropping)
    [a] = alarms(engine, run_id)
    assert a["rule"] == "template_drops_reasoning" and "training loses every chain of thought" in a["fix"]
    flagged = next(r for r in records(engine, run_id) if r["id"] == a["example_record_id"])
    assert flagged["check_flags"] & BIT["template_drops_reasoning"]
    assert "template_drops_reasoning" in flagged["check_json"]
