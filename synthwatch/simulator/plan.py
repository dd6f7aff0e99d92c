"""A reply laid out for one reasoning mode (Plan), with its streamed chunks pre-serialised on first use.

Its own module so that answers.py (which caches plans on a generated answer) and token_plan.py (which builds
them from an answer's pieces) both import it without importing each other.
"""

from __future__ import annotations

import bisect
import itertools

import orjson

# One event per emitted text piece: (delta key or None when not shown, text, token ids,
# tokens counted, reasoning tokens counted). Key "" is the ``delta: {}`` chunk that vLLM sends for
# the ``</think>`` token only when return_token_ids is set.
Event = tuple[str | None, str, list[int], int, int]


def delta_json(key: str | None, text: str) -> bytes:
    if key == "tool_head":
        name, call_id = text.split("\x00", 1)
        call = {"id": call_id, "type": "function", "index": 0, "function": {"name": name}}
        return b'{"tool_calls":' + orjson.dumps([call]) + b"}"
    if key == "tool_args":
        return b'{"tool_calls":' + orjson.dumps([{"index": 0, "function": {"arguments": text}}]) + b"}"
    if key == "both":
        quoted = orjson.dumps(text)
        return b'{"reasoning":' + quoted + b',"reasoning_content":' + quoted + b"}"
    if not key:
        return b"{}"
    return b'{"' + key.encode() + b'":' + orjson.dumps(text) + b"}"


_CHUNK_HEAD = b'"choices":[{"index":0,"delta":'
_CHUNK_MID = b',"logprobs":null,"finish_reason":null,"token_ids":'
# (delta key, text) -> (delta JSON, chunk suffix without token ids); pieces repeat across replies.
_RENDERED: dict[tuple[str | None, str], tuple[bytes, bytes]] = {}


def _render(key: str | None, text: str) -> tuple[bytes, bytes]:
    hit = _RENDERED.get((key, text))
    if hit is None:
        delta = delta_json(key, text)
        hit = (delta, _CHUNK_HEAD + delta + _CHUNK_MID + b"null}]}\n\n")
        if len(text) <= 32:
            if len(_RENDERED) > 100_000:
                _RENDERED.clear()
            _RENDERED[(key, text)] = hit
    return hit


class Plan:
    """A reply laid out for one mode; the streamed chunks are pre-serialised on first use."""

    __slots__ = ("events", "mode", "with_ids", "cum_tokens", "cum_reasoning", "_stream", "logprobs", "lp_json")

    def __init__(self, events: list[Event], mode: str, with_ids: bool,
                 logprobs: list[list[dict[str, object]]] | None = None) -> None:
        self.events = events
        self.mode = mode
        self.with_ids = with_ids
        # per event, its tokens' logprobs.content entries (simulator/logprobs.py); None: the request asked for none
        self.logprobs = logprobs
        self.lp_json: list[bytes] = []  # per shown event, its chunk's "logprobs" value (set by stream())
        self.cum_tokens = list(itertools.accumulate(e[3] for e in events))
        self.cum_reasoning = list(itertools.accumulate(e[4] for e in events))
        self._stream: tuple[list[int], list[bytes], list[bytes], list[bytes]] | None = None

    def stream(self) -> tuple[list[int], list[bytes], list[bytes], list[bytes]]:
        """(indices of the events that produce a chunk, their deltas, token ids JSON, chunk suffixes)."""
        if self._stream is None:
            events, with_ids = self.events, self.with_ids
            # The </think> event (key "") produces a chunk only when token ids are returned.
            shown = [i for i, e in enumerate(events) if e[0] is not None and (e[0] or with_ids)]
            if self.logprobs is not None:
                lp = self.logprobs
                self.lp_json = [b'{"content":' + orjson.dumps(lp[i]) + b"}" for i in shown]
                deltas = [delta_json(events[i][0], events[i][1]) for i in shown]
                ids_json = [orjson.dumps(events[i][2]) if with_ids else b"null" for i in shown]
                suffixes = [
                    _CHUNK_HEAD + d + b',"logprobs":' + p + b',"finish_reason":null,"token_ids":' + j + b"}]}\n\n"
                    for d, p, j in zip(deltas, self.lp_json, ids_json, strict=True)
                ]
            elif with_ids:
                deltas = [delta_json(events[i][0], events[i][1]) for i in shown]
                ids_json = [orjson.dumps(events[i][2]) for i in shown]
                suffixes = [
                    _CHUNK_HEAD + d + _CHUNK_MID + j + b"}]}\n\n"
                    for d, j in zip(deltas, ids_json, strict=True)
                ]
            else:
                rendered = [_render(events[i][0], events[i][1]) for i in shown]
                deltas = [r[0] for r in rendered]
                suffixes = [r[1] for r in rendered]
                ids_json = [b"null"] * len(shown)
            self._stream = (shown, deltas, ids_json, suffixes)
        return self._stream

    def cut(self, max_tokens: int) -> int:
        """How many events fit in max_tokens."""
        return bisect.bisect_right(self.cum_tokens, max_tokens)

    def tokens(self, cut: int) -> tuple[int, int]:
        if cut == 0:
            return 0, 0
        return self.cum_tokens[cut - 1], self.cum_reasoning[cut - 1]
