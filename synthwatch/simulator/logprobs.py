"""Logprobs as vLLM's chat server sends them (``logprobs`` / ``top_logprobs`` in the request, #38 item 5).

The shape, from vLLM's ``chat_completion/serving.py`` and ``protocol.py``: ``choices[i].logprobs`` is
``{"content": [...]}`` with one entry per generated token, reasoning tokens included (vLLM's reasoning parser
splits the text, not the tokens): ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}, ...]}``. ``token`` is the token decoded, or ``token_id:N`` with ``return_tokens_as_token_ids``;
``bytes`` is ``list(token.encode("utf-8", errors="replace"))``; a logprob is at least -9999.0. The sampled token
comes first in ``top_logprobs`` (vLLM returns it with the top k), then the most likely others, at most k in all.
Streamed, each chunk carries the entries of its own tokens; a token whose chunk vLLM does not send (the
``</think>`` token when no token ids are asked for) has no entry in the stream.

The values here are made up but fixed per (token id, position), so a streamed and a non-streamed reply to the
same request carry the same numbers.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from .config import EOS_ID, THINK_CLOSE_ID, THINK_OPEN_ID

MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``: a larger ``top_logprobs`` is refused with 400."""
_SPECIAL_TEXT = {THINK_OPEN_ID: "<think>", THINK_CLOSE_ID: "</think>", EOS_ID: "<｜end▁of▁sentence｜>"}
# what the alternatives are (the simulator has no vocabulary): common words, each with its id as the simulator's
# word ids are made (token_plan.TokenIds)
_ALTERNATIVES = (" the", " a", " and", " of", " to", " is", ",", ".", " that", " we", " it", " so", " in", " 2",
                 " x", " then", "\n", " =", " answer", " not")


@dataclass(frozen=True, slots=True)
class LogprobSpec:
    top: int  # top_logprobs (0: only the chosen token's)
    as_ids: bool  # return_tokens_as_token_ids


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", errors="replace"))}


def _value(tid: int, pos: int, salt: int) -> float:
    h = zlib.crc32(b"%d:%d:%d" % (tid, pos, salt))
    return max(-(h % 4000) / 500.0, -9999.0)


def entries(events: list[Any], spec: LogprobSpec, vocab: Any) -> list[list[dict[str, Any]]]:
    """One list of ``logprobs.content`` entries per event (an event's token ids, in order). ``vocab``: the
    simulator's token_plan.TokenIds (a piece's ids, an id's text)."""
    out: list[list[dict[str, Any]]] = []
    pos = 0
    for key, text, token_ids, _, _ in events:
        row = []
        for tid in token_ids:
            if spec.as_ids:
                name = f"token_id:{tid}"
            else:
                name = _SPECIAL_TEXT.get(tid) or vocab.decode(tid)
                if name is None:  # word ids: one per piece, the piece is the token
                    name = text if key != "tool_head" else text.split("\x00", 1)[0]
            chosen = _value(tid, pos, 0) / 8  # the sampled token is usually the likely one
            item = _entry(name, chosen)
            tops = []
            if spec.top:
                tops.append(_entry(name, chosen))
                for a in range(spec.top - 1):
                    word = _ALTERNATIVES[(tid + pos + a) % len(_ALTERNATIVES)]
                    wid = vocab.ids(word)[0]
                    if wid == tid or any(t["token"] in (word, f"token_id:{wid}") for t in tops):
                        continue
                    tops.append(_entry(f"token_id:{wid}" if spec.as_ids else word,
                                       chosen - 0.5 - a - (_value(wid, pos, 1) + 8) / 8))
            item["top_logprobs"] = tops
            row.append(item)
            pos += 1
        out.append(row)
    return out
