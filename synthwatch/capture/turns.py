"""Multi-turn regeneration (run setting ``turns = "all"``): which assistant turns the model writes, and the
history each request carries.

A record is one conversation: its stored prompt (``record.prompt_json``) is the dataset's conversation up
to its last user turn. With ``turns = "last"`` (the default) only the final answer is generated, from the
dataset's history as it stands. With ``turns = "all"`` every assistant turn of the prompt is generated
again, in order, and each request carries the model's own earlier answers instead of the dataset's:

* turn k's request is the prompt's messages before the k-th regenerated position, each earlier regenerated
  position replaced by the model's answer to it (:func:`history`);
* the model's earlier reasoning goes back as ``reasoning_content`` when ``history_reasoning = "keep"``, and
  is left out when ``"strip"`` (the default: what DeepSeek-R1/V3-style and Qwen3 templates do with past
  turns, and what SpecForge's and speculators' regeneration scripts send);
* an assistant turn the dataset follows with ``tool`` results is not regenerated: the results answer the
  dataset's calls, not calls the model would make. It stays the dataset's, in every request and every
  export, and is never trained.

Storage: the finished turns before the last are ``record.turns_json`` (a list of :func:`stored_turn`
dicts, each shaped like a record's output columns plus its attempts); the last turn is the record's own
columns, as in a single-turn run. ``record.turns_done`` counts the turns finished and stored,
``record.n_turns`` the turns the conversation has. A turn is written (while the record stays claimed)
before the next turn's request is sent, so a killed worker's record resumes at its first unfinished turn.
"""

from __future__ import annotations

from typing import Any

import orjson

TURN_MODES = ("last", "all")
HISTORY_REASONING = ("strip", "keep")


def _messages(prompt: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(prompt, dict):
        return list(prompt.get("messages") or [])
    return list(prompt)


def positions(prompt: list[dict[str, Any]] | dict[str, Any]) -> list[int]:
    """Message indexes the model answers at, in order: each regenerated assistant turn of the prompt, then
    the end (the final answer). An assistant turn followed by ``tool`` turns stays the dataset's."""
    msgs = _messages(prompt)
    out = [i for i, m in enumerate(msgs)
           if m.get("role") == "assistant" and not (i + 1 < len(msgs) and msgs[i + 1].get("role") == "tool")]
    out.append(len(msgs))
    return out


def count(prompt: list[dict[str, Any]] | dict[str, Any], mode: str) -> int:
    """How many turns the model writes for this prompt under ``turns = mode``."""
    return len(positions(prompt)) if mode == "all" else 1


def answer_message(turn: dict[str, Any], history_reasoning: str) -> dict[str, Any]:
    """A stored turn as the assistant message later requests carry."""
    from . import tool_calls

    msg: dict[str, Any] = {"role": "assistant", "content": turn.get("content") or ""}
    if history_reasoning == "keep" and turn.get("reasoning"):
        msg["reasoning_content"] = turn["reasoning"]
    calls = tool_calls.from_extra_json(turn.get("extra_json"))
    if calls:
        msg["tool_calls"] = calls
    return msg


def history(prompt: list[dict[str, Any]] | dict[str, Any], turns: list[dict[str, Any]], k: int,
            history_reasoning: str) -> list[dict[str, Any]] | dict[str, Any]:
    """The request messages for turn ``k`` (0-based), the model's ``turns[:k]`` in place of the dataset's
    answers; the same shape as the prompt (a dict with its ``tools`` when it has them)."""
    msgs = _messages(prompt)
    pos = positions(prompt)
    if not 0 <= k < len(pos) or len(turns) < k:
        raise ValueError(f"turn {k} of a conversation with {len(pos)} turns ({len(turns)} stored)")
    answers = {pos[j]: answer_message(turns[j], history_reasoning) for j in range(k)}
    out = [answers.get(i, m) for i, m in enumerate(msgs[: pos[k]])]
    if isinstance(prompt, dict):
        return {**prompt, "messages": out}
    return out


def load(turns_json: str | None) -> list[dict[str, Any]]:
    if not turns_json:
        return []
    try:
        turns = orjson.loads(turns_json)
    except orjson.JSONDecodeError:
        return []
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def history_reasoning_of(config_json: str | dict[str, Any] | None) -> str:
    """The run's ``history_reasoning`` from its stored config (``strip`` when absent)."""
    cfg = config_json
    if isinstance(cfg, str):
        try:
            cfg = orjson.loads(cfg)
        except orjson.JSONDecodeError:
            cfg = {}
    value = cfg.get("history_reasoning") if isinstance(cfg, dict) else None
    return value if value in HISTORY_REASONING else "strip"


# columns of a turn, as the record stores its (last) turn; a stored turn holds these plus its attempts
TURN_COLS = (
    "reasoning", "content", "content_null", "reasoning_source", "reasoning_len", "content_len", "finish_reason",
    "prompt_tokens", "completion_tokens", "reasoning_tokens", "reasoning_tokens_source", "usage_json",
    "token_ids_json", "model",
    "system_fingerprint", "response_id", "extra_json", "endpoint", "latency_s", "ttft_s", "n_chunks",
    "finished_at", "gen_version", "logprobs_json",
)


def stored_turn(cols: dict[str, Any], *, attempts: list[dict[str, Any]], endpoint: str | None,
                latency_s: float | None, ttft_s: float | None, n_chunks: int, finished_at: float,
                gen_version: int | None) -> dict[str, Any]:
    """A finished turn as ``record.turns_json`` keeps it (``cols``: workers.series.record_columns of its reply)."""
    turn = {k: cols.get(k) for k in TURN_COLS}
    turn.update({"endpoint": endpoint, "latency_s": latency_s, "ttft_s": ttft_s, "n_chunks": n_chunks,
                 "finished_at": finished_at, "gen_version": gen_version, "attempts": attempts})
    return turn


def last_turn(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's own columns (its last or only turn) in a stored turn's shape."""
    turn = {k: rec.get(k) for k in TURN_COLS}
    try:
        turn["attempts"] = orjson.loads(rec["attempts_json"]) if rec.get("attempts_json") else []
    except orjson.JSONDecodeError:
        turn["attempts"] = []
    return turn


def all_turns(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every turn of a finished record, the last being its own columns."""
    return [*load(rec.get("turns_json")), last_turn(rec)]
