"""The ``tokens`` side of the export: which tokenizer, and a record as input_ids + loss_mask.

A row's ids are the server's (``return_token_ids``) when the run stored them, else the record
re-tokenized (:mod:`synthwatch.export.training_rows`), which leaves out, with the reason, any record it cannot
turn into a faithful row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..capture import tool_calls
from ..hints import command as hint
from .plan import R_NO_IDS, R_TOKENIZE, ExportError, ExportOptions, ExportPlan, Skip, record_id

R_TOOL_CALL_IDS = "tool_call_without_server_ids"

if TYPE_CHECKING:
    from ..tokens.tokenizer import LoadedTokenizer
    from .training_rows import TrainingRow, Written


def tokens_tokenizer(
    config: dict[str, Any], options: ExportOptions, think_open: str, think_close: str, expects: bool,
    server_ids: bool,
) -> tuple[LoadedTokenizer | None, dict[str, Any] | None]:
    from ..tokens.tokenizer import TokenizerError, TokenizerSpec, load_tokenizer

    run_tok: dict[str, Any] = config["tokenizer"] if isinstance(config.get("tokenizer"), dict) else {}
    name = options.tokenizer or run_tok.get("name_or_path")
    template = options.chat_template if options.chat_template is not None else (
        run_tok.get("chat_template") if not options.tokenizer else None
    )
    trust = options.trust_remote_code if options.trust_remote_code is not None else bool(
        run_tok.get("trust_remote_code", False)
    )
    if not name:
        if options.chat_template:
            raise ExportError("--chat-template needs a tokenizer: give --tokenizer too")
        if server_ids:
            return None, None
        raise ExportError(
            "a tokens export needs token ids: this run did not ask the server for them and has no tokenizer "
            "configured; give --tokenizer (and --chat-template if it has none), or generate with "
            f"`{hint('run', '--request-token-ids', with_db=False)}` (request_token_ids = true) so that the server's exact "
            "ids are kept"
        )
    spec = TokenizerSpec(str(name), chat_template=template, trust_remote_code=trust, think_open=think_open,
                         think_close=think_close)
    try:
        lt = load_tokenizer(spec)
    except TokenizerError as exc:
        if server_ids and not (options.tokenizer or options.chat_template):
            # The server's ids are enough; the run's tokenizer would only serve records stored without them.
            return None, {"unavailable": str(exc)}
        raise ExportError(f"tokens export: {exc}") from None
    if not server_ids and lt.template_source is None:
        raise ExportError(
            f"tokens export: tokenizer {name!r} has no chat template; give --chat-template (a .jinja file or "
            "'deepseek-v4')"
        )
    if expects and not server_ids:
        for text_, ids in ((think_open, lt.think_open_ids), (think_close, lt.think_close_ids)):
            if text_ and len(ids) != 1:
                raise ExportError(
                    f"tokens export: tokenizer {name!r} encodes {text_!r} to {len(ids)} tokens, not one id; "
                    "the draft model would train on sequences the target never produces (wrong tokenizer?)"
                )
    return lt, lt.describe()


def row_tokens(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    """input_ids + loss_mask + prompt_len: the server's ids when stored, else re-tokenized."""
    row, source = training_row(rec, plan)
    out = {"id": record_id(rec, plan.run["name"]), "input_ids": row.input_ids, "loss_mask": row.loss_mask,
           "prompt_len": len(row.prompt_ids), "source": source}
    if rec.get("logprobs_json"):  # sampling.logprobs: one per completion token (export/logprobs.py)
        from .logprobs import aligned

        out.update(aligned(rec, row.completion_ids, plan.tokenizer))
    return out


def training_row(rec: Mapping[str, Any], plan: ExportPlan, *, as_generated: bool | None = None
                 ) -> tuple[TrainingRow, str]:
    """(prompt ids + completion ids, "server" | "retokenized"): the server's ids when the run stored them."""
    from .training_rows import TrainingRow

    if plan.server_ids and rec.get("token_ids_json"):
        ids = orjson.loads(rec["token_ids_json"])
        prompt, completion = ids.get("prompt"), ids.get("completion")
        if isinstance(prompt, list) and isinstance(completion, list) and completion:
            return TrainingRow(prompt, completion), "server"
    if rec.get("extra_json") and tool_calls.from_extra_json(rec["extra_json"]):
        # The answer is a tool call: its tokens are in the server's ids only (a re-tokenized answer would be
        # rendered from the text, without the call).
        raise Skip(R_TOOL_CALL_IDS)
    return retokenize(rec, plan, as_generated=as_generated), "retokenized"


def retokenize(rec: Mapping[str, Any], plan: ExportPlan, *, as_generated: bool | None = None) -> TrainingRow:
    """The record re-tokenized with the plan's tokenizer; Skip with the reason when it cannot be faithful."""
    from ..tokens.tokenizer import TokenizerError
    from .training_rows import Unusable, retokenized_row

    lt = plan.tokenizer
    if lt is None:
        raise Skip(R_NO_IDS)
    if as_generated is None:
        as_generated = plan.options.template_drops_past_reasoning
    try:
        return retokenized_row(
            lt, orjson.loads(rec["prompt_json"]), rec.get("reasoning") or "", rec.get("content") or "",
            as_generated=as_generated, finish_reason=rec.get("finish_reason"), shown=shown_by(rec, plan.think_close),
        )
    except TokenizerError:
        raise Skip(R_TOKENIZE) from None
    except Unusable as exc:
        raise Skip(exc.reason) from None


def shown_by(rec: Mapping[str, Any], think_close: str) -> Written:
    """What a stored record shows the model wrote besides its text (closed its reasoning, stopped on EOS), from
    its content, finish reason and raw fields: the content as sent (inline tags) and vLLM's ``stop_reason`` (a stop
    string or token matched: no EOS)."""
    from .training_rows import written

    extra: Any = {}
    if rec.get("extra_json"):
        try:
            extra = orjson.loads(rec["extra_json"])
        except orjson.JSONDecodeError:
            extra = {}
    extra = extra if isinstance(extra, dict) else {}
    choice = extra.get("choice") if isinstance(extra.get("choice"), dict) else {}
    raw = extra.get("raw_content")
    return written(rec.get("content") or "", rec.get("finish_reason"), think_close=think_close,
                   raw_content=raw if isinstance(raw, str) else None, stop_reason=choice.get("stop_reason"))
