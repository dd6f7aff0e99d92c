"""The language check (#30), from a well-kept library (the near-duplicate checks: synthwatch.quality.neardup).

- language: lingua-language-detector, restricted to the configured languages (its models load per language,
  lazily: a detector over 5 languages holds only those 5 models, and deciding among few is faster). The
  answer's first ``max_chars`` characters are compared with the prompt's language (the last user message)
  or a configured ISO 639-1 code. Texts shorter than ``min_chars`` pass (too short to tell).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..check_extended import LanguageSettings
from .checks import RecordView
from .verdicts import PASS, Verdict


class Detector:
    """lingua over a fixed set of ISO 639-1 codes; detect() answers a code or None (undecided)."""

    def __init__(self, codes: list[str]) -> None:
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder  # noqa: PLC0415 - check processes only

        langs = []
        for code in codes:
            try:
                langs.append(Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper())))
            except (AttributeError, ValueError):
                raise ValueError(f"unknown language code {code!r} (ISO 639-1, e.g. en, de, fr)") from None
        if len(langs) == 1:  # lingua needs two to choose between; a lone language is decided by its confidence
            other = Language.ENGLISH if langs[0] != Language.ENGLISH else Language.GERMAN
            langs.append(other)
        # models load at start (in the check process), not on the first record, whose time budget they would eat
        self.detector = LanguageDetectorBuilder.from_languages(*langs).with_preloaded_language_models().build()

    def detect(self, text: str) -> str | None:
        lang = self.detector.detect_language_of(text)
        return None if lang is None else lang.iso_code_639_1.name.lower()


def _prompt_text(v: RecordView) -> str:
    for m in reversed(v.prompt_messages()):
        if isinstance(m, dict) and m.get("role", "user") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])
    return ""


class LanguageCheck:
    """The `language` check: the answer's language against the prompt's or a configured one."""

    def __init__(self, s: LanguageSettings) -> None:
        self.s = s
        codes = list(s.languages)
        if s.expect != "prompt" and s.expect not in codes:
            codes.append(s.expect)
        self.detector = Detector(codes)
        self.__name__ = "language"

    def __call__(self, record: RecordView, row: Mapping[str, Any]) -> Verdict:
        text = record.content[: self.s.max_chars]
        if len(text.strip()) < self.s.min_chars:
            return PASS
        if self.s.expect == "prompt":
            prompt = _prompt_text(record)[: self.s.max_chars]
            if len(prompt.strip()) < self.s.min_chars:
                return PASS
            want = self.detector.detect(prompt)
            if want is None:
                return PASS
        else:
            want = self.s.expect
        got = self.detector.detect(text)
        if got is None:
            return Verdict("pass", None, None, "language undecided")
        if got == want:
            return Verdict("pass", None, got)
        return Verdict("fail", None, got, f"the answer is in {got}, the expected language is {want}")
