"""Your own checks (#30): Python functions (entry point group ``synthwatch.checks`` or ``module:function``) and
declarative TOML rules (regex, length bounds, language), turned into Checks (synthwatch.quality.verdicts.Check).

A user function takes the record view the built-in checks get (synthwatch.quality.checks.RecordView) and, when it
accepts two arguments, the dataset row's fields (a dict). It returns any of:

- a :class:`~synthwatch.quality.verdicts.Verdict`;
- ``True`` / ``False`` (pass / fail);
- ``(passed, reason)``;
- a dict with ``passed`` (or ``state``) and optional ``score``, ``label``, ``reason``.

Anything else, an exception, or running over its time budget is that check's 'error' verdict on that record
(synthwatch.quality.check_pool), never the worker's.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from ..check_catalog import CheckSettings
from ..check_extended import ENTRY_POINT_GROUP, LanguageSettings, RuleCheckSettings, UserCheckSettings
from .checks import RecordView
from .verdicts import STATES, Verdict

CheckFn = Callable[[RecordView, Mapping[str, Any]], Verdict]


class UserCheckError(Exception):
    """A user check cannot be loaded (no such entry point, module or function)."""


def installed_entry_points() -> dict[str, str]:
    """Entry points of group synthwatch.checks installed in this environment: {name: module:function}."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_function(s: UserCheckSettings) -> Callable[..., Any]:
    if s.function:
        module, _, attr = s.function.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise UserCheckError(f"user check {s.name!r}: cannot import {s.function}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a module that raises as it imports (SyntaxError, RuntimeError...)
            raise UserCheckError(f"user check {s.name!r}: importing {s.function} failed: "
                                 f"{exc.__class__.__name__}: {exc}"[:500]) from None
    else:
        eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == s.name]
        if not eps:
            raise UserCheckError(f"user check {s.name!r}: no entry point {s.name!r} in group {ENTRY_POINT_GROUP}"
                                 " (install the package that provides it, or set function = \"module:function\")")
        try:
            obj = eps[0].load()
        except Exception as exc:
            raise UserCheckError(f"user check {s.name!r}: entry point {eps[0].value} failed to load: "
                                 f"{exc.__class__.__name__}: {exc}") from None
    if not callable(obj):
        raise UserCheckError(f"user check {s.name!r}: {s.function or s.name} is not callable")
    return obj  # type: ignore[no-any-return]


def check_loadable(settings: CheckSettings | None) -> None:
    """Every user check of a run's settings imports and is callable, or UserCheckError naming the first that does
    not (#35): a run, an import or a recompute refuses to start rather than give every record an 'error' verdict.
    The function is imported in this process, as the check processes will import it."""
    for u in settings.user if settings is not None else ():
        load_function(u)


def loadable_error(raw_checks: Mapping[str, Any] | None) -> str | None:
    """check_loadable on a raw `[checks]` table: the refusal's one line, or None (a table that does not validate is
    left to the settings' own error)."""
    if not raw_checks or not raw_checks.get("user"):
        return None
    try:
        settings = CheckSettings.model_validate(dict(raw_checks))
    except ValueError:
        return None
    try:
        check_loadable(settings)
    except UserCheckError as exc:
        return str(exc)
    return None


def _takes_row(fn: Callable[..., Any]) -> bool:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return True
    return len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def coerce(result: Any) -> Verdict:
    """A user function's return value as a Verdict; a value of another shape is an 'error' verdict."""
    if isinstance(result, Verdict):
        return result
    if isinstance(result, bool):
        return Verdict("pass" if result else "fail")
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        return Verdict("pass" if result[0] else "fail", reason=None if result[1] is None else str(result[1]))
    if isinstance(result, Mapping):
        state = result.get("state")
        if state is None and isinstance(result.get("passed"), bool):
            state = "pass" if result["passed"] else "fail"
        if state in STATES:
            score = result.get("score")
            return Verdict(str(state), float(score) if isinstance(score, int | float) and not isinstance(score, bool)
                           else None, None if result.get("label") is None else str(result.get("label")),
                           None if result.get("reason") is None else str(result.get("reason")))
    return Verdict("error", reason=f"the check returned {type(result).__name__}, not a verdict (True/False, "
                                   "(passed, reason), a dict or a Verdict)")


def make_user_check(s: UserCheckSettings) -> CheckFn:
    fn = load_function(s)
    with_row = _takes_row(fn)

    def check(record: RecordView, row: Mapping[str, Any]) -> Verdict:
        return coerce(fn(record, dict(row)) if with_row else fn(record))

    check.__name__ = s.check_name
    return check


def make_rule_check(s: RuleCheckSettings, language: LanguageSettings | None = None) -> CheckFn:
    """A declarative rule: every condition set must hold (regex, length bounds, language)."""
    rx = re.compile(s.regex) if s.regex is not None else None
    detector = None
    if s.language is not None:
        from .language import Detector  # noqa: PLC0415 - lingua loads only where a language is checked

        langs = sorted({*(language.languages if language else []), s.language})
        detector = Detector(langs)

    def check(record: RecordView, row: Mapping[str, Any]) -> Verdict:
        text = record.content if s.field == "content" else record.reasoning
        n = len(text)
        if s.min_chars is not None and n < s.min_chars:
            return Verdict("fail", float(n), None, f"{s.field} has {n} characters, fewer than {s.min_chars}")
        if s.max_chars is not None and n > s.max_chars:
            return Verdict("fail", float(n), None, f"{s.field} has {n} characters, more than {s.max_chars}")
        if rx is not None:
            found = rx.search(text) is not None
            if found != s.must_match:
                return Verdict("fail", None, None, f"{s.field} {'does not match' if s.must_match else 'matches'}"
                                                   f" /{s.regex}/")
        if detector is not None and s.language is not None:
            got = detector.detect(text)
            if got is not None and got != s.language:
                return Verdict("fail", None, got, f"{s.field} is in {got}, not {s.language}")
        return Verdict("pass")

    check.__name__ = s.check_name
    return check
