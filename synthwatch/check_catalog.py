"""What the checks are, declared once: their names and bits in ``record.check_flags``, what each means, the
default alarm rule of each, and the ``[checks]`` table of a run config.

A module of its own, importing nothing of synthwatch, so that the run config (synthwatch.config) validates
its ``[checks]`` table without importing the checks themselves (which import the store, which imports the
config). Adding a check starts here: its name (appended), its description and its default rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .check_extended import (
    ExtendedSettings,
    LanguageSettings,
    NearDuplicateSettings,
    RuleCheckSettings,
    UserCheckSettings,
    VerifierSettings,
)

# Order fixes the bit of each check in record.check_flags: append only, never reorder.
CHECK_NAMES: tuple[str, ...] = (
    "empty_reasoning",
    "empty_content",
    "both_empty_with_tokens",
    "truncated",
    "truncated_in_reasoning",
    "think_tags_in_content",
    "field_mismatch",
    "reasoning_tokens_no_text",
    "repetition",
    "duplicate_output",
    "token_count_mismatch",
    "template_drops_reasoning",
    "canary_failed",
    "server_drift",
    "timeout",
    "error",
    "template_tokens_in_text",
)
BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(CHECK_NAMES)}

CHECK_INFO: dict[str, str] = {
    "empty_reasoning": "ok record without reasoning while the run expects reasoning",
    "empty_content": "ok record with an empty answer (not counted when truncated or a tool call)",
    "both_empty_with_tokens": "content and reasoning both empty while usage.completion_tokens > 0 (not a tool call)",
    "truncated": "finish_reason = length",
    "truncated_in_reasoning": "finish_reason = length and no content: cut before the reasoning closed",
    "think_tags_in_content": "the run's think open/close tag is inside the content, emitted (not in a code span or quoted)",
    "field_mismatch": "no reasoning stored while the raw response holds it in a field (or inline tags) the run did not "
                      "read",
    "reasoning_tokens_no_text": "usage reports reasoning_tokens > 0 but the reasoning text is empty",
    "repetition": "the reasoning or the content ends in a block repeated at least N times (looping)",
    "duplicate_output": "reasoning + content equal to an earlier record's (leading/trailing whitespace ignored)",
    "token_count_mismatch": "re-tokenized answer vs usage.completion_tokens (sampled; needs a tokenizer)",
    "template_drops_reasoning": "the chat template renders a record without its reasoning (once per run)",
    "canary_failed": "a canary prompt's answer lacks reasoning or the known answer",
    "server_drift": "model or system_fingerprint differs from the previous record's of the same endpoint",
    "timeout": "the record finished as a timeout (share of all finished records)",
    "error": "the record finished as an error (share of all finished records)",
    "template_tokens_in_text": "a chat template's control text (<｜end▁of▁sentence｜>, <|im_end|>, <|eot_id|>, the run's "
                               "tokenizer's special tokens) written as text in the content or reasoning",
}
# checks whose denominator is every finished record; the others count ok records only
ALL_STATUS_CHECKS = frozenset({"timeout", "error"})


def check_webhook_url(url: str) -> str:
    url = url.strip()
    p = urlparse(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise ValueError(f"webhook URL must be http(s)://host/..., got {url!r}")
    return url


@dataclass(frozen=True, slots=True)
class Rule:
    name: str  # == the check it watches
    title: str
    window: int
    threshold: float
    min_records: int
    severity: str = "error"
    auto_pause: bool = False
    pause_threshold: float = 0.0
    pause_min_records: int = 1
    sticky: bool = False
    enabled: bool = True


# The one table of defaults (docs/checks.md mirrors it with each pause threshold's reason; a test keeps them in
# step). A pause threshold is chosen for its failure mode:
# - field_mismatch: one record is proof (the reasoning is in the raw response, unread): the first one pauses;
# - empty_reasoning: a reasoning model may skip thinking on a trivial prompt (a few percent), a capture or
#   parser fault empties most records; half of the last 100 (from 50 on) is a broken run, never a healthy one;
# - error / timeout: a wrong model name, a base URL without /v1 or a dead port fails every request; 90% of the
#   last 200 finished records (from 20 on) pauses those within seconds, while an overloaded server that fails
#   a tenth of its requests raises the (non-pausing) alarm only.
DEFAULT_RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("field_mismatch", "Reasoning is in a field this run does not read", 100, 0.0, 1,
         auto_pause=True, pause_threshold=0.0, pause_min_records=1, sticky=True),
    Rule("empty_reasoning", "Empty reasoning", 100, 0.05, 20,
         auto_pause=True, pause_threshold=0.5, pause_min_records=50),
    Rule("reasoning_tokens_no_text", "Reasoning tokens reported but no reasoning text", 100, 0.05, 20),
    Rule("both_empty_with_tokens", "Empty answer although tokens were generated", 100, 0.02, 20),
    Rule("empty_content", "Empty content", 100, 0.05, 20),
    Rule("truncated", "Cut at max_tokens", 100, 0.10, 20, severity="warning"),
    Rule("truncated_in_reasoning", "Truncated before the reasoning ended", 100, 0.05, 20),
    Rule("think_tags_in_content", "Think tags left inside the content", 100, 0.02, 20),
    Rule("template_tokens_in_text", "Template tokens written as text", 100, 0.02, 20),
    Rule("repetition", "Repetitive / looping text", 100, 0.05, 20, severity="warning"),
    Rule("duplicate_output", "Duplicate outputs across records", 100, 0.05, 20, severity="warning"),
    Rule("token_count_mismatch", "Token count disagrees with the server's usage", 20, 0.20, 5,
         severity="warning"),
    Rule("template_drops_reasoning", "The chat template drops the reasoning", 1, 0.0, 1, sticky=True),
    Rule("canary_failed", "Canary prompt failed", 10, 0.0, 1, sticky=True),
    Rule("server_drift", "The server changed mid-run", 100, 0.0, 1, severity="warning", sticky=True),
    Rule("timeout", "Timeouts", 200, 0.05, 20, auto_pause=True, pause_threshold=0.9, pause_min_records=20),
    Rule("error", "Errors", 200, 0.10, 20, auto_pause=True, pause_threshold=0.9, pause_min_records=20),
)}


# The near-duplicate checks (extended: a verdict per record, no bit): across prompts (an answer repeats another
# prompt's, or a row of an existing dataset) and within a prompt (a sample repeats an earlier sample of its prompt).
NEAR_DUPLICATE = "near_duplicate"
NEAR_DUPLICATE_IN_PROMPT = "near_duplicate_in_prompt"
# extended checks whose default rule is their own (the others have extended_rule's): k samples of a prompt may
# share a sentence or two (easy prompts converge), but a quarter of the samples repeating an earlier one of their
# prompt is a sampling that does not vary (temperature 0, a seed or cache the server reuses): a warning, no pause
EXTENDED_RULES: dict[str, Rule] = {r.name: r for r in (
    Rule(NEAR_DUPLICATE_IN_PROMPT, "Samples of a prompt repeat each other", 100, 0.25, 20, severity="warning"),
)}


def extended_rule(name: str) -> Rule:
    """An extended check's default rule: a warning at 5% of the last 100 judged records (from 20 on), no pause
    (EXTENDED_RULES: a check with its own). A run turns auto-pause on per check in [checks.rules."<name>"], as for
    a built-in check."""
    return EXTENDED_RULES.get(name) or Rule(name, f"Check {name} fails", 100, 0.05, 20, severity="warning")


class RuleOverride(BaseModel):
    """Per-run changes to one rule; unset fields keep the default."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    window: int | None = Field(None, ge=1, le=100_000)
    threshold: float | None = Field(None, ge=0.0, le=1.0)
    min_records: int | None = Field(None, ge=1, le=100_000)
    severity: Literal["warning", "error"] | None = None
    auto_pause: bool | None = None
    pause_threshold: float | None = Field(None, ge=0.0, le=1.0)
    pause_min_records: int | None = Field(None, ge=1, le=100_000)
    sticky: bool | None = None


class CanaryPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    answer: str = Field(min_length=1, description="Text the answer (content) must contain.")


DEFAULT_CANARIES = [
    CanaryPrompt(prompt="What is 17 + 25? Think it through, then give the number.", answer="42"),
    CanaryPrompt(prompt="What is 123 + 456? Think it through, then give the number.", answer="579"),
    CanaryPrompt(prompt="What is 38 + 61? Think it through, then give the number.", answer="99"),
]


class CanarySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    every_n: int = Field(0, ge=0, le=1_000_000, description="Every Nth request is a canary (0 = off, else >= 2).")
    prompts: list[CanaryPrompt] = Field(default_factory=lambda: list(DEFAULT_CANARIES), min_length=1)

    @field_validator("every_n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v == 1:
            raise ValueError("every_n = 1 would make every request a canary; use 0 (off) or >= 2")
        return v


class WebhookSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, description="POST a JSON body here when an alarm fires (else run webhook_url).")
    timeout_s: float = Field(5.0, gt=0, le=60)
    dashboard_url: str = Field("", description="Base of the links in notifications (empty: SYNTHWATCH_DASHBOARD_URL "
                               "or the dashboard running on the run's database; none known: links are paths).")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return check_webhook_url(v) if v else None


class CheckSettings(BaseModel):
    """The `[checks]` table of a run config."""

    model_config = ConfigDict(extra="forbid")

    disabled: list[str] = Field(default_factory=list, description="Checks not computed at all.")
    rules: dict[str, RuleOverride] = Field(default_factory=dict)
    repetition_min_chars: int = Field(400, ge=20)
    repetition_min_repeats: int = Field(3, ge=2, le=1000)
    repetition_tail_chars: int = Field(8000, ge=100, le=1_000_000)
    duplicate_min_chars: int = Field(32, ge=1)
    duplicate_max_tracked: int = Field(1_000_000, ge=0)
    duplicate_resume_records: int = Field(5000, ge=0)
    token_sample_every: int = Field(20, ge=1)
    # hysteresis of every rate alarm (synthwatch.quality.detection; docs/checks.md "Alarms that do not flap"), counted
    # in the check's own records (the run's clock: a pause or a restart neither advances nor resets it)
    alarm_pending_records: int = Field(10, ge=0, le=100_000)  # the condition holds this long before the alarm fires
    alarm_clear_records: int = Field(200, ge=0, le=100_000)  # ... and stops holding this long before it clears
    error_share_threshold: float = Field(0.2, ge=0.0, le=1.0)  # a check's / judge's `error` share that alarms
    canary: CanarySettings = Field(default_factory=lambda: CanarySettings.model_validate({}))
    webhook: WebhookSettings = Field(default_factory=lambda: WebhookSettings.model_validate({}))
    # extended checks (#30): their verdicts follow the record (synthwatch.quality.verdicts)
    verifiers: list[VerifierSettings] = Field(default_factory=list, max_length=20)
    user: list[UserCheckSettings] = Field(default_factory=list, max_length=50)
    rule: list[RuleCheckSettings] = Field(default_factory=list, max_length=100)
    language: LanguageSettings = Field(default_factory=lambda: LanguageSettings.model_validate({}))
    near_duplicate: NearDuplicateSettings = Field(default_factory=lambda: NearDuplicateSettings.model_validate({}))
    extended: ExtendedSettings = Field(default_factory=lambda: ExtendedSettings.model_validate({}))

    def extended_names(self) -> list[str]:
        """Catalogue names of the extended checks this run computes, in a stable order."""
        names = [v.check_name for v in self.verifiers] + [u.check_name for u in self.user]
        names += [r.check_name for r in self.rule]
        if self.language.enabled:
            names.append("language")
        if self.near_duplicate.enabled:
            names.append(NEAR_DUPLICATE)
        if self.near_duplicate.within_prompt:
            names.append(NEAR_DUPLICATE_IN_PROMPT)
        return names

    def extended_info(self) -> dict[str, str]:
        """What each extended check of this run catches, in words (the catalogue, the checks page)."""
        out: dict[str, str] = {}
        for v in self.verifiers:
            out[v.check_name] = f"{v.kind} verifier: the answer against the dataset row's `{v.reference}`"
        for u in self.user:
            out[u.check_name] = f"user check {u.function or f'(entry point {u.name})'}"
        for r in self.rule:
            parts = []
            if r.regex is not None:
                parts.append(f"{'matches' if r.must_match else 'does not match'} /{r.regex}/")
            if r.min_chars is not None:
                parts.append(f">= {r.min_chars} characters")
            if r.max_chars is not None:
                parts.append(f"<= {r.max_chars} characters")
            if r.language is not None:
                parts.append(f"in language {r.language}")
            out[r.check_name] = f"TOML rule: the {r.field} " + ", ".join(parts)
        if self.language.enabled:
            want = "the prompt's" if self.language.expect == "prompt" else self.language.expect
            out["language"] = f"the answer is not in {want} language (lingua, among {', '.join(self.language.languages)})"
        nd = self.near_duplicate
        if nd.enabled:
            out[NEAR_DUPLICATE] = (f"the {nd.field} is a near-duplicate of another prompt's earlier answer"
                                   + (" or of a row of the --dedup-against dataset" if nd.against else "")
                                   + f" (MinHash LSH, {nd.shingling} shingles, Jaccard >= {nd.threshold:g})")
        if nd.within_prompt:
            out[NEAR_DUPLICATE_IN_PROMPT] = (f"the {nd.field} is a near-duplicate of an earlier sample of the same "
                                             f"prompt (MinHash, {nd.shingling} shingles, Jaccard >= {nd.threshold:g})")
        return out

    def row_fields(self) -> tuple[str, ...]:
        """Dataset row fields each record keeps for the extended checks (record.row_json)."""
        fields = [v.reference for v in self.verifiers] + list(self.extended.row_fields)
        return tuple(dict.fromkeys(fields))

    def all_rules(self) -> dict[str, Rule]:
        """The default rule of every check this run has: the built-ins' and a default one per extended check."""
        out = dict(DEFAULT_RULES)
        for name in self.extended_names():
            out[name] = extended_rule(name)
        return out

    @field_validator("disabled")
    @classmethod
    def _known_checks(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in BIT:
                raise ValueError(f"unknown check {name!r}; known: {', '.join(CHECK_NAMES)}")
        return v

    @model_validator(mode="after")
    def _known_rules(self) -> CheckSettings:
        extended = self.extended_names()
        if len(set(extended)) != len(extended):
            dup = sorted({n for n in extended if extended.count(n) > 1})
            raise ValueError(f"two extended checks are named {', '.join(dup)}; give each a distinct name")
        for name in self.rules:
            if name not in DEFAULT_RULES and name not in extended:
                known = ", ".join([*DEFAULT_RULES, *extended])
                raise ValueError(f"unknown rule {name!r}; known: {known}")
        return self
