"""Logprobs as a server sends them (OpenAI chat API, vLLM) packed into one compact record column (#38 item 5).

A reply with ``logprobs = true`` carries ``choices[0].logprobs.content``: one entry per completion token (vLLM: the
reasoning's tokens too, streamed or not), each ``{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}, ...]}``. Kept as sent that is ~300 bytes of JSON per token at ``top_logprobs = 5``; packed
it is 36 bytes (48 in base64):

- ``ids``: one int32 per token. A token id where the server gave one: ``token_id:N`` (vLLM's
  ``return_tokens_as_token_ids``), or the completion's own ids (``return_token_ids``) when they are as many as the
  entries. Otherwise ``-(1 + i)``: the token's text is entry ``i`` of ``text`` (each distinct text once), mapped
  to an id with the run's tokenizer where one is needed (the tokens export, the token view);
- ``lp``: one float16 logprob per token (~3 significant digits; vLLM's floor, -9999, reads back as -10000);
- ``top_ids`` / ``top_lp``: ``k`` of each per token, row after row, the same encoding; a missing alternative is
  id :data:`NO_ID` with logprob NaN;
- ``n``, ``k``, ``dropped`` (tokens left out at the size bound), ``v`` (the format's version).

The packed value is bounded by ``limits.max_logprobs_bytes`` (docs/limits.md): the tokens past it are left out and
the record says so. Nothing a server sends raises here: NaN, wrong types, huge arrays or entries that do not match
the completion's ids become a problem on the record (``extra_json.problems``), and what cannot be read is stored
as no logprob (NaN) or not at all.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["FORMAT_VERSION", "NO_ID", "Packed", "pack", "pack_extracted", "unpack"]

FORMAT_VERSION = 1
NO_ID = -(2**31)
"""The id of an alternative the server did not send (fewer than ``k`` for that token)."""
MAX_TOP = 20
"""Most alternatives kept per token (vLLM's default ``--max-logprobs`` and the OpenAI API's limit are 20)."""
MAX_TEXT_CHARS = 256
"""Longest token text kept in the text table (a token is a few characters; longer is not a token)."""
_I32 = (-(2**31), 2**31 - 1)
_F16_MIN = -65504.0
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Packed:
    """A record's logprobs, unpacked: ``ids[i]``/``lp[i]`` per completion token, ``top_ids[i]``/``top_lp[i]`` its
    alternatives (up to ``k``), ``text`` the token texts the negative ids point into."""

    ids: list[int]
    lp: list[float]
    top_ids: list[list[int]]
    top_lp: list[list[float]]
    text: list[str]
    k: int
    dropped: int

    def token_text(self, tid: int) -> str | None:
        """The text of an id below zero (a token the server named only by its text); None for a real id."""
        return self.text[-tid - 1] if 0 > tid > NO_ID and -tid - 1 < len(self.text) else None


def _b64(fmt: str, values: list[Any]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}{fmt}", *values)).decode("ascii")


def _un64(fmt: str, s: Any, n: int) -> list[Any]:
    raw = base64.b64decode(s, validate=True) if isinstance(s, str) else b""
    size = struct.calcsize(f"<{n}{fmt}")
    if len(raw) != size:
        raise ValueError(f"packed logprobs: {len(raw)} bytes where {size} were expected")
    return list(struct.unpack(f"<{n}{fmt}", raw))


class _Reader:
    """Entries read one by one, with their problems (distinct, few)."""

    def __init__(self, ids: list[int] | None) -> None:
        self.server_ids = ids
        self.text: dict[str, int] = {}
        self.problems: dict[str, None] = {}

    def problem(self, msg: str) -> None:
        if len(self.problems) < 10:
            self.problems[msg] = None

    def logprob(self, v: Any) -> float:
        if type(v) is int or type(v) is float:
            f = float(v)
            if math.isnan(f) or f > 0.0:
                self.problem("a logprob is NaN or above 0: stored as no logprob")
                return math.nan
            return max(f, _F16_MIN)
        if v is not None:
            self.problem(f"a logprob is {type(v).__name__}, not a number: stored as no logprob")
        return math.nan

    def token_id(self, item: Any) -> int:
        tok = item.get("token")
        if type(tok) is not str:
            self.problem("a logprobs token is not a string")
            return NO_ID
        if tok.startswith("token_id:"):
            digits = tok[9:]
            if digits.isascii() and digits.isdigit() and len(digits) <= 10 and int(digits) <= _I32[1]:
                return int(digits)
            self.problem("a logprobs token_id:N is not an id")
            return NO_ID
        if len(tok) > MAX_TEXT_CHARS:
            self.problem(f"a logprobs token of {len(tok):,} characters: left out")
            return NO_ID
        if not tok.isascii():
            tok = _SURROGATE.sub("\ufffd", tok)  # a lone surrogate is not UTF-8: no column could hold it
        i = self.text.get(tok)
        if i is None:
            i = self.text[tok] = len(self.text)
        return -1 - i


def pack(logprobs: Any, token_ids: list[int] | None, max_bytes: int, max_top: int = MAX_TOP
         ) -> tuple[str | None, list[str]]:
    """``choices[0].logprobs`` as sent -> (the packed column or None, problems). Never raises on what it reads."""
    if logprobs is None:
        return None, []
    if type(logprobs) is not dict:
        return None, [f"logprobs is {type(logprobs).__name__}, not an object: not stored"]
    content = logprobs.get("content")
    if content is None:
        return None, []
    if type(content) is not list:
        return None, [f"logprobs.content is {type(content).__name__}, not a list: not stored"]
    r = _Reader(token_ids)
    ids: list[int] = []
    lps: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    k = 0
    for item in content:
        if type(item) is not dict:
            r.problem("a logprobs.content entry is not an object: stored as no logprob")
            ids.append(NO_ID)
            lps.append(math.nan)
            tops.append([])
            continue
        ids.append(r.token_id(item))
        lps.append(r.logprob(item.get("logprob")))
        alts = item.get("top_logprobs")
        row: list[tuple[int, float]] = []
        if type(alts) is list:
            if len(alts) > max_top:
                r.problem(f"{len(alts):,} top_logprobs for one token: the first {max_top} kept")
            for a in alts[:max_top]:
                if type(a) is dict:
                    row.append((r.token_id(a), r.logprob(a.get("logprob"))))
                else:
                    r.problem("a top_logprobs entry is not an object: left out")
        elif alts is not None:
            r.problem(f"top_logprobs is {type(alts).__name__}, not a list: left out")
        k = max(k, len(row))
        tops.append(row)
    n = len(ids)
    if token_ids is not None:
        if len(token_ids) == n:
            # the server's ids are the completion's: a text token takes its id (a token_id:N that disagrees is noted)
            for i, (mine, theirs) in enumerate(zip(ids, token_ids, strict=True)):
                if mine < 0:
                    ids[i] = theirs if _I32[0] < theirs <= _I32[1] else NO_ID
                elif mine != theirs:
                    r.problem(f"logprobs token {i:,} is id {mine}, the completion's id there is {theirs}")
                    break
        else:
            r.problem(f"{n:,} logprobs entries for {len(token_ids):,} completion token ids: not aligned")
    # bound the column: per token 4 + 2 bytes, and 6 per alternative, base64 (4/3), plus the text table
    per_token = (6 + 6 * k) * 4 / 3
    text = sorted(r.text, key=r.text.__getitem__)
    fixed = 120 + sum(len(t) + 4 for t in text) * 2
    keep = n if fixed + per_token * n <= max_bytes else max(0, int((max_bytes - fixed) // per_token))
    dropped = n - keep
    if dropped:
        r.problem(f"logprobs of {n:,} tokens exceed limits.max_logprobs_bytes ({max_bytes:,} bytes): "
                  f"the first {keep:,} kept, {dropped:,} left out")
    if keep == 0:
        return None, list(r.problems)
    flat_ids: list[int] = []
    flat_lp: list[float] = []
    for row in tops[:keep]:
        flat_ids.extend(t for t, _ in row)
        flat_lp.extend(v for _, v in row)
        pad = k - len(row)
        if pad:
            flat_ids.extend([NO_ID] * pad)
            flat_lp.extend([math.nan] * pad)
    doc: dict[str, Any] = {"v": FORMAT_VERSION, "n": keep, "k": k, "ids": _b64("i", ids[:keep]),
                           "lp": _b64("e", lps[:keep])}
    if k:
        doc["top_ids"], doc["top_lp"] = _b64("i", flat_ids), _b64("e", flat_lp)
    if text:
        doc["text"] = text
    if dropped:
        doc["dropped"] = dropped
    return orjson.dumps(doc).decode(), list(r.problems)


def unpack(column: str | None) -> Packed | None:
    """The stored column read back; None when empty. Raises ValueError on a column that is not this format."""
    if not column:
        return None
    try:
        doc = orjson.loads(column)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"packed logprobs: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        raise ValueError("packed logprobs: unknown format")
    n, k = doc.get("n"), doc.get("k")
    if type(n) is not int or type(k) is not int or n < 0 or not 0 <= k <= MAX_TOP:
        raise ValueError("packed logprobs: bad sizes")
    ids = _un64("i", doc.get("ids"), n)
    lp = _un64("e", doc.get("lp"), n)
    top_ids: list[list[int]] = [[] for _ in range(n)]
    top_lp: list[list[float]] = [[] for _ in range(n)]
    if k:
        fi, fl = _un64("i", doc.get("top_ids"), n * k), _un64("e", doc.get("top_lp"), n * k)
        for i in range(n):
            row = [(t, v) for t, v in zip(fi[i * k:(i + 1) * k], fl[i * k:(i + 1) * k], strict=True) if t != NO_ID]
            top_ids[i] = [t for t, _ in row]
            top_lp[i] = [v for _, v in row]
    text = doc.get("text") or []
    if not isinstance(text, list) or not all(isinstance(t, str) for t in text):
        raise ValueError("packed logprobs: bad text table")
    dropped = doc.get("dropped", 0)
    return Packed(ids, lp, top_ids, top_lp, text, k, dropped if type(dropped) is int else 0)


def pack_extracted(ex: Any, max_bytes: int) -> None:
    """Move a reply's ``choices[0].logprobs`` (kept by capture in ``ex.extra["choice"]``) into ``ex.logprobs``,
    packed; problems onto ``ex.problems``. Never raises (a failure is the record's problem, not the worker's)."""
    choice = ex.extra.get("choice") if isinstance(ex.extra, dict) else None
    if not isinstance(choice, dict) or choice.get("logprobs") is None:
        return  # vLLM sends "logprobs": null when none were asked: kept as sent (which keys a server sends)
    raw = choice.pop("logprobs")
    if not choice:
        ex.extra.pop("choice", None)
    try:
        ex.logprobs, problems = pack(raw, ex.token_ids, max_bytes)
    except Exception as exc:  # a case nobody foresaw: the record keeps its text, without logprobs
        ex.logprobs, problems = None, [f"logprobs not stored: {type(exc).__name__}"]
    ex.problems.extend(problems)
