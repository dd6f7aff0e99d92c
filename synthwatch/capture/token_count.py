"""Reasoning tokens counted from a completion's token ids: the ids before the think-close token.

vLLM's ``deepseek_r1`` parser reports ``reasoning_tokens: 0`` (#29), and a text-length share of the completion is
only an estimate; where the server returned the ids and the run's tokenizer names the think tags' ids, the split
is exact. Pure functions: the worker calls them once per reply (synthwatch.workers.client)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .safety import MAX_COUNT


def find(ids: list[int], needle: Sequence[int], start: int = 0, stop: int | None = None) -> int:
    """Index of the first run of ``needle`` in ``ids[start:stop]``, -1 when absent (a tag may be several ids)."""
    n = len(needle)
    end = len(ids) if stop is None else stop
    if not n:
        return -1
    first, rest = needle[0], list(needle)
    i = start
    while i + n <= end:
        try:
            i = ids.index(first, i, end - n + 1)
        except ValueError:
            return -1
        if n == 1 or ids[i:i + n] == rest:
            return i
        i += 1
    return -1


def reasoning_from_ids(ids: list[int], open_ids: Sequence[int], close_ids: Sequence[int], reasoning: str,
                       content: str) -> int | None:
    """How many of the completion ``ids`` are reasoning: those before the first think-close, after a think-open
    the completion itself wrote (a template that prefills ``<think>`` puts it in the prompt). Without a
    think-close: every id after any think-open when the reply has reasoning and no content (cut while
    thinking), 0 when it has no reasoning text; None when both texts are there but no close id is (the tags are
    not the tokenizer's, so the ids cannot be split)."""
    if not close_ids:
        return None
    end = find(ids, close_ids)
    if end < 0:
        if reasoning and not content:
            o = find(ids, open_ids) if open_ids else -1
            return len(ids) - (o + len(open_ids) if o >= 0 else 0)
        if not reasoning:
            return 0
        return None
    start = 0
    o = find(ids, open_ids, 0, end) if open_ids else -1
    if o >= 0:
        start = o + len(open_ids)
    return end - start


def count_in(usage: Any, key: str, sub: str | None = None) -> int | None:
    """A token count of a usage object (``usage[key]`` or ``usage[key][sub]``), None when absent or impossible
    (outside 0..MAX_COUNT: capture recorded it as a problem; it is not a number to add up)."""
    if not isinstance(usage, dict):
        return None
    v = usage.get(key)
    if sub is not None:
        v = v.get(sub) if isinstance(v, dict) else None
    return v if type(v) is int and 0 <= v <= MAX_COUNT else None


def completion_count(ex: Any) -> tuple[int, int, bool]:
    """(prompt, completion, completion counted by us): the server's usage where it reported it; else the
    completion's ids, else the stream's chunks (about one token each), counted here: an estimate."""
    usage = (ex.usage or {}) if ex is not None else {}
    prompt = count_in(usage, "prompt_tokens") or 0
    reported = count_in(usage, "completion_tokens")
    if reported is not None or ex is None:
        return prompt, reported or 0, False
    ids = ex.token_ids
    return prompt, len(ids) if ids is not None else ex.n_chunks or 0, True


PROMPT_BYTES_PER_TOKEN = 4
"""A failed attempt's prompt without a count from the server: its request body's bytes over this (an estimate)."""


def billed_tokens(ex: Any, body_bytes: int) -> tuple[int, int, int]:
    """(prompt, completion, the estimated part of the two) a provider bills for one attempt.

    An attempt with no reply (refused, connection failed, an error status) generated nothing: 0. One that
    answered, ok or not (a stream that timed out or dropped half-way): the server's usage where it reported it;
    else the prompt's ids, or the request body's bytes / 4 (an estimate), and the completion's ids, or its
    stream's chunks (an estimate)."""
    if ex is None:
        return 0, 0, 0
    usage = ex.usage
    est = 0
    prompt = count_in(usage, "prompt_tokens")
    completion = count_in(usage, "completion_tokens")
    if completion is None:
        if ex.token_ids is not None:
            completion = len(ex.token_ids)
        else:
            completion = ex.n_chunks or 0
            est += completion
    if prompt is None:
        if ex.prompt_token_ids is not None:
            prompt = len(ex.prompt_token_ids)
        elif completion or ex.reasoning or ex.content:
            prompt = -(-body_bytes // PROMPT_BYTES_PER_TOKEN)
            est += prompt
        else:
            prompt = 0  # a reply that generated nothing (an error body): nothing billed
    return prompt, completion, est


REASONING_SOURCES = ("ids", "usage", "none", "estimate")
"""Where a record's ``reasoning_tokens`` comes from (``record.reasoning_tokens_source``), best first."""


def reasoning_count(ex: Any, completion: int) -> tuple[int, str]:
    """(reasoning tokens, their source) of a reply whose completion is ``completion`` tokens:

    - ``ids``: counted from the token ids (the stream's reasoning chunks, or the ids before the think-close id of
      the run's tokenizer: :func:`reasoning_from_ids`);
    - ``usage``: the server's ``completion_tokens_details.reasoning_tokens`` (vLLM's deepseek_r1 parser reports
      0 for a reply that has reasoning: that 0 is not believed);
    - ``none``: no reasoning text, 0;
    - ``estimate``: the completion split in proportion to the text lengths."""
    if ex is None:
        return 0, "none"
    if ex.reasoning_ids is not None:
        return min(ex.reasoning_ids, completion), "ids"
    rl = len(ex.reasoning)
    reported = count_in(ex.usage, "completion_tokens_details", "reasoning_tokens")
    if reported is not None and (reported > 0 or not rl):
        return min(reported, completion), "usage"
    if not rl:
        return 0, "none"
    cl = len(ex.content)
    return round(completion * rl / (rl + cl)), "estimate"
