"""Server values made safe where they are read: counts in range, JSON no deeper than what can be stored.

A server's reply is untrusted input. Two of its values could stop the writer if they reached the database:

- a usage count outside ``0..MAX_COUNT`` (e.g. ``18446744073709551615``, or ``3000000000`` for a 4-byte column)
  is impossible for a real reply (no context holds 2^31 tokens): it is recorded as a problem of the record
  (``extra_json.problems``) and its column stays empty; the usage object is kept as sent in ``usage_json``;
- JSON nested deeper than ``MAX_JSON_DEPTH``: orjson parses up to 1,024 levels but serialises only 254, and a
  stored value sits a few levels inside our own wrappers (``extra_json``, ``turns_json``). Such a reply is
  refused when it is parsed, as its own error kind ``reply_too_deep`` (workers/client.py).

NUL in text (which PostgreSQL text cannot hold) is handled where the row is built (workers/series.py
``record_columns``), the same on every backend. docs/limits.md lists every limit.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

import orjson

MAX_COUNT = 2**31 - 1  # the largest token count taken as real; a BIGINT column holds far more
MAX_JSON_DEPTH = 128  # nesting of a parsed reply; storing it adds < 10 levels, orjson serialises 254
# a text of at most this many bytes cannot nest deeper than MAX_JSON_DEPTH (each level takes an opening and a
# closing bracket): callers test the length before calling may_be_deep, the usual stream event is shorter
DEEP_MIN_BYTES = 2 * MAX_JSON_DEPTH
_COUNT_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


class _Problems(Protocol):
    def add(self, msg: str) -> None: ...


def check_usage(usage: dict[str, Any], problems: _Problems) -> None:
    """Note every impossible count of a usage object (top level and its ``*_details`` objects) in ``problems``."""
    for key, v in usage.items():
        if type(v) is int:
            if not 0 <= v <= MAX_COUNT and (key in _COUNT_KEYS or key.endswith("_tokens")):
                problems.add(_impossible(f"usage.{key}", v))
        elif type(v) is dict and key.endswith("_details"):
            for sub, sv in v.items():
                if type(sv) is int and not 0 <= sv <= MAX_COUNT:
                    problems.add(_impossible(f"usage.{key}.{sub}", sv))


def _impossible(where: str, v: int) -> str:
    # the key is the server's: cut, so that a problem stays short whatever it sent (the number has <= 20 digits)
    return f"{where[:120]} = {v} is impossible (outside 0..{MAX_COUNT:,}): not stored as a count"


def may_be_deep(raw: bytes | bytearray) -> bool:
    """A cheap pre-test: only a text with more than MAX_JSON_DEPTH brackets can be too deep. It runs on every event of
    every stream, so a text too short to hold that many bracket pairs is answered by its length alone (it is asked
    only of JSON that parsed, whose brackets are balanced; a scan of each ~200-byte chunk event cost 5 % of a short
    record's CPU); longer ones are counted (two scans in C)."""
    return len(raw) > DEEP_MIN_BYTES and raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH


def depth_over(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``obj`` (parsed JSON) nests containers more than ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return True
        if type(o) is dict:
            stack.extend((v, d + 1) for v in o.values() if type(v) is dict or type(v) is list)
        elif type(o) is list:
            stack.extend((v, d + 1) for v in o if type(v) is dict or type(v) is list)
    return False


def too_deep(raw: bytes, obj: Any) -> bool:
    return may_be_deep(raw) and depth_over(obj)


# A reply body at least this long that is not streamed is parsed by the standard library's json after its bytes
# are let go (loads_reply): orjson holds its own copy of the document while it builds the Python objects, so a 60
# MB answer was held three times at once (the body, orjson's copy, the text); this way twice (#39).
LARGE_REPLY_BYTES = 8 * 2**20
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # an escaped UTF-16 surrogate (half of a pair, or alone)


def loads_reply(raw: bytes | bytearray, large_bytes: int = LARGE_REPLY_BYTES) -> Any:
    """``orjson.loads(raw)``, and the same answer for a large reply in a bytearray, which is emptied to free it.

    The large path decodes the bytes (strict UTF-8), empties ``raw`` and parses the text with the standard library,
    held to what orjson accepts: NaN, Infinity and numbers out of a double's range are refused, integers beyond 64
    bits become floats. A body orjson might read differently stays on orjson: one that is not valid UTF-8, one that
    escapes a UTF-16 surrogate (orjson refuses a lone one), one with enough brackets to be deep (the standard
    library recurses). Either way a body that is not JSON raises ``json.JSONDecodeError`` (orjson's is one).
    ``large_bytes``: the size from which the large path is taken (tests/test_long_texts.py compares the two paths
    on small bodies)."""
    if type(raw) is not bytearray or len(raw) < large_bytes or may_be_deep(raw) \
            or _SURROGATE_ESCAPE.search(raw):
        return orjson.loads(raw)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return orjson.loads(raw)
    raw.clear()
    return json.loads(text, parse_constant=_refused_constant, parse_float=_finite_float, parse_int=_int_as_orjson)


def _refusal(msg: str, value: str) -> json.JSONDecodeError:
    # the parser's hooks are not told where the value is: the message says what, without a made-up position
    exc = json.JSONDecodeError(msg, value, 0)
    exc.args = (f"{msg}: {value[:40]}",)
    return exc


def _refused_constant(name: str) -> Any:
    raise _refusal("not a JSON value (orjson refuses it too)", name)


def _finite_float(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise _refusal("number out of a double's range", s)
    return v


def _int_as_orjson(s: str) -> int | float:
    if len(s) > 21:  # beyond 64 bits whatever its digits (and int() refuses over 4,300 of them)
        return _finite_float(s)
    v = int(s)
    return v if -2**63 <= v < 2**64 else float(v)
