"""One dataset row -> a prompt's messages: the row's shape (OpenAI messages, ShareGPT conversations, a plain
prompt), the mapping options' dotted paths, tool calls and tools, the system prompt."""

from __future__ import annotations

import json
from typing import Any

from ..config import DatasetConfig

SHAPE_MESSAGES = "messages"
SHAPE_CONVERSATIONS = "conversations (ShareGPT)"
SHAPE_PROMPT = "prompt"

_ROLES = frozenset({"system", "user", "assistant", "tool"})
_SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}

_MISSING: Any = object()


# ----------------------------------------------------------------------------------------------
# rows -> messages


class BadRow(Exception):
    pass


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _keys(row: dict[str, Any]) -> str:
    keys = [str(k) for k in row]
    shown = ", ".join(keys[:12])
    return f"{shown}, ... ({len(keys)} keys)" if len(keys) > 12 else shown or "none"


def _lookup(row: dict[str, Any], path: str, parts: list[str]) -> Any:
    if path in row:
        return row[path]
    value: Any = row
    for part in parts:
        if isinstance(value, dict):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, list) and part.isdigit():
            if int(part) >= len(value):
                return _MISSING
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _text(content: Any, where: str, turn: dict[str, Any], key: str) -> str:
    if content.__class__ is str:
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRow(f"{where}[{j}] must be an object, got {_type_name(part)}")
            kind = part.get("type")
            if kind != "text":
                raise BadRow(f"{where}[{j}] has type {kind!r}: only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRow(f"{where}[{j}].text must be a string, got {_type_name(text)}")
            texts.append(text)
        return "\n".join(texts)
    if content is None:
        raise BadRow(f"{where} is {'null' if key in turn else 'missing'}")
    raise BadRow(f"{where} must be a string or a list of text parts, got {_type_name(content)}")


def _messages(value: Any, label: str) -> list[dict[str, str]]:
    if value.__class__ is not list:
        raise BadRow(f"{label} must be an array, got {_type_name(value)}")
    for turn in value:
        if not (
            turn.__class__ is dict
            and len(turn) == 2
            and (content := turn.get("content")).__class__ is str
            and ((role := turn.get("role")) == "assistant" or role == "system" or role == "user")
            and (role != "user" or (content and not content.isspace()))
        ):
            break
    else:
        return value  # every turn is exactly a valid {"role", "content"}: reuse the parsed list
    out = []
    for i, turn in enumerate(value):
        # fast path for well-formed turns; _message_turn explains everything else
        if turn.__class__ is dict and len(turn) == 2:
            role = turn.get("role")
            content = turn.get("content")
            if content.__class__ is str and (
                role == "assistant" or role == "system" or (role == "user" and content and not content.isspace())
            ):
                out.append({"role": role, "content": content})
                continue
        out.append(_message_turn(turn, label, i))
    return out


def _message_turn(turn: Any, label: str, i: int) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise BadRow(f"{label}[{i}] must be an object, got {_type_name(turn)}")
    role = turn.get("role")
    if role is None:
        raise BadRow(f"{label}[{i}] has no role")
    if not isinstance(role, str):
        raise BadRow(f"{label}[{i}].role must be a string, got {_type_name(role)}")
    if role not in _ROLES:
        raise BadRow(f"{label}[{i}].role is {role!r}: expected system/user/assistant/tool")
    where = f"{label}[{i}]"
    calls = turn.get("tool_calls")
    if role == "assistant" and calls is not None:
        out: dict[str, Any] = {"role": role, "content": "" if turn.get("content") is None else
                               _text(turn.get("content"), f"{where}.content", turn, "content"),
                               "tool_calls": _tool_calls(calls, f"{where}.tool_calls")}
        return out
    out = _turn(role, turn, "content", f"{where}.content")
    if role == "tool":
        for key in ("tool_call_id", "name"):
            value = turn.get(key)
            if value is not None and not isinstance(value, str):
                raise BadRow(f"{where}.{key} must be a string, got {_type_name(value)}")
            if value is not None:
                out[key] = value
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI tool calls [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]."""
    if not isinstance(calls, list) or not calls:
        raise BadRow(f"{where} must be a non-empty array")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRow(f"{where}[{j}].function.name must be a non-empty string")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):  # some datasets store the arguments as an object: send JSON text
            args = json.dumps(args, ensure_ascii=False)
        item: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call.get("id"), str):
            item = {"id": call["id"], **item}
        out.append(item)
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
        for t in value
    ):
        raise BadRow("tools must be an array of {\"type\": \"function\", \"function\": {\"name\", ...}} objects")
    return value


def _conversations(value: Any, label: str) -> list[dict[str, str]]:
    if value.__class__ is not list:
        raise BadRow(f"{label} must be an array, got {_type_name(value)}")
    out = []
    for i, turn in enumerate(value):
        # fast path for well-formed from/value turns; _conversation_turn explains everything else
        if turn.__class__ is dict:
            speaker = turn.get("from")
            content = turn.get("value")
            if speaker.__class__ is str and content.__class__ is str:
                role = _SHAREGPT_ROLES.get(speaker)
                if role is not None and (role != "user" or (content and not content.isspace())):
                    out.append({"role": role, "content": content})
                    continue
        out.append(_conversation_turn(turn, label, i))
    return out


def _conversation_turn(turn: Any, label: str, i: int) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise BadRow(f"{label}[{i}] must be an object, got {_type_name(turn)}")
    role_key, content_key = "from", "value"
    speaker = turn.get("from")
    if speaker is None and turn.get("role") is not None:  # SpecForge-style role/content keys
        role_key, content_key = "role", "content"
        speaker = turn["role"]
    if speaker is None:
        raise BadRow(f"{label}[{i}] has no 'from' (or 'role')")
    if not isinstance(speaker, str):
        raise BadRow(f"{label}[{i}].{role_key} must be a string, got {_type_name(speaker)}")
    role = _SHAREGPT_ROLES.get(speaker)
    if role is None:
        raise BadRow(f"{label}[{i}].{role_key} is {speaker!r}: expected human/gpt/system/user/assistant")
    return _turn(role, turn, content_key, f"{label}[{i}].{content_key}")


def _turn(role: str, turn: dict[str, Any], key: str, where: str) -> dict[str, str]:
    content = _text(turn.get(key), where, turn, key)
    if role == "user" and (not content or content.isspace()):
        raise BadRow(f"{where} is empty (user turn)")
    return {"role": role, "content": content}


def _prompt(value: Any, label: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        if not value or value.isspace():
            raise BadRow(f"{label} is empty")
        return [{"role": "user", "content": value}]
    if isinstance(value, list):  # TRL conversational prompt: a list of messages
        return _messages(value, label)
    raise BadRow(f"{label} must be a string, got {_type_name(value)}")


_PARSERS = {
    SHAPE_MESSAGES: _messages,
    SHAPE_CONVERSATIONS: _conversations,
    SHAPE_PROMPT: _prompt,
}
AUTO_FIELDS = (
    ("messages", SHAPE_MESSAGES),
    ("conversations", SHAPE_CONVERSATIONS),
    ("prompt", SHAPE_PROMPT),
)


class RowConverter:
    """Turns one row (a dict) into (shape, messages, source_id) or raises ``_BadRow``."""

    def __init__(self, spec: DatasetConfig) -> None:
        self.system_prompt = spec.system_prompt or None
        self.mapped: tuple[str, str, list[str]] | None = None  # (shape, path, parts)
        for field, shape in (
            (spec.messages_field, SHAPE_MESSAGES),
            (spec.conversations_field, SHAPE_CONVERSATIONS),
            (spec.prompt_field, SHAPE_PROMPT),
        ):
            if field is not None:
                self.mapped = (shape, field, field.split("."))
        self.id_field = spec.id_field
        self.id_parts = spec.id_field.split(".") if spec.id_field else []

    def convert(self, row: Any) -> tuple[str, list[dict[str, str]], str | None]:
        if row.__class__ is not dict:
            raise BadRow(f"row is a JSON {_type_name(row)}, expected an object")
        if self.mapped is None:
            if (value := row.get("messages")) is not None:
                shape, label = SHAPE_MESSAGES, "messages"
                messages = _messages(value, label)
            elif (value := row.get("conversations")) is not None:
                shape, label = SHAPE_CONVERSATIONS, "conversations"
                messages = _conversations(value, label)
            elif (value := row.get("prompt")) is not None:
                shape, label = SHAPE_PROMPT, "prompt"
                if value.__class__ is str and value and not value.isspace() and self.system_prompt is None:
                    return shape, [{"role": "user", "content": value}], self._source_id(row)
                messages = _prompt(value, label)
            else:
                nulls = [k for k, _ in AUTO_FIELDS if k in row]
                note = f"; {', '.join(nulls)} {'is' if len(nulls) == 1 else 'are'} null" if nulls else ""
                raise BadRow(f"no 'messages', 'conversations' or 'prompt' field (keys: {_keys(row)}){note}")
        else:
            shape, label, parts = self.mapped
            value = _lookup(row, label, parts)
            if value is _MISSING:
                raise BadRow(f"field {label!r} not found (keys: {_keys(row)})")
            if value is None:
                raise BadRow(f"field {label!r} is null")
            messages = _PARSERS[shape](value, label)

        tools = row.get("tools") if shape == SHAPE_MESSAGES else None
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            raise BadRow(f"{label} has no user turn" if value else f"{label} is empty")
        last = messages[-1]["role"]
        if last != "user" and not (last == "tool" and tools):
            if not any(m["role"] == "user" for m in messages):
                raise BadRow(f"{label} has no user turn")
            raise BadRow(f"last turn is {last!r}, not 'user', after dropping trailing assistant turns")
        if self.system_prompt is not None and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if tools:
            return shape, {"messages": messages, "tools": _tools(tools)}, self._source_id(row)  # type: ignore[return-value]
        return shape, messages, self._source_id(row)

    def _source_id(self, row: dict[str, Any]) -> str | None:
        if self.id_field is None:
            source_id = row.get("id")
            if source_id is None:
                source_id = row.get("idx")
            if source_id is None or source_id.__class__ is str:
                return source_id
            return _id_text(source_id)
        value = _lookup(row, self.id_field, self.id_parts)
        if value is _MISSING:
            raise BadRow(f"id field {self.id_field!r} not found (keys: {_keys(row)})")
        text = _id_text(value)
        if text is None:
            raise BadRow(f"id field {self.id_field!r} must be a string or an integer, got {_type_name(value)}")
        return text


def _id_text(value: Any) -> str | None:
    if value.__class__ is str:
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return None
