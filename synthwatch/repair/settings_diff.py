"""A settings change in words a person can read: one line per value that changed, never a whole blob (#26).

A config version stores each change with its whole old and new value (``config_version.changes_json``): an
endpoint list is one change. Printed as it is, ``synthwatch fix --base-url`` dumped every endpoint whole, TLS
file paths and header settings included. Here each changed leaf gets its own line, by dotted path
(``endpoints[0].base_url``); values that say where credentials live are never shown, only that they changed.
"""

from __future__ import annotations

from typing import Any

import orjson

# keys whose values are never printed: where TLS keys and certificates are, request headers' settings, anything
# that names or holds a secret
HIDDEN_KEYS = frozenset({"tls", "headers_env", "headers", "api_key", "api_key_env", "authorization", "password",
                         "token", "secret"})
MAX_VALUE_CHARS = 120

_MISSING = object()


def _hidden(path: str) -> bool:
    parts = [p.split("[", 1)[0].lower() for p in path.split(".")]
    return any(p in HIDDEN_KEYS or "secret" in p or "token" == p or "key" in p for p in parts)


def _show(v: Any) -> str:
    if v is _MISSING or v is None:
        return "(not set)"
    try:
        text = repr(v) if isinstance(v, str) else orjson.dumps(v).decode()
    except TypeError:  # what JSON cannot say (an integer past 64 bits): Python's own spelling
        text = repr(v)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def _leaves(path: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    if path and _hidden(path):  # one line for the whole hidden table: not even its keys (header names) are shown
        return [(path, old, new)]
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            a, b = old.get(k, _MISSING), new.get(k, _MISSING)
            if a != b:
                out.extend(_leaves(f"{path}.{k}" if path else str(k), a, b))
        return out
    if isinstance(old, list) and isinstance(new, list) and (any(isinstance(x, dict) for x in old + new)):
        out = []
        for i in range(max(len(old), len(new))):
            a = old[i] if i < len(old) else _MISSING
            b = new[i] if i < len(new) else _MISSING
            if a == b:
                continue
            if a is _MISSING or b is _MISSING:  # an item added or removed: name it by what identifies it
                item = b if a is _MISSING else a
                label = _label(item)
                out.append((f"{path}[{i}]", _MISSING if a is _MISSING else label, _MISSING if b is _MISSING else label))
            else:
                out.extend(_leaves(f"{path}[{i}]", a, b))
        return out
    return [(path, old, new)]


def _label(item: Any) -> Any:
    """An endpoint (or other table in a list) by the one safe thing that identifies it."""
    if isinstance(item, dict):
        for key in ("name", "base_url", "url", "path"):
            if isinstance(item.get(key), str):
                return item[key]
        return "(a table)"
    return item


def lines(changes: list[dict[str, Any]]) -> list[str]:
    """'endpoints[0].base_url: 'http://a/v1' -> 'http://b/v1'' for every changed leaf; hidden ones say 'changed'."""
    out = []
    for c in changes:
        for path, old, new in _leaves(str(c["path"]), c.get("old", _MISSING), c.get("new", _MISSING)):
            if _hidden(path):
                out.append(f"{path}: changed (value not shown)")
            else:
                out.append(f"{path}: {_show(old)} -> {_show(new)}")
    return out
