"""Reasoning capture from a stream: chat.completion.chunk objects accumulated into the same Extracted a
whole response gives (reasoning.py reads the fields; this keeps the deltas, in order, as the server sent them)."""

from __future__ import annotations

from typing import Any

from .reasoning import (
    FIELD_SOURCES,
    KNOWN_CHOICE_KEYS,
    KNOWN_TOP_KEYS,
    MISSING,
    Extracted,
    Problems,
    check_mode,
    content_parts,
    copy2,
    details_text,
    int_list,
    opt_str,
    resolve,
    thinking_text,
    tname,
)
from .safety import check_usage

# --------------------------------------------------------------------------------------------
# streaming


class StreamAccumulator:
    """Accumulates parsed ``chat.completion.chunk`` objects; :meth:`result` gives the Extracted.

    ``feed`` is the per-chunk hot path: a few dict lookups and one list append for the usual
    chunk (one choice, a delta with one known string key). It never raises.
    """

    __slots__ = (
        "_choice_x",
        "_content",
        "_delta_x",
        "_delta_x_str",
        "_details",
        "_finish",
        "_fp",
        "_id",
        "_model",
        "_n",
        "_pieces",
        "_problems",
        "_prompt_token_ids",
        "_reasoning_ids",
        "_shape",
        "_shape_x",
        "_token_ids",
        "_top_x",
        "_usage",
        "error",
        "mode",
        "prefilled_open",
        "think_close",
        "think_open",
    )

    def __init__(
        self,
        mode: str = "auto",
        think_open: str = "<think>",
        think_close: str = "</think>",
        prefilled_open: bool = False,
    ) -> None:
        check_mode(mode)
        self.mode = mode
        self.think_open = think_open
        self.think_close = think_close
        self.prefilled_open = prefilled_open
        self._n = 0
        self._content: list[str] = []
        # string-valued delta keys read on the fast path -> their pieces
        self._pieces: dict[str, list[str]] = {
            "content": self._content,
            "reasoning": [],
            "reasoning_content": [],
            "thinking": [],
        }
        self._details: list[str] = []
        self._finish: Any = None
        self._usage: Any = None
        self._token_ids: list[Any] | None = None
        self._reasoning_ids = 0  # ids that came in chunks whose delta carried a reasoning field
        self._prompt_token_ids: Any = None
        self._id: Any = None
        self._model: Any = None
        self._fp: Any = None
        self._top_x: dict[str, Any] = {}
        # The top-level keys of the last chunk with unknown keys (and no error), and those unknown keys: a server
        # sends the same layout in every chunk (vLLM: prompt_text), so a repeat reads just those keys' values.
        self._shape: frozenset[str] = frozenset()
        self._shape_x: tuple[str, ...] = ()
        self._choice_x: dict[str, Any] = {}
        self._delta_x: dict[str, Any] = {}
        self._delta_x_str: dict[str, list[str]] = {}
        # the error object when a chunk was ``{"error": {...}}`` (HTTP 200 with an error body); a plain attribute, not a
        # property: the client asks after every chunk
        self.error: dict[str, Any] | None = None
        self._problems = Problems()

    @property
    def n_chunks(self) -> int:
        return self._n

    @property
    def problems(self) -> list[str]:
        return self._problems.as_list()

    @property
    def usage(self) -> Any:
        """The last usage object the server sent so far (vLLM's continuous_usage_stats: one in every chunk)."""
        return self._usage

    @property
    def finish_reason(self) -> Any:
        return self._finish

    def feed(self, chunk: Any) -> bool:
        """Add one parsed chunk; True if it carried output text (reasoning, content, tool calls)."""
        self._n += 1
        if not self._n & 255:
            self._compact()
        if type(chunk) is not dict:
            self._problems.add(f"chunk is {tname(chunk)}, not an object")
            return False
        M = MISSING
        # Usual layout: exactly id, object, created, model, choices -> no unknown key, nothing else
        # to read. Anything else takes the general path (unknown keys, usage, fingerprint, ...).
        if (
            len(chunk) == 5
            and "object" in chunk
            and "created" in chunk
            and (v := chunk.get("id", M)) is not M
            and (m := chunk.get("model", M)) is not M
            and (choices := chunk.get("choices", M)) is not M
        ):
            if v is not None:
                self._id = v
            if m is not None:
                self._model = m
        else:
            keys = chunk.keys()
            if keys == self._shape:  # unknown keys seen in the last chunk, each already in _top_x
                top_x = self._top_x
                for k in self._shape_x:
                    v = chunk[k]
                    if v is not None:
                        top_x[k] = v
            elif not (keys <= KNOWN_TOP_KEYS) and self._top_slow(chunk):
                return False
            v = chunk.get("id")
            if v is not None:
                self._id = v
            v = chunk.get("model")
            if v is not None:
                self._model = v
            v = chunk.get("system_fingerprint")
            if v is not None:
                self._fp = v
            v = chunk.get("usage")
            if v is not None:
                self._usage = v
            v = chunk.get("prompt_token_ids")
            if v is not None:
                self._prompt_token_ids = v
            choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1 or type(c := choices[0]) is not dict:
            c = self._pick_choice(chunk, choices)
            if c is None:
                return False
        # the choice, read here rather than in a method of its own: one Python call fewer per chunk
        idx = c.get("index", M)
        if idx and idx is not M:  # another choice of an n > 1 request
            self._problems.add(f"choice index {idx!r} ignored: only index 0 is read")
            return False
        delta = c.get("delta", M)
        fr = c.get("finish_reason", M)
        tids = c.get("token_ids", M)
        lp = c.get("logprobs", M)
        if (idx is not M) + (delta is not M) + (fr is not M) + (tids is not M) + (lp is not M) != len(c):
            self._choice_slow(c)
        if fr is not None and fr is not M:
            self._finish = fr
        if tids is not None and tids is not M:
            if type(tids) is list:
                t = self._token_ids
                if t is None:
                    self._token_ids = list(tids)
                else:
                    t.extend(tids)
                # the ids of a reasoning chunk are reasoning tokens (vLLM sends the </think> token in a chunk of its
                # own, ``delta: {}``): a count from ids that needs no tokenizer
                if type(delta) is dict and ("reasoning_content" in delta or "reasoning" in delta
                                            or "thinking" in delta or "reasoning_details" in delta):
                    self._reasoning_ids += len(tids)
            else:
                self._problems.add(f"choices[0].token_ids is {tname(tids)}, not a list")
        if lp is not None:
            if lp is not M:
                self._merge_logprobs(lp)
        elif "logprobs" not in self._choice_x:
            self._choice_x["logprobs"] = None
        if type(delta) is not dict:
            if "message" in c:
                self._problems.add("choices[0] has 'message' instead of 'delta' in a stream")
            else:
                self._problems.add(
                    f"choices[0].delta is {tname(None if delta is M else delta)}, not an object"
                )
            return False
        out = False
        pieces = self._pieces
        for k in delta:
            v = delta[k]
            lst = pieces.get(k)
            if lst is not None:
                if type(v) is str:
                    lst.append(v)
                    if v:
                        out = True
                elif v is not None and self._delta_slow(k, v):
                    out = True
            elif self._delta_slow(k, v):
                out = True
        return out

    # -- slow paths ----------------------------------------------------------------------------

    def _top_slow(self, chunk: dict[str, Any]) -> bool:
        """Unknown top-level keys; True when the chunk is an error object to skip entirely."""
        err = chunk.get("error")
        if err is not None:
            self.error = err if type(err) is dict else {"message": str(err)}
            if "choices" not in chunk:
                return True
        top_x = self._top_x
        unknown = chunk.keys() - KNOWN_TOP_KEYS
        for k in unknown:
            if k == "error":
                continue
            v = chunk[k]
            if v is not None or k not in top_x:
                top_x[k] = v
        if err is None and "error" not in chunk:  # an error chunk always takes this path
            self._shape, self._shape_x = frozenset(chunk.keys()), tuple(unknown)
        return False

    def _pick_choice(self, chunk: dict[str, Any], choices: Any) -> dict[str, Any] | None:
        """The choice to read when ``choices`` is not one object (None: nothing to read; problems noted)."""
        if type(choices) is list:
            if not choices:
                return None  # the usage chunk
            chosen = None
            for c in choices:
                if type(c) is dict and not c.get("index"):
                    chosen = c
                    break
            if chosen is None:
                if all(type(c) is dict for c in choices):
                    idx = [c.get("index") for c in choices]
                    self._problems.add(
                        f"choice index {idx[0] if len(idx) == 1 else idx!r} ignored: only index 0 is read"
                    )
                else:
                    self._problems.add("choices[0] is not an object")
                return None
            if len(choices) > 1:
                self._problems.add(f"{len(choices)} choices in one chunk: only index 0 is read")
            return chosen
        if choices is None or choices is MISSING:
            if "choices" not in chunk:
                self._problems.add("chunk without 'choices'")
            return None
        self._problems.add(f"choices is {tname(choices)}, not a list")
        return None

    def _choice_slow(self, c: dict[str, Any]) -> None:
        choice_x = self._choice_x
        for k in c:
            if k not in KNOWN_CHOICE_KEYS and k != "logprobs":
                v = c[k]
                if v is not None or k not in choice_x:
                    choice_x[k] = v

    def _merge_logprobs(self, lp: Any) -> None:
        cur = self._choice_x.get("logprobs")
        if type(lp) is not dict or type(cur) is not dict:
            self._choice_x["logprobs"] = copy2(lp)  # own lists: they are extended later
            return
        for k, v in lp.items():
            old = cur.get(k)
            if type(v) is list and type(old) is list:
                old.extend(v)
            elif v is not None:
                cur[k] = list(v) if type(v) is list else v

    def _delta_slow(self, k: str, v: Any) -> bool:
        """A delta key off the fast path. True if it carried output text."""
        if k == "role":
            return False
        if v is None:  # an unknown key sent as null: remember that it was there
            if k != "reasoning_details" and k not in self._delta_x and k not in self._delta_x_str:
                self._delta_x[k] = None
            return False
        if k == "reasoning_details":
            t = details_text(v, self._problems)
            if t:
                self._details.append(t)
                return True
            return False
        if k == "thinking":
            t = thinking_text(v, self._problems)
            if t:
                self._pieces["thinking"].append(t)
                return True
            return False
        if k == "content":
            if type(v) is list:
                th: list[str] = []
                t = content_parts(v, self._problems, th)
                self._content.append(t)
                if th:
                    self._pieces["thinking"].extend(th)
                return bool(t) or any(th)
            self._problems.add(f"delta.content is {tname(v)}, not a string")
            return False
        if k in self._pieces:  # reasoning / reasoning_content with a non-string value
            self._problems.add(f"delta.{k} is {tname(v)}, not a string")
            return False
        if k == "tool_calls":
            calls = self._delta_x.get("tool_calls")
            if type(calls) is not list:
                calls = self._delta_x["tool_calls"] = []
            if type(v) is list:
                calls.extend(v)
                return bool(v)
            calls.append(v)
            return True
        if type(v) is str:
            lst = self._delta_x_str.get(k)
            if lst is None:
                lst = self._delta_x_str[k] = []
            lst.append(v)
            return bool(v)
        self._delta_x[k] = v
        return False

    # -- reading while the stream runs (synthwatch.quality.inflight, the live view) --------------

    def tail(self, key: str, n: int) -> str:
        """The last ``n`` characters sent so far in one delta field (``content``, ``reasoning``,
        ``reasoning_content``, ``thinking``, ``reasoning_details``): pieces read from the end, so the cost is
        that of the characters asked for, never of the whole text."""
        lst = self._details if key == "reasoning_details" else self._pieces.get(key)
        if not lst or n <= 0:
            return ""
        # the pieces after the first are at most 255 short ones (compacted every 256 chunks): joined in C, where a walk
        # over them in Python cost ~10 us per call at the in-flight loop detector's 8,000 characters (#36 item 5);
        # the first piece (the compacted text so far) is only sliced
        head = lst[0]
        if len(lst) == 1:
            rest = ""
        else:
            rest = lst[1] if len(lst) == 2 else "".join(lst[1:])
            if len(rest) >= n:
                return rest[-n:]
        need = n - len(rest)
        return (head[-need:] if len(head) > need else head) + rest

    def chars(self, key: str) -> int:
        """Characters sent so far in one delta field (pieces are compacted every 256 chunks: a short sum)."""
        lst = self._details if key == "reasoning_details" else self._pieces.get(key)
        return sum(map(len, lst)) if lst else 0

    def has_text(self, key: str) -> bool:
        """Has this field carried any character that is not whitespace yet?"""
        lst = self._details if key == "reasoning_details" else self._pieces.get(key)
        if not lst:
            return False
        return any(p and not p.isspace() for p in lst)

    # -- result --------------------------------------------------------------------------------

    def _compact(self) -> None:
        # One str object per token costs ~70 bytes each; 2,048 long streams held ~2 GB that way.
        for lst in (*self._pieces.values(), self._details):
            if len(lst) > 1:
                lst[:] = ["".join(lst)]

    def result(self) -> Extracted:
        """The accumulated answer so far (may be called more than once; feeding may go on)."""
        problems = self._problems
        pieces = self._pieces
        texts = {
            "reasoning": "".join(pieces["reasoning"]),
            "reasoning_content": "".join(pieces["reasoning_content"]),
            "reasoning_details": "".join(self._details),
            "thinking": "".join(pieces["thinking"]),
        }
        content = "".join(self._content)
        finish_reason = opt_str(self._finish, "finish_reason", problems)
        sent_content = content
        reasoning, content, source, unread, dups = resolve(
            texts, content, finish_reason, self.mode, self.think_open, self.think_close, self.prefilled_open
        )
        usage = self._usage
        if usage is not None and type(usage) is not dict:
            problems.add(f"usage is {tname(usage)}, not an object")
            usage = None
        if usage is not None:
            check_usage(usage, problems)
        extra: dict[str, dict[str, Any]] = {}
        if self._top_x:
            extra["top"] = dict(self._top_x)
        if self._choice_x:
            extra["choice"] = {k: copy2(v) for k, v in self._choice_x.items()}
        if self._delta_x or self._delta_x_str:
            delta_x = dict(self._delta_x)
            calls = delta_x.get("tool_calls")
            if type(calls) is list:
                delta_x["tool_calls"] = list(calls)
            for k, lst in self._delta_x_str.items():
                delta_x[k] = "".join(lst)
            extra["delta"] = delta_x
        token_ids = int_list(self._token_ids, "choices[0].token_ids", problems)
        return Extracted(
            reasoning=reasoning,
            content=content,
            content_was_null=not self._content,
            reasoning_source=source,
            finish_reason=finish_reason,
            usage=usage,
            token_ids=list(token_ids) if token_ids is not None else None,
            prompt_token_ids=int_list(self._prompt_token_ids, "prompt_token_ids", problems),
            response_id=opt_str(self._id, "id", problems),
            model=opt_str(self._model, "model", problems),
            system_fingerprint=opt_str(self._fp, "system_fingerprint", problems),
            extra=extra,
            unread_fields=unread,
            duplicate_fields=dups,
            n_chunks=self._n,
            problems=problems.as_list(),
            raw_content=None if content == sent_content else sent_content,
            reasoning_ids=self._reasoning_ids if token_ids is not None and source in FIELD_SOURCES else None,
        )
