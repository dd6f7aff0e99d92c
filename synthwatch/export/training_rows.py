"""A record re-tokenized into one training row, or the reason it cannot be one.

The export never writes a row it cannot vouch for. :func:`retokenized_row` renders the record through the
chat template and splits the full render's ids at the token level (:func:`synthwatch.tokens.render.assemble`);
it refuses the record when

- the record has reasoning but the rendered conversation does not hold it (``template_drops_reasoning``:
  DeepSeek-R1-style templates keep only the text after ``</think>`` of every assistant turn, the answer
  being trained included), or
- the generation prompt's ids are not a prefix of the full render's ids (``prompt_not_prefix``: no split
  of those ids gives the prompt the model saw followed by what it wrote).

Templates that drop the reasoning of PAST turns by design (the model never sees it again at inference)
still describe the prompt correctly. With ``as_generated`` the trained turn is not rendered through the
template at all: the row is the generation prompt's ids followed by the answer as the model produced it,
``[<think>]reasoning</think>content`` and EOS when it stopped by itself, which is what vLLM's
``return_token_ids`` reports (the ``<think>`` is written only when the prompt does not already end
with it).

Every token under loss was written by the model (issue #26). The stored text shows two things besides the text
itself (:func:`written`): whether the model closed its reasoning (an answer follows it, or the content as sent
holds the closing tag) and whether it stopped on its end-of-sequence token (``finish_reason == "stop"`` without a
stop string). A ``</think>`` or an EOS is added only where it shows them: a reply that stopped inside its
reasoning gets no ``</think>``, a truncated one no EOS. Through the chat template, a truncated row ends where the
model's text ends (the template's closing tokens are cut off), and a reply that stopped inside its reasoning is
left out (``reasoning_not_closed``: the template would close it with a tag the model never wrote).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tokens.tokenizer import LoadedTokenizer

R_DROPS_REASONING = "template_drops_reasoning"
R_NOT_PREFIX = "prompt_not_prefix"
R_NOT_CLOSED = "reasoning_not_closed"
R_TAIL = "template_tail_not_found"
R_NOTHING = "nothing_written"


class Unusable(Exception):
    """The record cannot become a faithful training row; ``reason`` is the manifest's exclusion key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TrainingRow:
    prompt_ids: list[int]
    completion_ids: list[int]

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def loss_mask(self) -> list[int]:
        return [0] * len(self.prompt_ids) + [1] * len(self.completion_ids)


@dataclass(frozen=True, slots=True)
class Written:
    """What a stored answer shows the model wrote beyond its text."""

    closed: bool
    """It closed its reasoning: text follows the reasoning, or the content as sent holds the closing tag."""
    eos: bool
    """It stopped on its own end-of-sequence token: ``finish_reason == "stop"`` and no stop string matched."""


def written(content: str, finish_reason: str | None, *, think_close: str = "</think>", raw_content: str | None = None,
            stop_reason: Any = None) -> Written:
    """What the stored record shows. A reasoning parser removes the ``</think>``: an empty answer after it cannot be
    told from a reply that never closed its reasoning, so it counts as not closed (the server's token ids, kept
    with ``request_token_ids``, are the exact record)."""
    closed = bool(content) or bool(think_close and raw_content and think_close in raw_content)
    return Written(closed=closed, eos=finish_reason == "stop" and stop_reason is None)


def retokenized_row(
    lt: LoadedTokenizer,
    messages: list[dict[str, Any]] | dict[str, Any],
    reasoning: str,
    content: str,
    *,
    as_generated: bool = False,
    finish_reason: str | None = "stop",
    shown: Written | None = None,
) -> TrainingRow:
    """The record's training row (prompt ids, completion ids); raises :class:`Unusable` with the reason.

    ``shown``: what the stored record shows beyond its text (default: :func:`written` of content and finish
    reason)."""
    reasoning = reasoning or ""
    content = content or ""
    w = shown or written(content, finish_reason, think_close=lt.spec.think_close)
    row = _as_generated(lt, messages, reasoning, content, w) if as_generated else _rendered(
        lt, messages, reasoning, content, w)
    if not row.completion_ids:
        raise Unusable(R_NOTHING, "the model wrote nothing the row could train (no text, no end of turn)")
    return row


def _rendered(
    lt: LoadedTokenizer, messages: list[dict[str, Any]] | dict[str, Any], reasoning: str, content: str, w: Written
) -> TrainingRow:
    from ..tokens.render import assemble

    if not w.closed and w.eos:
        raise Unusable(
            R_NOT_CLOSED,
            "the model stopped without an answer after its reasoning (as far as the stored text shows): the chat "
            f"template would put a {lt.spec.think_close!r} it never wrote under loss",
        )
    asm = assemble(lt, messages, reasoning, content)
    wanted = reasoning.strip()
    if wanted and wanted not in asm.full_text[asm.split :]:
        raise Unusable(
            R_DROPS_REASONING,
            f"the chat template ({lt.template_source}) does not render the answer's reasoning "
            f"({len(reasoning)} characters)",
        )
    if not asm.prefix_ok:
        raise Unusable(
            R_NOT_PREFIX,
            "the generation prompt's token ids are not a prefix of the full render's token ids "
            f"(they agree on {len(asm.prompt_ids)} tokens)",
        )
    if wanted and wanted not in lt.decode(asm.completion_ids):
        raise Unusable(R_DROPS_REASONING, "the reasoning is not inside the assistant tokens")
    completion = asm.completion_ids
    if not w.eos:
        # Cut by max_tokens (or a stop string): the model wrote no end of turn, and with no answer no closing tag.
        if w.closed and not content.strip() and lt.think_close_id in completion:
            # an answer of whitespace only (which a template may strip): the row ends with the closing tag
            completion = completion[: len(completion) - completion[::-1].index(lt.think_close_id)]
        else:
            completion = _cut_after(lt, completion, content if w.closed else reasoning)
    return TrainingRow(asm.prompt_ids, completion)


def _cut_after(lt: LoadedTokenizer, ids: list[int], text: str) -> list[int]:
    from ..tokens.render import cut_after_text

    cut = cut_after_text(lt, ids, text)
    if cut is None:
        raise Unusable(R_TAIL, "the end of the model's text was not found among the template's last tokens")
    return cut


def _as_generated(
    lt: LoadedTokenizer, messages: list[dict[str, Any]] | dict[str, Any], reasoning: str, content: str, w: Written
) -> TrainingRow:
    from ..tokens.render import normalize_messages, prompt_tools

    prompt_text = lt.apply_chat_template(normalize_messages(messages), add_generation_prompt=True,
                                         tools=prompt_tools(messages))
    open_, close = lt.spec.think_open, lt.spec.think_close
    prefilled = bool(open_) and prompt_text.rstrip().endswith(open_)
    text = content
    if close and (prefilled or reasoning):
        # the closing tag only when the model wrote it: a reply that stopped (or was cut) inside its reasoning
        # has none (vLLM's ids of such a reply: reasoning, then EOS)
        text = ("" if prefilled else open_) + reasoning + (close if w.closed else "") + content
    completion = lt.encode(text)
    eos = lt.tok.eos_token_id
    if w.eos and eos is not None:
        completion.append(int(eos))
    return TrainingRow(lt.encode(prompt_text), completion)
