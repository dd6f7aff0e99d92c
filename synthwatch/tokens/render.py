"""A record -> training tokens (chips, loss mask, integrity warnings); loading the tokenizer is tokenizer.py.

A record (prompt messages + the model's reasoning and content) becomes a training sequence the way
SpecForge-style pipelines build one: the chat template renders the prompt (with the generation prompt)
and the full conversation (the record's answer appended as an assistant message carrying
`reasoning_content`). The full render is tokenized once with ``add_special_tokens=False`` (the template
emits BOS itself) and split at the TOKEN level: the prompt is the generation prompt's ids when they are
a prefix of the full ids. The loss mask is 0 over the prompt and 1 over the assistant span. A template
that prefills ``<think>`` in its
generation prompt therefore leaves that tag in the prompt (loss mask 0), as the server-side token ids of
vLLM's ``return_token_ids`` do.

Integrity warnings (``TokenWarning.code``):

- ``think_not_single_token``: a think delimiter used by the template (or expected by the caller) does not
  encode to one token, encodes to a different id than ``expected_think_ids``, or the rendered text holds
  more delimiter strings than the token ids hold delimiter ids.
- ``reasoning_dropped_by_template``: the record has reasoning (stripped, non-empty) but it is not a
  substring of the decoded assistant span.
- ``think_text_in_content``: the literal text of a think delimiter is inside the content (or inside the
  reasoning; ``detail["field"]`` says which).
- ``completion_length_mismatch``: the re-tokenized assistant span and ``usage.completion_tokens`` are more
  than 8 tokens AND more than 10 % of ``usage.completion_tokens`` apart.
- ``server_ids_differ``: the server's prompt/completion token ids differ from the re-tokenized ones. Extra
  trailing end-of-turn tokens on our side only (a completion cut by ``max_tokens`` has no EOS) are not
  reported.
- ``prompt_not_prefix``: the generation prompt's token ids are not a prefix of the full conversation's
  token ids, so the split falls back to the longest common run of ids (never a character boundary).
- ``unwritten_close``: the record has reasoning and no answer while the model stopped by itself: the chat
  template closes the reasoning with a think-close token the model did not write (an export through the
  template leaves such a record out, ``reasoning_not_closed``).

A record cut by ``max_tokens`` (``finish_reason="length"``) wrote no end of turn: its assistant span ends where the
model's text ends (:func:`cut_after_text`), as the export's rows do; the template's closing tokens are not shown.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .tokenizer import MAX_ALIGN_CELLS, USAGE_TOLERANCE_RATIO, USAGE_TOLERANCE_TOKENS, LoadedTokenizer

if TYPE_CHECKING:
    pass



@dataclass(slots=True)
class Chip:
    id: int
    text: str
    """Decoded text of this single token; bytes that are not valid UTF-8 alone appear as \\x.. escapes."""
    piece: str
    """The vocabulary piece (convert_ids_to_tokens)."""
    raw_bytes: str
    """Hex of the bytes this token contributes, space separated ("e4 bd")."""
    kind: str
    """"think" | "role" | "bos_eos" | "special" | "added" | "text"."""
    in_assistant: bool
    differs: bool = False


@dataclass(slots=True)
class TokenWarning:
    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rendered:
    text: str
    input_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    chips: list[Chip]
    totals: dict[str, int]
    """tokens, prompt, assistant, reasoning_tokens_est, content_tokens_est, special (= non-"text" chips)."""
    warnings: list[TokenWarning]
    template_source: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (faster than dataclasses.asdict for thousands of chips)."""
        return {
            "text": self.text,
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "prompt_len": self.prompt_len,
            "chips": [
                {
                    "id": c.id,
                    "text": c.text,
                    "piece": c.piece,
                    "raw_bytes": c.raw_bytes,
                    "kind": c.kind,
                    "in_assistant": c.in_assistant,
                    "differs": c.differs,
                }
                for c in self.chips
            ],
            "totals": dict(self.totals),
            "warnings": [{"code": w.code, "message": w.message, "detail": w.detail} for w in self.warnings],
            "template_source": self.template_source,
        }


# ---------------------------------------------------------------------------------------- assembly


@dataclass(slots=True)
class Assembled:
    prompt_text: str
    full_text: str
    split: int  # character offset of the assistant span in full_text (the decoded length of prompt_ids)
    prompt_ids: list[int]
    completion_ids: list[int]
    prefix_ok: bool
    """The generation prompt's ids are a token-level prefix of the full render's ids."""


def normalize_messages(messages: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    """Accept ShareGPT `from`/`value` turns next to OpenAI `role`/`content` ones (and a prompt stored with its
    tools, ``{"messages", "tools"}``: the messages)."""
    if isinstance(messages, dict):
        messages = messages.get("messages") or []
    roles = {
        "human": "user",
        "gpt": "assistant",
        "system": "system",
        "user": "user",
        "assistant": "assistant",
    }
    out = []
    for message in messages:
        if "role" not in message and "from" in message:
            message = {
                "role": roles.get(str(message["from"]), str(message["from"])),
                "content": message.get("value", ""),
            }
        out.append(message)
    return out


def assemble(
    lt: LoadedTokenizer, messages: list[dict[str, Any]] | dict[str, Any], reasoning: str, content: str
) -> Assembled:
    """Render the prompt and the full conversation and split the full render's ids at the TOKEN level.

    The full render is tokenized once; the prompt is the generation-prompt render's ids when they are a
    prefix of it (``prefix_ok``), else the longest common run of ids. A split at a character boundary
    would tokenize the halves separately and invent tokens the model never sees (a lone ``<`` and an
    end-of-sentence spelled in byte tokens when a template drops the reasoning).
    """
    prompt_messages = normalize_messages(messages)
    tools = prompt_tools(messages)
    answer = {"role": "assistant", "content": content or "", "reasoning_content": reasoning or ""}
    prompt_text = lt.apply_chat_template(prompt_messages, add_generation_prompt=True, tools=tools)
    full_text = lt.apply_chat_template([*prompt_messages, answer], add_generation_prompt=False, tools=tools)
    prompt_ids = lt.encode(prompt_text)
    full_ids = lt.encode(full_text)
    n = _common_prefix_len(prompt_ids, full_ids)
    prefix_ok = n == len(prompt_ids)
    split = len(prompt_text) if prefix_ok and full_text.startswith(prompt_text) else len(lt.decode(full_ids[:n]))
    return Assembled(
        prompt_text=prompt_text,
        full_text=full_text,
        split=split,
        prompt_ids=full_ids[:n],
        completion_ids=full_ids[n:],
        prefix_ok=prefix_ok,
    )


def prompt_tools(messages: Any) -> list[Any] | None:
    """The tools of a prompt stored with them (``{"messages", "tools"}``), else None."""
    tools = messages.get("tools") if isinstance(messages, dict) else None
    return tools if isinstance(tools, list) and tools else None


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


MAX_TEMPLATE_TAIL = 8
"""At most this many tokens a chat template writes after the answer (end of turn, a newline or two)."""


def cut_after_text(lt: LoadedTokenizer, ids: list[int], text: str) -> list[int] | None:
    """``ids`` up to the end of ``text`` (the model's last words), the chat template's closing tokens after it
    (``</think>``, end of turn, newlines) dropped: the largest cut whose decoded text ends with ``text`` (exactly,
    else ignoring trailing whitespace the template may strip). None when the text is not found there."""
    if not text.strip():
        return []  # the model wrote nothing the template renders
    for exact in (True, False):
        want = text if exact else text.rstrip()
        for k in range(len(ids), max(len(ids) - MAX_TEMPLATE_TAIL, 0) - 1, -1):
            got = lt.decode(ids[:k])
            if (got if exact else got.rstrip()).endswith(want):
                return ids[:k]
    return None


def training_ids(
    lt: LoadedTokenizer, messages: list[dict[str, Any]], reasoning: str, content: str
) -> tuple[list[int], list[int], int]:
    """(input_ids, loss_mask, prompt_len) with the same semantics as render_record, without chips."""
    asm = assemble(lt, messages, reasoning, content)
    prompt_len = len(asm.prompt_ids)
    return asm.prompt_ids + asm.completion_ids, [0] * prompt_len + [1] * len(asm.completion_ids), prompt_len


# ---------------------------------------------------------------------------------------- rendering


def render_record(
    lt: LoadedTokenizer,
    messages: list[dict[str, Any]],
    reasoning: str,
    content: str,
    *,
    usage_completion_tokens: int | None = None,
    server_prompt_ids: list[int] | None = None,
    server_completion_ids: list[int] | None = None,
    expected_think_ids: tuple[int, int] | None = None,
    finish_reason: str | None = None,
) -> Rendered:
    """Render one record into training tokens with chips, loss mask, totals and integrity warnings."""
    reasoning = reasoning or ""
    content = content or ""
    asm = assemble(lt, messages, reasoning, content)
    if finish_reason == "length":
        cut = cut_after_text(lt, asm.completion_ids, content or reasoning)
        if cut is not None:
            asm.completion_ids = cut
    prompt_len = len(asm.prompt_ids)
    input_ids = asm.prompt_ids + asm.completion_ids
    loss_mask = [0] * prompt_len + [1] * len(asm.completion_ids)

    infos = lt.token_infos(input_ids)
    chips = [
        Chip(token_id, text, piece, raw, kind, pos >= prompt_len)
        for pos, (token_id, (text, piece, raw, kind)) in enumerate(zip(input_ids, infos, strict=True))
    ]

    warnings: list[TokenWarning] = []
    if not asm.prefix_ok:
        warnings.append(
            TokenWarning(
                "prompt_not_prefix",
                "the chat template renders the prompt differently once the answer is appended: the "
                "generation prompt's tokens are not a prefix of the full render's tokens, so the assistant "
                f"span was split after the longest common run of tokens (token {len(asm.prompt_ids)}); an "
                "export leaves such a record out",
                {"split_token": len(asm.prompt_ids), "split_char": asm.split, "prompt_chars": len(asm.prompt_text)},
            )
        )
    warnings += _think_token_warnings(lt, asm.full_text, input_ids, expected_think_ids)
    warnings += _dropped_reasoning_warnings(lt, asm, reasoning)
    warnings += _think_text_warnings(lt, reasoning, content)
    warnings += _empty_think_warnings(lt, asm.completion_ids, infos[prompt_len:])
    if finish_reason == "stop" and reasoning.strip() and not content and lt.think_close_id in asm.completion_ids:
        warnings.append(TokenWarning(
            "unwritten_close",
            f"the model stopped inside its reasoning (no answer): the chat template closes it with "
            f"{lt.spec.think_close!r}, which the model never wrote; an export through the template leaves this "
            "record out (reasoning_not_closed)", {}))
    if usage_completion_tokens is not None:
        warnings += _usage_warnings(len(asm.completion_ids), usage_completion_tokens)
    if server_prompt_ids is not None or server_completion_ids is not None:
        warnings += _server_id_warnings(lt, chips, prompt_len, server_prompt_ids, server_completion_ids)

    reasoning_est, content_est = _split_estimate(
        lt, asm.completion_ids, infos[prompt_len:], reasoning, content
    )
    totals = {
        "tokens": len(input_ids),
        "prompt": prompt_len,
        "assistant": len(asm.completion_ids),
        "reasoning_tokens_est": reasoning_est,
        "content_tokens_est": content_est,
        "special": sum(1 for info in infos if info[3] != "text"),
    }
    return Rendered(
        text=asm.full_text,
        input_ids=input_ids,
        loss_mask=loss_mask,
        prompt_len=prompt_len,
        chips=chips,
        totals=totals,
        warnings=warnings,
        template_source=lt.template_source or "",
    )


def _empty_think_warnings(lt: LoadedTokenizer, completion: list[int],
                          infos: list[tuple[str, str, str, str]]) -> list[TokenWarning]:
    """An empty think block (open, nothing but whitespace, close) inside the trained span, or a trained span
    that starts by closing a think block the prompt opened: the model would learn to skip its reasoning."""
    o, c = lt.think_open_id, lt.think_close_id
    if o is None or c is None or c not in completion:
        return []
    j = completion.index(c)
    i = completion.index(o) if o in completion[:j] else -1  # -1: opened by the prompt (a prefilled <think>)
    if any(info[0].strip() for info in infos[i + 1:j]):
        return []
    return [TokenWarning("empty_think_trained",
                         f"the trained span holds an empty think block ({lt.spec.think_open}{lt.spec.think_close} at "
                         f"assistant token {i}): training on it teaches the model to answer without reasoning",
                         {"assistant_token": i})]


def _split_estimate(
    lt: LoadedTokenizer,
    completion: list[int],
    infos: list[tuple[str, str, str, str]],
    reasoning: str,
    content: str,
) -> tuple[int, int]:
    """Reasoning/content token counts inside the assistant span, split at the think-close id."""
    close = lt.think_close_id
    if close is not None and close in completion:
        end = completion.index(close)
        start = 0
        if lt.think_open_id is not None and lt.think_open_id in completion[:end]:
            start = end - completion[:end][::-1].index(lt.think_open_id)
        tail = len(completion)
        while tail > end + 1 and infos[tail - 1][3] != "text":
            tail -= 1
        return end - start, tail - end - 1
    return len(lt.encode(reasoning)), len(lt.encode(content))


def _pieces(lt: LoadedTokenizer, ids: list[int]) -> str:
    return ", ".join(repr(p) for p in lt.tok.convert_ids_to_tokens(ids))


def _think_token_warnings(
    lt: LoadedTokenizer, full_text: str, input_ids: list[int], expected: tuple[int, int] | None
) -> list[TokenWarning]:
    out: list[TokenWarning] = []
    delimiters = (
        (lt.spec.think_open, lt.think_open_ids, lt.think_open_id, expected[0] if expected else None),
        (lt.spec.think_close, lt.think_close_ids, lt.think_close_id, expected[1] if expected else None),
    )
    for text, ids, single, want in delimiters:
        if not text:
            continue
        occurrences = full_text.count(text)
        if want is None and occurrences == 0:
            continue  # the template does not use this delimiter: nothing to check
        detail: dict[str, Any] = {"delimiter": text, "ids": ids, "expected_id": want}
        target = f"the single id {want}" if want is not None else "a single token"
        if single is None:
            message = (
                f"`{text}` encodes to {len(ids)} tokens ({_pieces(lt, ids)}) instead of {target}: "
                "the draft model would train on text the target never sees"
            )
            out.append(TokenWarning("think_not_single_token", message, detail))
        elif want is not None and single != want:
            message = (
                f"`{text}` encodes to the id {single} but the target model uses {want}: this tokenizer "
                "does not match the model that generated the data"
            )
            out.append(TokenWarning("think_not_single_token", message, detail))
        elif occurrences and input_ids.count(single) < occurrences:
            found = input_ids.count(single)
            message = (
                f"the rendered text holds `{text}` {occurrences} times but the tokens hold its id {single} "
                f"only {found} times: some delimiters were tokenized as plain text"
            )
            out.append(
                TokenWarning(
                    "think_not_single_token", message, {**detail, "in_text": occurrences, "in_ids": found}
                )
            )
    return out


def _dropped_reasoning_warnings(lt: LoadedTokenizer, asm: Assembled, reasoning: str) -> list[TokenWarning]:
    wanted = reasoning.strip()
    if not wanted:
        return []
    decoded = lt.decode(asm.completion_ids)
    if wanted in decoded:
        return []
    in_text = wanted in asm.full_text[asm.split :]
    if in_text:
        message = (
            "the reasoning is in the rendered assistant text but not in its decoded tokens: "
            "tokenizing and decoding the assistant span does not give the text back"
        )
    else:
        message = (
            f"the chat template ({lt.template_source}) dropped the reasoning: its "
            f"{len(reasoning)} characters are not inside the assistant tokens, so the model would be trained "
            "without them"
        )
    detail = {"reasoning_chars": len(reasoning), "in_rendered_text": in_text, "template": lt.template_source}
    return [TokenWarning("reasoning_dropped_by_template", message, detail)]


def _think_text_warnings(lt: LoadedTokenizer, reasoning: str, content: str) -> list[TokenWarning]:
    out = []
    for field_name, value in (("content", content), ("reasoning", reasoning)):
        found = [t for t in (lt.spec.think_open, lt.spec.think_close) if t and t in value]
        if found:
            tags = " and ".join(f"`{t}`" for t in found)
            message = (
                f"the {field_name} contains the text {tags}: the reasoning was not separated cleanly "
                "and the delimiter becomes a real think token in training"
            )
            out.append(
                TokenWarning(
                    "think_text_in_content",
                    message,
                    {"field": field_name, "tags": found, "offset": value.find(found[0])},
                )
            )
    return out


def _usage_warnings(ours: int, usage: int) -> list[TokenWarning]:
    diff = abs(ours - usage)
    if diff <= USAGE_TOLERANCE_TOKENS or diff <= USAGE_TOLERANCE_RATIO * usage:
        return []
    message = (
        f"the re-tokenized answer has {ours} tokens but the server reported {usage} completion tokens "
        f"({diff} apart): the text was changed, truncated, or tokenized with a different tokenizer"
    )
    return [TokenWarning("completion_length_mismatch", message, {"retokenized": ours, "usage": usage})]


def _diff_positions(ours: list[int], theirs: list[int]) -> tuple[list[int], int | None]:
    """(positions in `ours` that differ from `theirs`, first differing position or None)."""
    if ours == theirs:
        return [], None
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if first is None:
        first = min(len(ours), len(theirs))
    if len(ours) == len(theirs):
        return [i for i in range(first, len(ours)) if ours[i] != theirs[i]], first
    # Different lengths (a token merged/split somewhere): align the part between the common prefix and suffix.
    tail = 0
    while tail < min(len(ours), len(theirs)) - first and ours[-1 - tail] == theirs[-1 - tail]:
        tail += 1
    mid_ours, mid_theirs = ours[first : len(ours) - tail], theirs[first : len(theirs) - tail]
    if not mid_ours:  # the server has extra tokens only: mark our token where they would go
        return [min(first, len(ours) - 1)] if ours else [], first
    if len(mid_ours) * len(mid_theirs) > MAX_ALIGN_CELLS:  # unrelated sequences: alignment means nothing
        return list(range(first, first + len(mid_ours))), first
    positions: set[int] = set()
    matcher = difflib.SequenceMatcher(None, mid_ours, mid_theirs, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            positions.update(range(first + i1, first + i2))
        elif tag == "insert":
            positions.add(first + min(i1, len(mid_ours) - 1))
    return sorted(positions), first


def _server_id_warnings(
    lt: LoadedTokenizer,
    chips: list[Chip],
    prompt_len: int,
    server_prompt: list[int] | None,
    server_completion: list[int] | None,
) -> list[TokenWarning]:
    ids = [c.id for c in chips]
    parts = []
    if server_prompt is not None:
        parts.append(("prompt", 0, ids[:prompt_len], list(server_prompt)))
    if server_completion is not None:
        ours = ids[prompt_len:]
        theirs = list(server_completion)
        # A completion stopped by max_tokens has no end-of-turn token; the template adds one. Not a difference.
        while len(ours) > len(theirs) and ours[: len(theirs)] == theirs and lt.classify(ours[-1]) != "text":
            ours = ours[:-1]
        parts.append(("completion", prompt_len, ours, theirs))
    out = []
    for name, offset, ours, theirs in parts:
        positions, first = _diff_positions(ours, theirs)
        if first is None:
            continue
        for pos in positions:
            chips[offset + pos].differs = True
        ours_at = ours[first] if first < len(ours) else None
        theirs_at = theirs[first] if first < len(theirs) else None
        # where one list has ended, say so in words (a bare None read as a token id, #28)
        server_said = f"the server's id is {theirs_at}" if theirs_at is not None else "the server's ids have ended"
        ours_said = f"the re-tokenized id is {ours_at}" if ours_at is not None else "the re-tokenized ids have ended"
        message = (
            f"the server's {name} token ids differ from the re-tokenized ones, first at {name} position "
            f"{first:,} (token {offset + first:,}): {server_said}, {ours_said}; "
            f"{len(positions):,} tokens differ; the server sent {len(theirs):,}, re-tokenizing gives {len(ours):,}"
        )
        out.append(
            TokenWarning(
                "server_ids_differ",
                message,
                {
                    "part": name,
                    "first_position": first,
                    "first_token_index": offset + first,
                    "server_id": theirs_at,
                    "retokenized_id": ours_at,
                    "differing": len(positions),
                    "server_len": len(theirs),
                    "retokenized_len": len(ours),
                },
            )
        )
    return out
