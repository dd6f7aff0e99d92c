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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tokens.tokenizer import LoadedTokenizer

R_DROPS_REASONING = "template_drops_reasoning"
R_NOT_PREFIX = "prompt_not_prefix"


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


def retokenized_row(
    lt: LoadedTokenizer,
    messages: list[dict[str, Any]] | dict[str, Any],
    reasoning: str,
    content: str,
    *,
    as_generated: bool = False,
    finish_reason: str | None = "stop",
) -> TrainingRow:
    """The record's training row (prompt ids, completion ids); raises :class:`Unusable` with the reason."""
    reasoning = reasoning or ""
    content = content or ""
    if as_generated:
        return _as_generated(lt, messages, reasoning, content, finish_reason)
    from ..tokens.render import assemble

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
    return TrainingRow(asm.prompt_ids, asm.completion_ids)


def _as_generated(
    lt: LoadedTokenizer, messages: list[dict[str, Any]] | dict[str, Any], reasoning: str, content: str, finish_reason: str | None
) -> TrainingRow:
    from ..tokens.render import _normalize_messages, prompt_tools

    prompt_text = lt.apply_chat_template(_normalize_messages(messages), add_generation_prompt=True,
                                         tools=prompt_tools(messages))
    open_, close = lt.spec.think_open, lt.spec.think_close
    prefilled = bool(open_) and prompt_text.rstrip().endswith(open_)
    text = content
    if close and (prefilled or reasoning):
        text = ("" if prefilled else open_) + reasoning + close + content
    completion = lt.encode(text)
    eos = lt.tok.eos_token_id
    if finish_reason != "length" and eos is not None:
        completion.append(int(eos))
    return TrainingRow(lt.encode(prompt_text), completion)
