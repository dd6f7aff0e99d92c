"""Rows a trainer's own chat template would close with tokens the model never wrote (issue #26).

The text formats (``messages``, ``sharegpt``, ``specforge``) leave the tokens to the trainer: its chat template
renders ``<think>reasoning</think>content`` and its end-of-turn token around every answer, all under loss. For a
reply cut by ``max_tokens`` the model wrote no end of turn, and for one that stopped (or was cut) inside its
reasoning no ``</think>``: those rows would train tokens the model never wrote. The export cannot change the
trainer's template, so it counts such rows (in the manifest) and warns (the CLI, the export page). The token
formats (``tokens``, ``speculators``) write the ids themselves and add neither (synthwatch.export.training_rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

TEXT_FORMATS = ("messages", "sharegpt", "specforge")
EOS_AFTER_TRUNCATION = "eos_after_truncation"
CLOSE_NOT_WRITTEN = "think_close_not_written"

_WHO = {"specforge": "SpecForge's chat template", "messages": "a trainer's chat template",
        "sharegpt": "a trainer's chat template"}


def added_by_template(rec: Mapping[str, Any], think_close: str, think_inline: bool = False) -> list[str]:
    """Which tokens a trainer's template adds to this exported row that the model did not write."""
    from .tokens import shown_by

    truncated = rec.get("finish_reason") == "length"
    in_reasoning = bool((rec.get("reasoning") or "").strip()) and not rec.get("content")
    if not truncated and not in_reasoning:  # the usual row: nothing to parse
        return []
    shown = shown_by(rec, think_close)
    out = []
    if not shown.eos and rec.get("finish_reason") == "length":
        out.append(EOS_AFTER_TRUNCATION)
    # sharegpt --think-inline writes the tags into the text itself, the closing one only when the model wrote it
    if (rec.get("reasoning") or "").strip() and not shown.closed and not think_inline:
        out.append(CLOSE_NOT_WRITTEN)
    return out


def manifest_part(fmt: str, counts: Counter[str], rows: int) -> dict[str, Any]:
    return {
        "rows": rows,
        "by_token": dict(sorted(counts.items())),
        "why": f"{_WHO.get(fmt, 'the trainer')} closes every answer with {'</think> and ' if counts.get(CLOSE_NOT_WRITTEN) else ''}"
               "its end-of-turn token, under loss; these rows' model never wrote "
               + " or ".join(_TOKEN_WORDS[k] for k in sorted(counts)),
    }


_TOKEN_WORDS = {EOS_AFTER_TRUNCATION: "the end of turn (cut by max_tokens)",
                CLOSE_NOT_WRITTEN: "the </think> (stopped or cut inside its reasoning)"}


def warning(fmt: str, counts: Counter[str], rows: int) -> str:
    parts = []
    if counts.get(EOS_AFTER_TRUNCATION):
        parts.append(f"{counts[EOS_AFTER_TRUNCATION]:,} were cut by max_tokens, and the template ends each with an "
                     "end-of-turn token the model never wrote")
    if counts.get(CLOSE_NOT_WRITTEN):
        parts.append(f"{counts[CLOSE_NOT_WRITTEN]:,} end inside their reasoning, and the template closes it with "
                     "a </think> the model never wrote")
    return (f"{rows:,} exported rows will train tokens the model did not write through {_WHO.get(fmt, 'the trainer')}"
            f": {'; '.join(parts)}. Leave them out (the default exclusions drop truncated rows; --exclude-check "
            "empty_content drops answers that stopped in their reasoning) or export token ids (--format tokens, "
            "--for speculators), which add neither.")
