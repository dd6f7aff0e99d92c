"""The extended checks' settings: verifiers, user checks, TOML rules, language, near-duplicates (#30).

Like synthwatch.check_catalog (which embeds these in ``[checks]``), this module imports nothing of synthwatch, so
the run config validates without importing the checks. The checks themselves are synthwatch.quality.extended;
their verdicts are rows of ``check_verdict`` (synthwatch.quality.verdicts). Every extended check has a catalogue
name (``verify_math``, ``user:boxed``, ``rule:has_boxed``, ``language``, ``near_duplicate``) that keys its rates,
its alarm rule and its auto-pause, exactly as a built-in check's name does.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_RE = re.compile(r"^[a-z0-9_][a-z0-9_.-]{0,47}$")
VERIFIER_KINDS = ("math", "exact", "regex", "choice", "json_schema")
ENTRY_POINT_GROUP = "synthwatch.checks"


def _slug(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError(f"name {v[:60]!r} must be 1-48 characters of a-z 0-9 _ . - (starting with a letter, digit or _)")
    return v


class VerifierSettings(BaseModel):
    """`[[checks.verifiers]]`: compare the record's final answer (its content) with a field of the dataset row."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["math", "exact", "regex", "choice", "json_schema"]
    reference: str = Field("reference", min_length=1, max_length=200,
                           description="The dataset row's field holding the reference answer (kept with the record).")
    name: str | None = Field(None, description="Catalogue name (default verify_<kind>).")
    case_sensitive: bool = Field(False, description="exact: compare case-sensitively.")
    answer_regex: str | None = Field(None, description="exact/choice: the answer is group 1 (or the match) of the "
                                     "last match of this regular expression in the content.")
    timeout_s: float = Field(5.0, gt=0, le=300, description="Time budget per record; over it the verdict is 'error'.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return _slug(v) if v is not None else None

    @field_validator("answer_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            re.compile(v)
        return v

    @property
    def check_name(self) -> str:
        return self.name or f"verify_{self.kind}"


class UserCheckSettings(BaseModel):
    """`[[checks.user]]`: a Python function named by entry point (group synthwatch.checks) or module path."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Catalogue name is user:<name>; also the entry point's name unless function is set.")
    function: str | None = Field(None, description="module:function to import instead of the entry point.")
    timeout_s: float = Field(5.0, gt=0, le=300, description="Time budget per record; over it the verdict is 'error'.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _slug(v)

    @field_validator("function")
    @classmethod
    def _function(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$", v):
            raise ValueError(f"function must be module.path:function, got {v[:80]!r}")
        return v

    @property
    def check_name(self) -> str:
        return f"user:{self.name}"


class RuleCheckSettings(BaseModel):
    """`[[checks.rule]]`: a declarative check (regex, length bounds, language) on the reasoning or the content."""

    model_config = ConfigDict(extra="forbid")

    name: str
    field: Literal["content", "reasoning"] = "content"
    regex: str | None = Field(None, description="A regular expression searched in the field.")
    must_match: bool = Field(True, description="regex: pass when it matches (false: pass when it does not).")
    min_chars: int | None = Field(None, ge=0, description="The field has at least this many characters.")
    max_chars: int | None = Field(None, ge=0, description="The field has at most this many characters.")
    language: str | None = Field(None, description="The field is in this language (ISO 639-1 code, e.g. en).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _slug(v)

    @field_validator("regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            re.compile(v)
        return v

    @model_validator(mode="after")
    def _something(self) -> RuleCheckSettings:
        if self.regex is None and self.min_chars is None and self.max_chars is None and self.language is None:
            raise ValueError(f"rule {self.name!r} checks nothing: set regex, min_chars, max_chars or language")
        return self

    @property
    def check_name(self) -> str:
        return f"rule:{self.name}"


class LanguageSettings(BaseModel):
    """`[checks.language]`: the answer's language against the prompt's or a configured one (lingua)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    expect: str = Field("prompt", description="'prompt' (the last user message's language) or an ISO 639-1 code.")
    languages: list[str] = Field(default_factory=lambda: ["en", "de", "fr", "es", "zh"], min_length=1, max_length=20,
                                 description="ISO 639-1 codes the detector chooses among (bounds its memory and time).")
    min_chars: int = Field(20, ge=1, description="Shorter answers are not judged (their verdict is pass).")
    max_chars: int = Field(2000, ge=20, le=100_000, description="Only the answer's first N characters are read.")


class NearDuplicateSettings(BaseModel):
    """`[checks.near_duplicate]`: MinHash LSH over the run's answers (datasketch), scoped across prompts; the
    samples of one prompt compared with each other are a check of their own (within_prompt); an existing dataset
    (against) is part of the index (docs/checks.md "Near-duplicates")."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="near_duplicate: an answer is a near-duplicate of another prompt's "
                          "answer (or of a row of `against`); a prompt's own samples are not compared with each other.")
    within_prompt: bool = Field(False, description="near_duplicate_in_prompt: a sample is a near-duplicate of an "
                                "earlier sample of the same prompt (k samples that repeat each other).")
    threshold: float = Field(0.8, gt=0.0, lt=1.0, description="Estimated Jaccard similarity of the shingles.")
    shingling: Literal["auto", "words", "chars"] = Field(
        "auto", description="auto: word shingles, and character shingles for the scripts written without spaces "
        "(Chinese, Japanese, Thai, Lao, Khmer, Myanmar, Tibetan) in the same text; words: word shingles only; "
        "chars: character shingles only.")
    shingle_size: int = Field(3, ge=1, le=10, description="Tokens per shingle (words, or characters of a script "
                              "written without spaces).")
    num_perm: int = Field(64, ge=16, le=256, description="MinHash permutations (memory per record grows with it).")
    max_records: int = Field(250_000, ge=1, description="Answers kept in the index (the rows of `against` count); "
                             "later ones are checked only (memory: about 2 KB per answer at num_perm 64, docs/checks.md).")
    min_chars: int = Field(50, ge=1, description="Shorter answers are not judged (pass).")
    field: Literal["content", "reasoning", "both"] = "content"
    against: str | None = Field(None, max_length=4096, description="An existing dataset (JSONL or Parquet) the "
                                "answers are checked against (`synthwatch run --dedup-against FILE`); its MinHash "
                                "index is built once and kept beside the database. Never settable from the dashboard.")
    against_column: str | None = Field(None, min_length=1, max_length=200, description="The column of `against` "
                                       "holding the text (default: the first of completion, response, output, "
                                       "answer, content, text, or the last assistant message of messages).")


class ExtendedSettings(BaseModel):
    """How the extended checks run: off the writer thread, in a process pool."""

    model_config = ConfigDict(extra="forbid")

    pool_processes: int = Field(1, ge=1, le=32, description="Processes that run the extended checks.")
    queue_max: int = Field(10_000, ge=10, le=10_000_000,
                           description="Records waiting for their checks; beyond it the writer waits (backpressure).")
    drain_grace_s: float = Field(10.0, ge=0, le=600,
                                 description="On shutdown, time to finish queued checks; the rest stay pending.")
    row_fields: list[str] = Field(default_factory=list, max_length=50,
                                  description="Dataset row fields kept with each record for user checks (the "
                                  "verifiers' reference fields are kept anyway).")
