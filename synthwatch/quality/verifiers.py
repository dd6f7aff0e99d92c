"""Answer verifiers (#30): a record's final answer (its content) against a reference field of its dataset row.

- ``math``: HF's math-verify parses both sides (LaTeX, \\boxed{}, plain expressions) and compares them
  symbolically. Its timeouts are signal-based (signal.alarm), so it runs in the main thread of a check-pool
  process (synthwatch.quality.check_pool), never in a thread;
- ``exact``: the answer (the content, or group 1 of the last match of ``answer_regex``) equals the reference,
  whitespace collapsed, case-insensitive unless ``case_sensitive``;
- ``regex``: the reference is a regular expression searched in the answer;
- ``choice``: the option letter (A-J) the answer picks equals the reference's;
- ``json_schema``: the content (a JSON document, code fences allowed) is valid against the schema in the
  reference field (a JSON object or its text), through jsonschema.

A missing reference is the verifier's 'error' verdict, not a failure: the dataset, not the model, is wrong.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from ..check_extended import VerifierSettings
from .checks import RecordView
from .verdicts import Verdict

_WS = re.compile(r"\s+")
_BOXED = re.compile(r"\\boxed\s*\{")
# "the answer is (B)", "Answer: B", "**B**", "\boxed{B}", "B)" or a bare letter
_CHOICE_PATTERNS = (
    re.compile(r"\\boxed\s*\{\s*\(?([A-J])\)?\s*\}"),
    re.compile(r"answer\s*(?:is|:)?\s*[:\-]?\s*\**\(?([A-J])\)?(?![A-Za-z])", re.I),
    re.compile(r"^\s*\**\(?([A-J])\)?\**[.):]?\s*$", re.M),
    re.compile(r"(?<![A-Za-z])\(([A-J])\)(?![A-Za-z])"),
)
SHOWN = 80  # characters of an answer or a reference a reason quotes


def _show(s: str) -> str:
    s = _WS.sub(" ", s).strip()
    return repr(s if len(s) <= SHOWN else s[: SHOWN - 1] + "…")


def reference_of(row: Mapping[str, Any], field: str) -> Any:
    """The reference value at `field` (a dotted path into nested objects allowed); None when absent."""
    if field in row:
        return row[field]
    value: Any = row
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _ref_text(ref: Any) -> str:
    if isinstance(ref, str):
        return ref
    if isinstance(ref, bool) or ref is None:
        return str(ref)
    if isinstance(ref, int | float):
        return repr(ref) if not (isinstance(ref, float) and ref.is_integer()) else str(int(ref))
    return orjson.dumps(ref).decode()


def _last_group(pattern: str | None, text: str) -> str | None:
    if not pattern:
        return text
    last = None
    for m in re.finditer(pattern, text):
        last = m
    if last is None:
        return None
    return last.group(1) if last.re.groups else last.group(0)


def _norm(s: str, case_sensitive: bool) -> str:
    s = _WS.sub(" ", s).strip()
    return s if case_sensitive else s.casefold()


def verify_exact(s: VerifierSettings, v: RecordView, ref: Any) -> Verdict:
    answer = _last_group(s.answer_regex, v.content)
    if answer is None:
        return Verdict("fail", 0.0, None, f"no answer matching {s.answer_regex!r} in the content")
    want = _ref_text(ref)
    if _norm(answer, s.case_sensitive) == _norm(want, s.case_sensitive):
        return Verdict("pass", 1.0)
    return Verdict("fail", 0.0, None, f"answer {_show(answer)} differs from the reference {_show(want)}")


def verify_regex(s: VerifierSettings, v: RecordView, ref: Any) -> Verdict:
    pattern = _ref_text(ref)
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        return Verdict("error", None, None, f"the reference is not a regular expression: {exc}")
    answer = _last_group(s.answer_regex, v.content)
    if answer is not None and rx.search(answer):
        return Verdict("pass", 1.0)
    return Verdict("fail", 0.0, None, f"the answer does not match {_show(pattern)}")


def choice_letter(text: str) -> str | None:
    """The option letter an answer picks (its last statement of one), or None."""
    for rx in _CHOICE_PATTERNS:
        found = rx.findall(text)
        if found:
            return str(found[-1]).upper()
    return None


def verify_choice(s: VerifierSettings, v: RecordView, ref: Any) -> Verdict:
    want = choice_letter(_ref_text(ref)) or _ref_text(ref).strip().upper()[:1]
    answer = _last_group(s.answer_regex, v.content)
    got = choice_letter(answer) if answer is not None else None
    if got is None:
        return Verdict("fail", 0.0, None, "no option letter (A-J) found in the answer")
    if got == want:
        return Verdict("pass", 1.0, got)
    return Verdict("fail", 0.0, got, f"picked {got}, the reference is {want or '?'}")


_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A checked validator per schema text: most datasets share a few schemas, and checking a schema costs more
    than validating a document against it (measured in bench/bench_checks.py)."""
    import jsonschema  # noqa: PLC0415 - loaded by the check processes that verify structured output only

    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def verify_json_schema(s: VerifierSettings, v: RecordView, ref: Any) -> Verdict:
    import jsonschema  # noqa: PLC0415 - loaded by the check processes that verify structured output only

    schema = ref
    if isinstance(ref, str):
        try:
            schema = orjson.loads(ref)
        except orjson.JSONDecodeError:
            return Verdict("error", None, None, "the reference is not a JSON schema (not JSON)")
    if not isinstance(schema, dict | bool):
        return Verdict("error", None, None, "the reference is not a JSON schema (not an object)")
    try:
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode())
    except jsonschema.SchemaError as exc:
        return Verdict("error", None, None, f"the reference schema is invalid: {exc.message}")
    except (TypeError, orjson.JSONEncodeError) as exc:
        return Verdict("error", None, None, f"the reference schema cannot be read: {exc}")
    text = v.content
    m = _FENCE.match(text)
    if m:
        text = m.group(1)
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return Verdict("fail", 0.0, None, f"the content is not JSON: {exc}")
    err = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if err is None:
        return Verdict("pass", 1.0)
    where = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return Verdict("fail", 0.0, None, f"{where}: {err.message}")


def verify_math(s: VerifierSettings, v: RecordView, ref: Any) -> Verdict:
    from math_verify import parse, verify  # noqa: PLC0415 - sympy loads in the check processes only

    secs = max(1, math.ceil(s.timeout_s))
    want = _ref_text(ref)
    gold = parse(want if ("$" in want or _BOXED.search(want)) else f"${want}$", parsing_timeout=secs)
    if not gold:
        gold = parse(want, parsing_timeout=secs)
    if not gold:
        return Verdict("error", None, None, f"math-verify could not read the reference {_show(want)}")
    answer = parse(v.content, parsing_timeout=secs)
    if not answer:
        return Verdict("fail", 0.0, None, "no final answer math-verify can read in the content")
    # the parsed value, not the matched text: the text keeps the answer's markdown ("72**." for "**72**.")
    shown = str(answer[0])
    if verify(gold, answer, timeout_seconds=secs):
        return Verdict("pass", 1.0, shown[:100])
    return Verdict("fail", 0.0, shown[:100], f"answer {_show(shown)} is not {_show(want)}")


def warm_up(s: VerifierSettings) -> None:
    """Load what a verifier needs and run it once (the check process does this before its first record, outside any
    record's time budget): math-verify, sympy and the LaTeX grammar take seconds to load. Raises when it cannot."""
    if s.kind == "math":
        from math_verify import parse, verify  # noqa: PLC0415 - sympy loads in the check processes only

        if not verify(parse("$\\frac{1}{2}$", parsing_timeout=60), parse("0.5", parsing_timeout=60),
                      timeout_seconds=60):
            raise RuntimeError("math-verify does not find 1/2 = 0.5")


VERIFIERS: dict[str, Callable[[VerifierSettings, RecordView, Any], Verdict]] = {
    "math": verify_math, "exact": verify_exact, "regex": verify_regex, "choice": verify_choice,
    "json_schema": verify_json_schema,
}


def make_verifier(s: VerifierSettings) -> Callable[[RecordView, Mapping[str, Any]], Verdict]:
    """A Check (synthwatch.quality.verdicts.Check) for one configured verifier."""
    fn = VERIFIERS[s.kind]

    def check(record: RecordView, row: Mapping[str, Any]) -> Verdict:
        ref = reference_of(row, s.reference)
        if ref is None:
            return Verdict("error", None, None, f"the dataset row has no reference field {s.reference!r}")
        return fn(s, record, ref)

    check.__name__ = s.check_name
    return check
