"""What an export is, shared by the export itself (stream.py) and by each format's rows (presets.py,
tokens.py) and the manifest (manifest.py): the formats and options, the plan checked before anything is
written, why a record is left out, and the small helpers every format uses."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..check_catalog import ALL_STATUS_CHECKS, BIT

if TYPE_CHECKING:
    from ..tokens.tokenizer import LoadedTokenizer

FORMATS = ("messages", "sharegpt", "tokens", "raw", "specforge", "speculators")
PRESET_FORMATS = ("specforge", "speculators")
"""Formats that are trainer presets (synthwatch.export.presets): ``--for NAME``."""
TOKEN_FORMATS = ("tokens", "speculators")
PARQUET_FORMATS = ("tokens",)
DEFAULT_CHECKS = ("empty_reasoning", "truncated")
"""Checks applied unless ``default_exclusions`` is off; computed from the record's own fields."""
PAGE_SIZE = 5000
MANIFEST_SUFFIX = ".manifest.json"

# Exclusion reasons, in the order they are tested: a record is counted once, under the first that applies.
R_CANARY = "canary"  # known test prompts injected by the checks (negative idx); never training data
R_FLAGGED = "flagged_bad"
R_NOT_GOOD = "not_reviewed_good"
R_EMPTY = "empty_reasoning"
R_TRUNCATED = "truncated"
R_NO_IDS = "no_token_ids"
R_TOKENIZE = "tokenize_failed"
R_VERSION = "other_config_version"

_SECRET_KEY = re.compile(
    r"(?i)(^|[_-])(api[_-]?keys?|apikeys?|secrets?|password|passwd|pwd|credentials?|authorization|bearer|"
    r"private[_-]?key|token|cookies?)$"
)
# Keys whose value may embed a secret even though the key does not say so (Slack/Discord webhook URLs).
_SECRET_VALUE_KEYS = frozenset({"webhook_url", "headers", "default_headers"})

class ExportError(Exception):
    """A bad export request; the message says what is wrong. Raised before anything is written."""


@dataclass
class ExportOptions:
    format: str
    out: str | Path
    parquet: bool | None = None
    """None: Parquet when the output name ends with .parquet."""
    think_inline: bool = False
    """sharegpt: fold the reasoning into the content between the run's think strings."""
    from_value: bool = False
    """sharegpt: ShareGPT keys from/value with human/gpt (EAGLE's reader) instead of role/content."""
    only_good: bool = False
    """Export only records reviewed good."""
    include_flagged: bool = False
    """Keep records flagged bad (by default they are excluded)."""
    default_exclusions: bool = True
    """Exclude empty reasoning (when the run expects reasoning) and truncated records."""
    exclude_checks: tuple[str, ...] = ()
    """More checks whose failing records are excluded: any name of the run's catalogue (synthwatch.quality.selection:
    a built-in check's bit, or another check's verdict in force being fail)."""
    where: str | None = None
    """Only records this selection expression selects (synthwatch.quality.selection; export/criteria.py)."""
    tokenizer: str | None = None
    chat_template: str | None = None
    trust_remote_code: bool | None = None
    retokenize: bool = False
    """tokens: re-tokenize even when the server's token ids are stored."""
    template_drops_past_reasoning: bool = False
    """Re-tokenizing: the template drops the reasoning of past turns by design, so the trained answer is
    not rendered through it but appended as generated (generation prompt + [<think>]reasoning</think>content
    + EOS). Without it, a record whose reasoning the template drops is left out."""
    page_size: int = PAGE_SIZE
    config_version: int | None = None
    """Only records whose current output was read under this config version (record.derive_version)."""
    generated_under: int | None = None
    """Only records generated under this config version (record.gen_version)."""
    turns: str = "last"
    """Conversations regenerated turn by turn: a row for the last turn only, or one for each (export_turns)."""
    open_items: tuple[dict[str, Any], ...] = ()
    """The run's open items when the export started (records alarms left failing; named in the manifest)."""
    confirmed_by: str | None = None
    """Who said "export anyway" while a data-quality alarm or open item was open (cli | ui | api), or None."""
    confirmed_at: float | None = None
    select: str = "all"
    """k samples per prompt: all | passing | first-passing | best, by the verdicts of select_checks (export/select.py)."""
    select_checks: tuple[str, ...] = ()
    """The checks whose verdicts the selection reads, all of which must pass (default: the run's first verifier)."""
    require_pass: bool = False
    """select best: leave out the prompts whose best sample did not pass."""


@dataclass
class ExportPlan:
    """A validated export: everything run_export needs; nothing has been written yet."""

    run: dict[str, Any]
    config: dict[str, Any]
    options: ExportOptions
    out: Path
    parquet: bool
    checks: list[str]
    check_bits: dict[str, int]
    expects_reasoning: bool
    think_open: str
    think_close: str
    server_ids: bool
    tokenizer: LoadedTokenizer | None
    tokenizer_info: dict[str, Any] | None
    status_counts: dict[str, int]
    total: int
    """ok records to scan (the progress denominator)."""
    db_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    select_checks: tuple[str, ...] = ()
    """The checks the selection reads, resolved (empty: every sample is exported)."""
    criteria: Any = None
    """The export's checks and expression resolved in the run's catalogue (export/criteria.Criteria)."""
    snapshot_at: float | None = None
    """The cut (#35): only ok records finished at or before this time (epoch seconds, fixed when the export was
    prepared) are read; None reads every ok record (a plan made by hand)."""
    snapshot_ids: Sequence[int] | None = None
    """With snapshot_at: the ids (sorted) of the run's ok records as the export saw them when it was prepared."""
    overrides: list[dict[str, Any]] = field(default_factory=list)
    """The run's weakening overrides (synthwatch.quality.detection.overrides): what, why, who, when (#35)."""


class Skip(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


ProgressFn = Callable[[int, int], None]
"""progress(scanned, total): called after each page (and once at the start and the end)."""


# ----------------------------------------------------------------------------------------- helpers


def version() -> str:
    try:
        from importlib.metadata import version as _v

        return _v("synthwatch")
    except Exception:  # not installed (a checkout on sys.path)
        return "0+unknown"


def strip_secrets(value: Any) -> Any:
    """The config without anything that looks like a secret (defence in depth: the snapshot holds none)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if key.lower().endswith("_env"):  # the NAME of an environment variable, not its value
                out[key] = v
            elif _SECRET_KEY.search(key) or (key.lower() in _SECRET_VALUE_KEYS and v):
                out[key] = "<redacted>"
            else:
                out[key] = strip_secrets(v)
        return out
    if isinstance(value, list):
        return [strip_secrets(v) for v in value]
    return value


def check_bit_map(*, ok_records_only: bool = False) -> dict[str, int]:
    """name -> bit of the per-record checks.

    ok_records_only drops the checks that only ever flag records that are not ok (timeout, error).
    """
    return {n: b for n, b in BIT.items() if not (ok_records_only and n in ALL_STATUS_CHECKS)}


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI role/content messages (ShareGPT from/value turns converted)."""
    if isinstance(messages, dict):
        messages = messages.get("messages") or messages.get("conversations") or []
    roles = {"human": "user", "gpt": "assistant"}
    out = []
    for m in messages or []:
        if not isinstance(m, dict):
            continue
        if "role" not in m and "from" in m:
            m = {"role": roles.get(str(m["from"]), str(m["from"])), "content": m.get("value", "")}
        out.append(m)
    return out


def record_id(rec: Mapping[str, Any], run_name: str) -> str:
    sid = rec.get("source_id")
    base = str(sid) if sid not in (None, "") else f"{run_name}-{rec['idx'] if rec.get('prompt_idx') is None else rec['prompt_idx']}"
    # k samples per prompt share the prompt's id: the second and later are <id>#s<sample index> (unique rows)
    sample = int(rec.get("sample_index") or 0)
    base += f"#s{sample}" if sample else ""
    return base + rec.get("_row_suffix", "")  # one row per turn of a conversation (synthwatch.export.turns)


def text_content(content: Any) -> str:
    """ShareGPT readers want a string: OpenAI content parts are joined (text parts only)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)
