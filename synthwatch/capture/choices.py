"""Several choices in one reply (a request with ``n = k``, docs/samples.md): each choice read as if it were the
only one, so that it becomes a record of its own, exactly as a single-sample request's reply would.

Streamed, :class:`ChoiceStreams` keeps one :class:`~.stream.StreamAccumulator` per choice index and hands each
chunk's choices to their own accumulator (as index 0: the accumulator reads one choice); a chunk without choices
(the usage chunk) goes to every accumulator without its usage, which is the request's (every choice's completion
summed, the prompt counted once). Not streamed, :func:`split_response` makes one ``chat.completion`` per choice.
Each choice's usage is then its own (:func:`choice_usage`): the request's prompt tokens, and its own completion
tokens where the reply tells them (its token ids, or vLLM's per-choice continuous usage in a stream); where it does
not, the choice's ``completion_tokens`` is left out and a problem says why. The request's usage is kept on each
choice as ``extra["top"]["request_usage"]`` (with ``n`` and the choice's index).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .reasoning import Extracted
from .stream import StreamAccumulator


def _count(usage: Any, key: str) -> int | None:
    v = usage.get(key) if isinstance(usage, dict) else None
    return v if type(v) is int and v >= 0 else None


def choice_usage(ex: Extracted, own: Any, request: Any, n: int, index: int, alone: bool) -> None:
    """Give ``ex`` (choice ``index`` of ``n`` asked for) its own usage: the request's prompt tokens, its own
    completion tokens (its ids, else ``own``: a per-choice usage the server sent; ``alone``: the only choice that
    came, whose count is the request's); the request's usage kept in ``extra``."""
    prompt = _count(request, "prompt_tokens")
    if prompt is None:
        prompt = _count(own, "prompt_tokens")
    completion = len(ex.token_ids) if ex.token_ids is not None else _count(own, "completion_tokens")
    if alone and completion is None:
        completion = _count(request, "completion_tokens")  # one choice: the request's count is its own
    usage: dict[str, Any] = {}
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    if completion is not None:
        usage["completion_tokens"] = completion
        usage["total_tokens"] = (prompt or 0) + completion
    elif request is not None:
        ex.problems.append(f"completion tokens of choice {index} of {n} unknown: the server reported only the"
                           " request's total (set request_token_ids to count each choice's ids)")
    ex.usage = usage or None
    top = ex.extra.setdefault("top", {})
    top["request_usage"] = request
    top["n"] = n
    top["choice_index"] = index


def split_response(body: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """A whole ``chat.completion`` with several choices: (index, the same body with that choice alone, as index
    0 and without the request's usage), in index order. Choices whose index is not 0 … len-1 or repeated are
    dropped (each record takes one index)."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return [(0, body)]
    by_index: dict[int, dict[str, Any]] = {}
    for pos, c in enumerate(choices):
        if not isinstance(c, dict):
            continue
        i = c.get("index", pos)
        if type(i) is not int or not 0 <= i < len(choices) or i in by_index:
            continue
        by_index[i] = c
    out = []
    for i in sorted(by_index):
        one = {k: v for k, v in body.items() if k not in ("choices", "usage")}
        one["choices"] = [{**by_index[i], "index": 0}]
        out.append((i, one))
    return out or [(0, body)]


class ChoiceStreams:
    """An n-choice stream demultiplexed: one accumulator per choice index. Quacks like a StreamAccumulator for the
    client's loop (feed, error, n_chunks, finish_reason, result) and, for the live view, like choice 0's."""

    __slots__ = ("_n_chunks", "_own_usage", "accs", "error", "n", "seen", "usage")

    def __init__(self, make: Callable[[], StreamAccumulator], n: int) -> None:
        self.n = n
        self.accs = [make() for _ in range(n)]
        self.seen: set[int] = set()  # the choice indexes that came
        self.error: dict[str, Any] | None = None
        self.usage: Any = None  # the request's (the last usage sent on a chunk without choices)
        self._own_usage: dict[int, Any] = {}  # per-choice usage on a choice's chunks (continuous usage)
        self._n_chunks = 0

    def __getattr__(self, name: str) -> Any:  # tail, chars, has_text, problems: the live view reads choice 0
        return getattr(self.accs[0], name)

    @property
    def n_chunks(self) -> int:
        return self._n_chunks

    @property
    def finish_reason(self) -> Any:
        """None while any choice that came has not finished (the stream is then incomplete)."""
        if not self.seen:
            return None
        for i in self.seen:
            if self.accs[i].finish_reason is None:
                return None
        return self.accs[min(self.seen)].finish_reason

    def feed(self, chunk: Any) -> bool:
        self._n_chunks += 1
        choices = chunk.get("choices") if type(chunk) is dict else None
        if type(choices) is not list or not choices:
            if type(chunk) is dict and chunk.get("usage") is not None:
                self.usage = chunk["usage"]
                chunk = {k: v for k, v in chunk.items() if k != "usage"}
            for acc in self.accs:
                acc.feed(chunk)
                if acc.error is not None and self.error is None:
                    self.error = acc.error
            return False
        out = False
        for c in choices:
            i = c.get("index", 0) if type(c) is dict else 0
            if type(i) is not int or not 0 <= i < self.n:  # choice 0's accumulator notes the index it ignores
                self.accs[0].feed({**chunk, "choices": [c]})
                continue
            self.seen.add(i)
            one = chunk if i == 0 and len(choices) == 1 else {**chunk, "choices": [{**c, "index": 0}]}
            u = chunk.get("usage")
            if u is not None:
                self._own_usage[i] = u  # vLLM's continuous usage: this choice's running count
            if self.accs[i].feed(one):
                out = True
            if self.accs[i].error is not None and self.error is None:
                self.error = self.accs[i].error
        return out

    def result(self) -> Extracted:
        """Choice 0's answer (or the first that came): what a failed attempt keeps as its partial text."""
        return self.results()[0][1]

    def results(self) -> list[tuple[int, Extracted]]:
        """(index, answer) of every choice that came, in index order; choice 0 alone when none came."""
        got = sorted(self.seen) or [0]
        out = []
        for i in got:
            ex = self.accs[i].result()
            choice_usage(ex, self._own_usage.get(i), self.usage, self.n, i, len(got) == 1)
            out.append((i, ex))
        return out
