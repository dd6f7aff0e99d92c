"""A record's logprobs (sampling.logprobs, #38 item 5) aligned to the completion ids of its tokens row.

A tokens row gets ``completion_logprobs``: one float (or null) per completion token, ``completion_logprobs[i]``
being the logprob of ``input_ids[prompt_len + i]``; and, with ``top_logprobs``, ``completion_top_ids`` and
``completion_top_logprobs``: per completion token its alternatives' ids and logprobs (the sampled token first,
as vLLM sends them). A token the server gave no logprob for (vLLM does not stream the ``</think>`` token without
``return_token_ids``; a template's end-of-turn token the model never sampled) is null there.

The stored entries name their token by id (vLLM's ``token_id:N``, or the completion's own ids) or by text; a text
is mapped to an id with the export's tokenizer (the run's) when it encodes to exactly one id. The stored ids are
then matched to the row's completion ids (equal runs of ids, in order), so a value lands only on the token it
belongs to.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from ..capture.logprobs import NO_ID, Packed, unpack

MAX_ALIGN = 200_000
"""Most tokens aligned with a diff when the stored ids and the row's differ in length (beyond: by position only
where the ids agree)."""


def _id_of(packed: Packed, tid: int, lt: Any, cache: dict[str, int]) -> int:
    if tid >= 0 or tid == NO_ID:
        return tid
    text = packed.token_text(tid)
    if text is None or lt is None:
        return NO_ID
    hit = cache.get(text)
    if hit is None:
        try:
            ids = lt.tok.encode(text, add_special_tokens=False)
        except Exception:  # a tokenizer that refuses a text: the token stays unnamed
            ids = []
        hit = cache[text] = ids[0] if len(ids) == 1 else NO_ID
    return hit


def _num(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


def aligned(rec: Mapping[str, Any], completion_ids: list[int], lt: Any = None, *, with_text: bool = False
            ) -> dict[str, Any]:
    """The row's logprob fields (empty when the record has none); never raises on a stored value. ``with_text``
    (the token view): ``completion_top_text`` too, the stored text of each alternative the server named by text."""
    try:
        packed = unpack(rec.get("logprobs_json"))
    except ValueError:
        return {}
    if packed is None:
        return {}
    cache: dict[str, int] = {}
    ids = [_id_of(packed, t, lt, cache) for t in packed.ids]
    n = len(completion_ids)
    at: list[int | None] = [None] * n  # completion position -> index into the stored entries
    if ids == completion_ids[: len(ids)]:
        for i in range(len(ids)):
            at[i] = i
    elif len(ids) * n <= MAX_ALIGN * 50:
        matcher = difflib.SequenceMatcher(None, ids, completion_ids, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            for j in range(size):
                at[b + j] = a + j
    lps = [None if i is None else _num(packed.lp[i]) for i in at]
    out: dict[str, Any] = {"completion_logprobs": lps}
    if packed.k:
        out["completion_top_ids"] = [
            None if i is None else [_id_of(packed, t, lt, cache) for t in packed.top_ids[i]] for i in at]
        out["completion_top_logprobs"] = [None if i is None else [_num(v) for v in packed.top_lp[i]] for i in at]
        if with_text:
            out["completion_top_text"] = [None if i is None else [packed.token_text(t) for t in packed.top_ids[i]]
                                          for i in at]
    return out
