"""Tool calls of a reply: streamed ``tool_calls`` deltas merged into whole calls, and what is wrong with them.

A streamed reply sends each call in pieces keyed by ``index``: the first delta of a call carries its
``id``, ``type`` and ``function.name``; the following ones append to ``function.arguments``. The stream
parser (:class:`synthwatch.capture.stream.StreamAccumulator`) keeps those deltas raw, in order, in
``Extracted.extra["delta"]["tool_calls"]``; a non-streamed reply has the whole calls in
``extra["message"]["tool_calls"]``.
"""

from __future__ import annotations

from typing import Any

import orjson


def merge_deltas(deltas: list[Any]) -> list[dict[str, Any]]:
    """Whole calls ({"id", "type", "function": {"name", "arguments"}}) from streamed deltas, by index."""
    calls: dict[int, dict[str, Any]] = {}
    for n, delta in enumerate(deltas):
        if not isinstance(delta, dict):
            continue
        index = delta.get("index")
        key = index if isinstance(index, int) else n
        call = calls.setdefault(key, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if isinstance(delta.get("id"), str) and delta["id"]:
            call["id"] = delta["id"]
        if isinstance(delta.get("type"), str):
            call["type"] = delta["type"]
        fn = delta.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call["function"]["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                call["function"]["arguments"] += fn["arguments"]
    return [calls[k] for k in sorted(calls)]


def from_extracted(extracted: Any) -> list[dict[str, Any]]:
    """The reply's tool calls: merged from the stream's deltas, or the message's own."""
    return from_extra(getattr(extracted, "extra", None) or {})


def from_extra_json(extra_json: str | None) -> list[dict[str, Any]]:
    """The tool calls of a stored record (its ``extra_json`` column)."""
    if not extra_json:
        return []
    try:
        extra = orjson.loads(extra_json)
    except orjson.JSONDecodeError:
        return []
    return from_extra(extra) if isinstance(extra, dict) else []


def from_extra(extra: dict[str, Any]) -> list[dict[str, Any]]:
    streamed = (extra.get("delta") or {}).get("tool_calls")
    if isinstance(streamed, list) and streamed:
        return merge_deltas(streamed)
    whole = (extra.get("message") or {}).get("tool_calls")
    return [c for c in whole if isinstance(c, dict)] if isinstance(whole, list) else []


def problems(calls: list[dict[str, Any]], tools: list[Any] | None) -> list[str]:
    """Arguments that are not a JSON object, and names not among the request's tools."""
    known = {t["function"]["name"] for t in tools or () if isinstance(t, dict) and isinstance(t.get("function"), dict)
             and isinstance(t["function"].get("name"), str)}
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function")
        fn = fn if isinstance(fn, dict) else {}
        name = fn.get("name")
        if tools is not None and name not in known:
            out.append(f"tool call {i} names an unknown tool {name!r}")
        try:
            args = orjson.loads(fn.get("arguments") or "")
        except orjson.JSONDecodeError:
            out.append(f"tool call {i} ({name}): arguments are not valid JSON")
            continue
        if not isinstance(args, dict):
            out.append(f"tool call {i} ({name}): arguments are JSON but not an object")
    return out


def pretty(calls: list[Any]) -> list[Any]:
    """The calls with their arguments parsed when they are JSON (for display: indented, never executed)."""
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            out.append(call)
            continue
        fn = dict(call["function"])
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = orjson.loads(args)
            except orjson.JSONDecodeError:
                pass
        out.append({**call, "function": fn})
    return out
