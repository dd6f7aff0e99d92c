"""Conversations regenerated turn by turn (run setting ``turns = "all"``, synthwatch.capture.turns) in an export.

Every format writes rows whose trained answer is one turn the model wrote, after the history that turn's
request carried: the model's own earlier answers (their reasoning stripped or kept, as the run sent them),
and the dataset's tool steps, which the model did not write. So:

* ``--turns last`` (the default): one row per conversation, its last turn as the answer;
* ``--turns all``: one row per regenerated turn (id ``<record id>#t<k>``), each with its own history.

In no row is anything but the answer under loss: the ``tokens`` and ``speculators`` rows put the loss mask
on the answer's ids only, and SpecForge trains only the last turn with ``train_only_last_turn = true`` (its
default trains every assistant turn of a row, the history included). A turn the model did not write is
therefore never trained. A run with ``turns = "last"`` keeps the dataset's earlier answers as the history of
its one generated answer, under the same rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from ..capture import turns as turns_mod

EXPORT_TURNS = ("last", "all")
# a stored turn's columns that replace the record's in the row of that turn
_TURN_FIELDS = ("reasoning", "content", "finish_reason", "token_ids_json", "extra_json", "usage_json",
                "logprobs_json")


def turn_rows(rec: Mapping[str, Any], which: str, history_reasoning: str) -> Iterator[Mapping[str, Any]]:
    """The record as the rows of its turns (``which``: last | all | raw): itself when it has one turn, else a
    copy per exported turn whose prompt is that turn's request history and whose answer is that turn."""
    if which == "raw" or not rec.get("turns_json"):  # raw: every stored column as stored, the turns included
        yield rec
        return
    turns = turns_mod.all_turns(dict(rec))
    prompt = orjson.loads(rec["prompt_json"])
    ks = range(len(turns)) if which == "all" else (len(turns) - 1,)
    for k in ks:
        row = dict(rec)
        row["prompt_json"] = orjson.dumps(turns_mod.history(prompt, turns, k, history_reasoning)).decode()
        for name in _TURN_FIELDS:
            row[name] = turns[k].get(name)
        if which == "all":
            row["_row_suffix"] = f"#t{k + 1}"
        yield row


def manifest_part(which: str, history_reasoning: str, run_turns: str, conversations: int) -> dict[str, Any]:
    return {
        "run_setting": run_turns,
        "history_reasoning": history_reasoning,
        "export": which,
        "conversations_with_turns": conversations,
        "rows": "one row per regenerated turn (id <record id>#t<k>)" if which == "all"
                else "one row per record: its last turn",
        "trained": "only each row's answer, a turn the model wrote; its history (the model's earlier answers, "
                   "the dataset's tool steps) is never under loss (SpecForge: train_only_last_turn = true)",
    }
