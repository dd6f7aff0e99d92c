"""Export presets: files exactly as SpecForge's and speculators' current readers take them.

``synthwatch export RUN --for specforge`` / ``--for speculators`` (the formats ``specforge`` and
``speculators``). Each preset says, in :data:`PRESETS` and in the manifest, which trainer release it was
checked against (by running that trainer's own readers: ``./dev compat``, docs/compat.md), the reader and
the trainer settings to use, and its ``<think>``/EOS conventions. The facts come from the trainers'
sources; the code is ours.

- ``specforge``: the rows SpecForge's ``scripts/regenerate_train_data.py`` writes and its
  ``scripts/validate_regenerated_data.py`` accepts: ``{"id", "conversations": [...], "status": "success"}``
  with the answer's ``reasoning_content``. Rows its validator would reject (an empty message, a think
  marker left in the text, roles out of order) are left out and counted under ``specforge:...``.
- ``speculators``: the rows speculators' ``regenerate-responses`` writes, which its ``prepare-data``
  passes through: ``input_ids = prompt ids + completion ids`` and ``loss_mask`` 0 over the prompt, 1
  over the completion, with ``id``/``primary_id``/``metadata``. The server's ids when stored, else the
  record re-tokenized as generated (generation prompt + answer + EOS when it stopped).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from .plan import ExportPlan

THINK_MARKERS = ("<think>", "</think>")


@dataclass(frozen=True)
class Preset:
    name: str
    trainer: str
    package: str
    version: str
    source_commit: str | None
    """The repository commit whose sources match the wheel's readers, when one was checked."""
    reader: str
    settings: dict[str, Any]
    conventions: dict[str, str]
    needs_token_ids: bool
    notes: list[str] = field(default_factory=list)

    def manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "trainer": self.trainer,
            "checked_against": {"package": self.package, "version": self.version,
                                "source_commit": self.source_commit, "how": "./dev compat (docs/compat.md)"},
            "reader": self.reader,
            "settings": self.settings,
            "conventions": self.conventions,
            "notes": self.notes,
        }


PRESETS: dict[str, Preset] = {
    "specforge": Preset(
        name="specforge",
        trainer="SpecForge (sgl-project/SpecForge)",
        package="specforge",
        version="0.2.0",
        source_commit="a6b6b02",
        reader="specforge.data.preprocessing.build_eagle3_dataset through specforge.data.prompt_builder."
               "prepare_prompt_tasks (config data.train_data_path = this JSONL); "
               "scripts/validate_regenerated_data.py accepts every row",
        settings={
            "data.train_data_path": "<this file>",
            "data.chat_template": "a registry entry with parser_type 'thinking', for DeepSeek 'deepseek-v32' "
                                  "(ThinkingParser keeps reasoning_content; 'deepseek-v3' deletes it and adds "
                                  "the system prompt 'You are a helpful assistant.')",
            "tokenizer chat template": "the target tokenizer's own HF chat template renders the rows: it must "
                                       "render the last assistant turn's reasoning_content (DeepSeek-R1's drops "
                                       "it; synthwatch's deepseek-v4 template keeps it)",
            "data.train_only_last_turn": True,
        },
        conventions={
            "loss": "SpecForge masks from after the assistant header to the end-of-turn token: <think>, "
                    "reasoning, </think>, content and EOS are all under loss",
            "think": "not written in the text: the template writes <think>…</think> around reasoning_content",
            "eos": "kept (the template's end-of-turn token, under loss); SpecForge's template adds it to truncated "
                   "rows too, which the model never wrote: the export counts them "
                   "(template_adds_unwritten_tokens) and warns (the default exclusions leave them out)",
            "earlier turns": "a row's earlier assistant turns are its history (the dataset's answers with turns = "
                             "last, the model's own with turns = all) and are never trained with "
                             "train_only_last_turn = true: the row's answer is always a turn the model wrote",
        },
        needs_token_ids=False,
        notes=["SpecForge's validator accepts only user/assistant (and a leading system) turns with non-empty "
               "string content: rows without tools that break it are left out (specforge:conversation); rows "
               "with tools (tool turns, an answer that is only a tool call) are outside it and are checked "
               "against the turn order its reader keeps instead"],
    ),
    "speculators": Preset(
        name="speculators",
        trainer="speculators (vllm-project/speculators)",
        package="speculators",
        version="0.9.0",
        source_commit=None,  # read in the 0.9.0 wheel itself: the repository snapshot c05b95b predates it
        reader="speculators prepare-data --data <this .jsonl> (pre-tokenized rows pass through; no "
               "--render-endpoint needed), then its training loader (speculators.train.data.ArrowDataset on "
               "the prepared directory)",
        settings={
            "prepare-data --data": "<this file> (.jsonl: its CLI reads only .json/.jsonl)",
            "prepare-data --render-endpoint": "not needed: rows carry input_ids and loss_mask",
        },
        conventions={
            "loss": "0 over the prompt ids, 1 over the completion ids, as speculators' regenerate-responses "
                    "builds them",
            "think": "a prefilled <think> (and newline) is part of the prompt, not under loss; a <think> the "
                     "model wrote itself is under loss; re-tokenized rows carry a </think> only when the model wrote "
                     "one (an answer follows its reasoning), never for a reply that stopped inside its reasoning",
            "eos": "kept, under loss, when the reply stopped by itself (finish_reason 'stop'); absent when it "
                   "was cut (finish_reason 'length')",
            "earlier turns": "part of the prompt ids, mask 0; with turns = all and export --turns all each turn the "
                             "model wrote is a row of its own (id <record id>#t<k>_gen0)",
        },
        needs_token_ids=True,
    ),
}


# ------------------------------------------------------------------------------- SpecForge's rules


def specforge_conversation_error(messages: Any) -> str | None:
    """Why SpecForge's regenerated-data validator rejects these conversations, or None.

    The rules its ``validate_regenerated_data.py`` applies (written from its source, SpecForge 0.2.0):
    a non-empty list of objects whose ``content`` is a non-empty string; system turns only before the
    first user turn; otherwise strictly alternating user, assistant, ... starting with user; at least one
    user turn; ending with an assistant turn; every assistant's ``reasoning_content`` a string or null.
    """
    if not isinstance(messages, list) or not messages:
        return "conversations must be a non-empty list"
    expected = "user"
    saw_user = False
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"message {i} must be an object"
        content = m.get("content")
        if not isinstance(content, str) or not content.strip():
            return f"message {i} content must be a non-empty string"
        role = m.get("role")
        if role == "system" and not saw_user:
            continue
        if role not in ("user", "assistant"):
            return f"message {i} has unsupported role {role!r}"
        if role != expected:
            return f"message {i} expected role {expected!r}, got {role!r}"
        if role == "assistant":
            reasoning = m.get("reasoning_content")
            if reasoning is not None and not isinstance(reasoning, str):
                return f"assistant message {i} reasoning_content must be a string or null"
        saw_user = True
        expected = "assistant" if role == "user" else "user"
    if not saw_user:
        return "conversation has no user message"
    if messages[-1].get("role") != "assistant":
        return "conversation must end with an assistant message"
    return None


def specforge_row_error(row: Mapping[str, Any]) -> str | None:
    """Why SpecForge's validator rejects this row (id, status, conversations), or None."""
    rid = row.get("id")
    if not isinstance(rid, str) or not rid.strip():
        return "id must be a non-empty string"
    if row.get("status") != "success":
        return "status must be 'success'"
    return specforge_conversation_error(row.get("conversations"))


def has_think_marker(text: str) -> bool:
    lowered = text.lower()
    return any(t in lowered for t in THINK_MARKERS)


# -------------------------------------------------------------------------------------------- rows


def row_specforge(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    from ..capture import tool_calls
    from ..tokens.render import prompt_tools
    from . import plan as ex

    reasoning = rec.get("reasoning") or ""
    content = rec.get("content") or ""
    stored = orjson.loads(rec["prompt_json"])
    tools = prompt_tools(stored)
    turns: list[dict[str, Any]] = []
    for m in ex.normalize_messages(stored):
        turn: dict[str, Any] = {"role": m.get("role"), "content": ex.text_content(m.get("content"))}
        turn.update({k: m[k] for k in _TOOL_KEYS if m.get(k) is not None})
        turns.append(turn)
    answer: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    calls = tool_calls.from_extra_json(rec.get("extra_json"))
    if calls:
        answer["tool_calls"] = calls
    turns.append(answer)
    if not content.strip() and not calls:
        raise ex.Skip("specforge:empty_content")
    if has_think_marker(content) or has_think_marker(reasoning):
        raise ex.Skip("specforge:think_marker")
    row: dict[str, Any] = {"id": ex.record_id(rec, plan.run["name"]), "conversations": turns, "status": "success"}
    if tools or calls:
        # SpecForge parses a tools column given as JSON text (one Arrow type for every row's schemas).
        row["tools"] = orjson.dumps(tools or []).decode()
        if specforge_reader_error(turns) is not None:
            raise ex.Skip("specforge:conversation")
    elif specforge_row_error(row) is not None:
        raise ex.Skip("specforge:conversation")
    lt = plan.tokenizer
    if lt is not None and reasoning.strip():
        # SpecForge renders the rows through the tokenizer's chat template: one that drops the answer's
        # reasoning would train the draft model without it.
        from ..tokens.tokenizer import TokenizerError

        try:
            rendered = lt.apply_chat_template(turns, add_generation_prompt=False, tools=tools)
        except TokenizerError:
            raise ex.Skip(ex.R_TOKENIZE) from None
        if reasoning.strip() not in rendered:
            raise ex.Skip("template_drops_reasoning")
    return row


_TOOL_KEYS = ("tool_calls", "tool_call_id", "name")


def specforge_reader_error(turns: list[dict[str, Any]]) -> str | None:
    """Why SpecForge's reader (GeneralParser.parse, 0.2.0) would truncate a conversation with tool turns: a
    leading system turn, then user first; an assistant turn follows a user or tool turn; a tool turn follows
    an assistant or tool turn; and (ours) it ends with the assistant's answer."""
    body = turns[1:] if turns and turns[0].get("role") == "system" else turns
    if not body or body[0].get("role") != "user":
        return "a conversation must start with a user turn"
    for prev, turn in zip(body, body[1:], strict=False):
        role = turn.get("role")
        if role == "assistant" and prev.get("role") not in ("user", "tool"):
            return "an assistant turn must follow a user or tool turn"
        if role == "tool" and prev.get("role") not in ("assistant", "tool"):
            return "a tool turn must follow an assistant or tool turn"
        if role not in ("user", "assistant", "tool"):
            return f"unsupported role {role!r}"
    return None if body[-1].get("role") == "assistant" else "the conversation must end with the answer"


def row_speculators(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    from . import plan as ex

    rid = ex.record_id(rec, plan.run["name"])
    from ..capture import tool_calls
    from .tokens import training_row

    row, source = training_row(rec, plan, as_generated=True)
    calls = tool_calls.from_extra_json(rec.get("extra_json"))
    try:
        usage = orjson.loads(rec["usage_json"]) if rec.get("usage_json") else {}
    except orjson.JSONDecodeError:
        usage = {}
    return {
        "id": f"{rid}_gen0",
        "primary_id": rid,
        "input_ids": row.input_ids,
        "loss_mask": row.loss_mask,
        "metadata": {"idx": rec.get("idx"), "finish_reason": rec.get("finish_reason"), "is_tool_call": bool(calls),
                     "usage": usage if isinstance(usage, dict) else {}, "token_ids": source},
    }


ROWS: dict[str, Callable[[Mapping[str, Any], ExportPlan], dict[str, Any]]] = {
    "specforge": row_specforge,
    "speculators": row_speculators,
}
