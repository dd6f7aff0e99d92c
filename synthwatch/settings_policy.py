"""What the dashboard and its API may set in a run's configuration: one table, applied by type, default deny (#34).

Every route that accepts settings from a browser or the JSON API (the start-a-run form and ``POST /api/runs``, a run's
settings form and ``POST /api/runs/{id}/settings``, the checks form and ``POST /api/runs/{id}/checks/settings``) hands
its change to :func:`check_change`, and nothing else decides. The table :data:`POLICY` lists, per configuration
*model* (pydantic class of synthwatch.config, check_catalog, check_extended), the fields the dashboard may set and the
bounds of each. The change is walked along the models' own types, so an ``EndpointConfig`` is checked the same
wherever it appears (``endpoints``, ``judge.endpoint``, any added later), and a field or a nested model the table does
not list is refused, naming its key: a setting added later stays CLI-only until someone lists it here.

A value equal to what the run already has at the same place is not a change and passes (a run's own TLS file or
key variable, set with ``synthwatch run``, is kept when something else is edited).

The worker re-checks what a dashboard change stored (:func:`recheck_versions`): a run resumed from the command line
refuses to use a stored value that the dashboard could not set under this policy (a key variable, a TLS file, an
import path), unless the operator's own flags or ``--config`` name it again.

``python -m synthwatch.settings_policy_doc`` prints the table of docs/security.md generated from this table
(``--write`` rewrites it there; tests/test_docs.py checks the two agree).
"""

from __future__ import annotations

import math
import os
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import orjson
from pydantic import BaseModel

from .check_catalog import (
    CHECK_NAMES,
    CanaryPrompt,
    CanarySettings,
    CheckSettings,
    RuleOverride,
    WebhookSettings,
)
from .check_extended import (
    ENTRY_POINT_GROUP,
    ExtendedSettings,
    LanguageSettings,
    NearDuplicateSettings,
    RuleCheckSettings,
    UserCheckSettings,
    VerifierSettings,
)
from .config import (
    AutotuneConfig,
    DatasetConfig,
    EndpointConfig,
    EndpointPoolConfig,
    JudgeConfig,
    LimitsConfig,
    ReasoningConfig,
    RetryConfig,
    RunConfig,
    SamplingConfig,
    ServerMetricsConfig,
    TimeoutConfig,
    TLSConfig,
    TokenizerConfig,
)
from .settings import Settings
from .tokens.tokenizer import DEEPSEEK_V4, TOKENIZER_FILES

KEY_ENV_PREFIX = "SYNTHWATCH_KEY_"
ID_MAX = 2**63 - 1  # a record, alarm or run id: SQLite's and PostgreSQL's BIGINT
INT64 = (-(2**63), 2**63 - 1)
DASHBOARD_ACTORS = frozenset({"ui", "api"})  # config_version.actor of a change made from the dashboard or its API
PACKAGED_TOKENIZERS = (DEEPSEEK_V4,)


class PolicyError(ValueError):
    """A change the dashboard may not make: ``problems`` holds (dotted key, why) for each refused key."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{k}: {m}" for k, m in problems))
        self.problems = problems


@dataclass
class Context:
    """What a check needs besides the change: the dashboard's settings (its folders and key variables), where
    relative paths are resolved, and the entry-point user checks the operator's own configuration enabled."""

    settings: Settings
    base_dir: Path | None = None
    operator_entry_points: frozenset[str] = frozenset()
    problems: list[tuple[str, str]] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ rules of a leaf


class Refused(Exception):
    pass


@dataclass(frozen=True)
class Rule:
    """One settable field: what it may hold from the dashboard (``describe`` is its cell in docs/security.md)."""

    describe: str
    check: Callable[[Any, Context], Any]
    nullable: bool = False


def _text(max_len: int, pattern: str | None = None, why: str | None = None) -> Rule:
    rx = re.compile(pattern) if pattern else None

    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, str):
            raise Refused("a string")
        if len(v) > max_len:
            raise Refused(f"at most {max_len} characters")
        if "\x00" in v:
            raise Refused("no NUL characters")
        if rx is not None and not rx.fullmatch(v):
            raise Refused(why or f"must match {pattern}")
        return v
    return Rule(f"text ≤ {max_len:,} chars" + (f" matching `{pattern}`" if pattern else ""), check)


def _num(lo: float, hi: float, *, integer: bool) -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise Refused("a whole number" if integer else "a number")
        if isinstance(v, float) and not math.isfinite(v):
            raise Refused("a finite number")
        if not lo <= v <= hi:
            raise Refused(f"must be between {_n(lo)} and {_n(hi)} when set from the dashboard")
        return v
    return Rule(f"{'integer' if integer else 'number'} {_n(lo)} … {_n(hi)}", check)


def _n(x: float) -> str:
    if isinstance(x, int) and abs(x) >= 2**20:
        for exp in range(20, 64):
            if x == 2**exp:
                return f"2^{exp}"
            if x == 2**exp - 1:
                return f"2^{exp}−1"
            if x == -(2**exp):
                return f"−2^{exp}"
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _int(lo: int, hi: int) -> Rule:
    return _num(lo, hi, integer=True)


def _float(lo: float, hi: float) -> Rule:
    return _num(lo, hi, integer=False)


def _flag() -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, bool):
            raise Refused("true or false")
        return v
    return Rule("true / false", check)


def _only(value: Any, why: str) -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if v != value or type(v) is not type(value):
            raise Refused(why)
        return v
    return Rule(f"only {orjson.dumps(value).decode()}: {why}", check)


def _deny(why: str) -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        raise Refused(why)
    return Rule(f"never: {why}", check)


def _text_list(max_items: int, max_len: int, choices: tuple[str, ...] | None = None) -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, list) or len(v) > max_items:
            raise Refused(f"a list of at most {max_items} strings")
        for x in v:
            if not isinstance(x, str) or len(x) > max_len or "\x00" in x:
                raise Refused(f"a list of strings of at most {max_len} characters")
            if choices is not None and x not in choices:
                raise Refused(f"{x[:60]!r} is not one of the known names")
        return v
    return Rule(f"list ≤ {max_items} of text ≤ {max_len} chars" + (" (check names)" if choices else ""), check)


def _json(max_bytes: int) -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, dict):
            raise Refused("a JSON object")
        try:
            size = len(orjson.dumps(v))
        except (TypeError, orjson.JSONEncodeError):
            raise Refused("JSON with whole numbers of 64 bits at most") from None
        if size > max_bytes:
            raise Refused(f"at most {max_bytes:,} bytes of JSON")
        return v
    return Rule(f"JSON object ≤ {max_bytes:,} bytes", check)


def key_env_allowed(name: str, settings: Settings) -> bool:
    """A key variable the dashboard may name: SYNTHWATCH_KEY_* or one listed in SYNTHWATCH_LAUNCH_KEY_ENVS (the
    worker sends its value to the URL given with it)."""
    listed = {n.strip() for n in settings.launch_key_envs.split(",") if n.strip()}
    return (name.startswith(KEY_ENV_PREFIX) and len(name) > len(KEY_ENV_PREFIX)) or name in listed


def key_env_refusal(name: str) -> str:
    return (f"{name[:80]!r} may not be used from the dashboard: the worker would send that variable's value to the "
            f"endpoint URL given with it. Name a variable starting with {KEY_ENV_PREFIX} (e.g. {KEY_ENV_PREFIX}VLLM), "
            "or list it in the dashboard's SYNTHWATCH_LAUNCH_KEY_ENVS setting")


def _key_env() -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,199}", v):
            raise Refused("the NAME of an environment variable")
        if not key_env_allowed(v, ctx.settings):
            raise Refused(key_env_refusal(v))
        return v
    return Rule(f"a variable named {KEY_ENV_PREFIX}* or listed in SYNTHWATCH_LAUNCH_KEY_ENVS", check, nullable=True)


def allowed_dirs(spec: str, base_dir: Path | None = None) -> list[Path]:
    """A setting's folders (separated by ':'), resolved; relative ones against ``base_dir`` or the cwd."""
    base = base_dir or Path.cwd()
    out = []
    for d in spec.split(os.pathsep):
        if d.strip():
            p = Path(d.strip()).expanduser()
            out.append((p if p.is_absolute() else base / p).resolve())
    return out


def inside(path: str, spec: str, base_dir: Path | None) -> Path | None:
    """``path`` resolved (every symlink and ``..``) if it lies inside one of the folders of ``spec``, else None."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    real = p.resolve()
    return real if any(real == d or real.is_relative_to(d) for d in allowed_dirs(spec, base_dir)) else None


def tls_file(path: str, settings: Settings, base_dir: Path | None = None) -> str:
    """A TLS file the dashboard may name: inside SYNTHWATCH_LAUNCH_TLS_DIRS, existing; nothing is said about a
    path outside them (no existence oracle). Refused otherwise; the resolved path when allowed."""
    real = inside(path, settings.launch_tls_dirs, base_dir)
    if real is None:
        shown = ":".join(str(d) for d in allowed_dirs(settings.launch_tls_dirs, base_dir)) or "(none)"
        raise Refused(f"{path[:200]!r} is outside the folders the dashboard may read TLS files from ({shown}; the "
                      "SYNTHWATCH_LAUNCH_TLS_DIRS setting). Put the file there, or set it with `synthwatch run` or "
                      "the run's config file")
    if not real.is_file():
        raise Refused(f"{path[:200]!r}: no such file")
    return str(real)


def _tls_file() -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, str) or not v.strip() or len(v) > 4096 or "\x00" in v:
            raise Refused("a file path")
        return tls_file(v.strip(), ctx.settings, ctx.base_dir)
    return Rule("a file inside SYNTHWATCH_LAUNCH_TLS_DIRS", check, nullable=True)


def tokenizer_folder(name: str, settings: Settings, base_dir: Path | None = None, *, template: bool = False) -> str:
    """A tokenizer (or chat template) the dashboard may name: the packaged one, or a folder (file) inside
    SYNTHWATCH_LAUNCH_TOKENIZER_DIRS holding tokenizer files. Refused otherwise; what to store when allowed."""
    what = "chat template" if template else "tokenizer"
    name = name.strip()
    if name in PACKAGED_TOKENIZERS:
        return name
    real = inside(name, settings.launch_tokenizer_dirs, base_dir)
    if real is None:
        shown = ":".join(str(d) for d in allowed_dirs(settings.launch_tokenizer_dirs, base_dir)) or "(none)"
        raise Refused(f"{name[:200]!r} is not a packaged {what} ({', '.join(PACKAGED_TOKENIZERS)}) and is outside "
                      f"the folders the dashboard may load tokenizers from ({shown}; the "
                      "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS setting). Put it there, or set it with the command line")
    if template:
        if not real.is_file():
            raise Refused(f"{name[:200]!r}: no such chat template file")
    elif not real.is_dir():
        raise Refused(f"{name[:200]!r}: no such folder (give the folder that holds tokenizer.json)")
    elif not any((real / f).is_file() for f in TOKENIZER_FILES):
        raise Refused(f"{name[:200]!r}: the folder has no tokenizer files (looked for {', '.join(TOKENIZER_FILES)})")
    return str(real)


def _tokenizer(template: bool) -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, str) or not v.strip() or len(v) > 4096 or "\x00" in v:
            raise Refused("a tokenizer name or folder")
        return tokenizer_folder(v, ctx.settings, ctx.base_dir, template=template)
    return Rule(f"{DEEPSEEK_V4!r} or a {'file' if template else 'folder'} inside SYNTHWATCH_LAUNCH_TOKENIZER_DIRS",
                check, nullable=template)


def _dataset_path() -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, str) or len(v) > 4096 or "\x00" in v:
            raise Refused("a file path")
        if not v:
            return v  # the form reports a missing path itself
        real = inside(v, ctx.settings.launch_dataset_dirs, ctx.base_dir)
        if real is None:
            shown = ":".join(str(d) for d in allowed_dirs(ctx.settings.launch_dataset_dirs, ctx.base_dir)) or "(none)"
            raise Refused(f"{v[:200]!r} is outside the folders the dashboard may read datasets from ({shown}; the "
                          "SYNTHWATCH_LAUNCH_DATASET_DIRS setting). Put the dataset there, or start the run with "
                          "`synthwatch run` instead")
        return str(real)
    return Rule("a path inside SYNTHWATCH_LAUNCH_DATASET_DIRS (new runs only)", check)


def installed_entry_points() -> set[str]:
    return {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _entry_point_name() -> Rule:
    def check(v: Any, ctx: Context) -> Any:
        if not isinstance(v, str) or len(v) > 48:
            raise Refused("a check name")
        if v not in ctx.operator_entry_points:
            raise Refused(f"{v!r}: a user check is Python code; the dashboard may only name an entry point "
                          f"({ENTRY_POINT_GROUP}) that the run's own configuration (synthwatch run / checks "
                          "--config) already enabled")
        if v not in installed_entry_points():
            raise Refused(f"{v!r}: no such installed entry point ({ENTRY_POINT_GROUP})")
        return v
    return Rule("an installed entry point the operator's own configuration enabled", check)


NO_IMPORT = ("an import path runs Python code, which the dashboard may not set: put it in your own TOML file and give it "
             "to the run or checks command with --config")
DEDUP_FILE = ("a file on the worker's machine, which the dashboard may not name: give it to the run command's "
              "--dedup-against FILE or put it in your own TOML file given with --config")
TEXT = _text(200)
LONG_TEXT = _text(20_000)
URL = _text(2000, r"https?://\S+", "not an http(s) URL (expected e.g. http://127.0.0.1:8000/v1)")
NAME = _text(200, r"[A-Za-z0-9_.:/@+-][A-Za-z0-9_.:/@+ -]*")
SECONDS = _float(0, 86_400)
SHARE = _float(0, 1)

# model -> {field: rule}. A nested model's field has no rule of its own: it is walked with its model's table, and a
# model missing from this table cannot be set from the dashboard at all.
POLICY: dict[type[BaseModel], dict[str, Rule]] = {
    RunConfig: {
        "name": _text(200), "model": TEXT, "stream": _flag(), "request_token_ids": _flag(),
        "concurrency": _int(1, 100_000), "cap": _int(1, 10**12), "samples_per_prompt": _int(1, 1000),
        "samples_in_one_request": _flag(),
        "turns": TEXT, "history_reasoning": TEXT, "webhook_url": URL,
        "lease_s": _float(2, 3600), "flush_interval_ms": _int(10, 10_000), "shutdown_grace_s": _float(0, 3600),
    },
    DatasetConfig: {
        "path": _dataset_path(), "format": TEXT, "split": TEXT, "messages_field": TEXT, "conversations_field": TEXT,
        "prompt_field": TEXT, "id_field": TEXT, "system_prompt": LONG_TEXT, "shuffle": _flag(),
        "seed": _int(0, 2**63 - 1), "limit": _int(1, 10**12), "on_bad_line": TEXT,
    },
    EndpointConfig: {
        "base_url": URL, "api_key_env": _key_env(), "name": NAME,
        "headers_env": _deny("extra headers send environment variables, which the dashboard may not choose: put them in your own "
                             "TOML file and give it to the run command with --config"),
        "price_in_per_mtok": _float(0, 1e6), "price_out_per_mtok": _float(0, 1e6),
    },
    TLSConfig: {"ca_bundle": _tls_file(), "client_cert": _tls_file(), "client_key": _tls_file(), "verify": _flag()},
    SamplingConfig: {
        "temperature": _float(0, 5), "top_p": _float(0, 1), "max_tokens": _int(1, 10_000_000),
        "seed": _int(0, 2**63 - 1), "stop": _text_list(16, 200), "logprobs": _flag(),
        "top_logprobs": _int(0, 20), "extra_body": _json(65_536),
    },
    TimeoutConfig: {"connect_s": SECONDS, "total_s": SECONDS, "idle_s": SECONDS},
    LimitsConfig: {
        "max_body_bytes": _int(1024, 2**30), "max_event_bytes": _int(1024, 2**30),
        "max_reply_bytes": _int(1024, 2**30), "max_partial_chars": _int(0, 2**30),
        "max_header_bytes": _int(256, 2**20), "max_headers": _int(8, 10_000),
        "max_logprobs_bytes": _int(0, 2**30),
    },
    RetryConfig: {"max_attempts": _int(1, 100), "backoff_base_s": _float(0, 3600), "backoff_max_s": _float(0, 3600)},
    ReasoningConfig: {"mode": TEXT, "expect": _flag(), "think_open": TEXT, "think_close": TEXT,
                      "prefilled_open": _flag()},
    TokenizerConfig: {
        "name_or_path": _tokenizer(False), "chat_template": _tokenizer(True),
        "trust_remote_code": _only(False, "it runs the tokenizer's own code; use `synthwatch fix` or the config file"),
    },
    EndpointPoolConfig: {"eject_after_failures": _int(1, 10_000), "eject_s": SECONDS, "eject_max_s": SECONDS},
    ServerMetricsConfig: {"enabled": _flag(), "interval_s": _float(0.2, 3600), "timeout_s": _float(0, 60)},
    AutotuneConfig: {"enabled": _flag(), "min": _int(1, 100_000), "max": _int(1, 100_000),
                     "start": _int(1, 100_000), "interval_s": _float(0.5, 600), "gain": SHARE,
                     "latency_factor": _float(1, 100)},
    JudgeConfig: {
        "model": TEXT, "prompt_template": _text(100_000), "sample_fraction": SHARE, "concurrency": _int(1, 1000),
        "max_tokens": _int(1, 100_000), "temperature": _float(0, 5), "guided": TEXT, "bad_labels": _text_list(50, 200),
        "min_score": _float(-1e6, 1e6), "timeout_s": SECONDS, "max_attempts": _int(1, 20),
        "alarm_threshold": SHARE, "alarm_window": _int(1, 100_000), "alarm_min_records": _int(1, 100_000),
        "auto_pause": _flag(), "drain_s": SECONDS,
    },
    CheckSettings: {
        "disabled": _text_list(len(CHECK_NAMES), 100, CHECK_NAMES),
        "repetition_min_chars": _int(20, 10_000_000), "repetition_min_repeats": _int(2, 1000),
        "repetition_tail_chars": _int(100, 1_000_000), "duplicate_min_chars": _int(1, 10_000_000),
        "duplicate_max_tracked": _int(0, 100_000_000), "duplicate_resume_records": _int(0, 100_000_000),
        "token_sample_every": _int(1, 1_000_000),
    },
    RuleOverride: {
        "enabled": _flag(), "window": _int(1, 100_000), "threshold": SHARE, "min_records": _int(1, 100_000),
        "severity": TEXT, "auto_pause": _flag(), "pause_threshold": SHARE, "pause_min_records": _int(1, 100_000),
        "sticky": _flag(),
    },
    CanarySettings: {"every_n": _int(0, 1_000_000)},
    CanaryPrompt: {"prompt": LONG_TEXT, "answer": _text(2000)},
    WebhookSettings: {"url": URL, "timeout_s": _float(0, 60), "dashboard_url": _text(2000)},
    VerifierSettings: {"kind": TEXT, "reference": TEXT, "name": TEXT, "case_sensitive": _flag(),
                       "answer_regex": _text(2000), "timeout_s": _float(0, 300)},
    UserCheckSettings: {"name": _entry_point_name(), "function": _deny(NO_IMPORT), "timeout_s": _float(0, 300)},
    RuleCheckSettings: {"name": TEXT, "field": TEXT, "regex": _text(2000), "must_match": _flag(),
                        "min_chars": _int(0, 10**9), "max_chars": _int(0, 10**9), "language": TEXT},
    LanguageSettings: {"enabled": _flag(), "expect": TEXT, "languages": _text_list(20, 10),
                       "min_chars": _int(1, 100_000), "max_chars": _int(20, 100_000)},
    NearDuplicateSettings: {"enabled": _flag(), "within_prompt": _flag(), "threshold": SHARE,
                            "shingling": TEXT, "shingle_size": _int(1, 10), "num_perm": _int(16, 256),
                            "max_records": _int(1, 100_000_000), "min_chars": _int(1, 100_000), "field": TEXT,
                            "against": _deny(DEDUP_FILE), "against_column": TEXT},
    ExtendedSettings: {"pool_processes": _int(1, 32), "queue_max": _int(10, 10_000_000),
                       "drain_grace_s": _float(0, 600), "row_fields": _text_list(50, 200)},
}
# fields typed loosely in their model that hold a model (RunConfig.checks is validated as CheckSettings)
FIELD_MODELS: dict[tuple[type[BaseModel], str], type[BaseModel]] = {(RunConfig, "checks"): CheckSettings}
MAX_ITEMS = 100  # items of a list of tables (endpoints, user checks, rules ...), keys of a table of tables
KEY_TEXT = _text(100, r"[A-Za-z0-9_.:-]+")  # a key of a table of tables (checks.rules."name")


# ------------------------------------------------------------------------------------------ walking the types


def shape(model: type[BaseModel], name: str) -> tuple[str, type[BaseModel] | None, bool]:
    """("model" | "list" | "dict" | "leaf", the nested model, may be null) of a field, from its annotation."""
    if (model, name) in FIELD_MODELS:
        return "model", FIELD_MODELS[(model, name)], False
    ann = model.model_fields[name].annotation
    nullable = False
    if get_origin(ann) in (Union, types.UnionType):
        members = [a for a in get_args(ann) if a is not type(None)]
        nullable = len(members) < len(get_args(ann))
        ann = members[0] if len(members) == 1 else ann
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "model", ann, nullable
    origin, args = get_origin(ann), get_args(ann)
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return "list", args[0], nullable
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return "dict", args[1], nullable
    return "leaf", None, nullable


def join_key(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def _walk(model: type[BaseModel], value: Any, current: Any, path: str, ctx: Context) -> Any:
    rules = POLICY.get(model)
    if rules is None:
        ctx.problems.append((path or "(settings)", "cannot be set from the dashboard"))
        return value
    if not isinstance(value, dict):
        ctx.problems.append((path or "(settings)", "a table of settings"))
        return value
    cur = current if isinstance(current, dict) else {}
    out = {}
    for key, v in value.items():
        p = join_key(path, str(key))
        if key not in model.model_fields:
            ctx.problems.append((p, "unknown key"))
            continue
        if key in cur and cur[key] == v:
            out[key] = v  # not a change: what the run already has
            continue
        kind, sub, nullable = shape(model, key)
        if kind == "leaf":
            rule = rules.get(key)
            if rule is None:
                ctx.problems.append((p, "cannot be set from the dashboard"))
                continue
            if v is None and (nullable or rule.nullable):
                out[key] = None
                continue
            try:
                out[key] = rule.check(v, ctx)
            except Refused as exc:
                ctx.problems.append((p, str(exc)))
            continue
        assert sub is not None
        if v is None and nullable:
            out[key] = None
        elif kind == "model":
            out[key] = _walk(sub, v, cur.get(key), p, ctx)
        elif kind == "list":
            out[key] = _walk_list(sub, v, cur.get(key), p, ctx)
        else:
            out[key] = _walk_dict(sub, v, cur.get(key), p, ctx)
    return out


def _walk_list(model: type[BaseModel], value: Any, current: Any, path: str, ctx: Context) -> Any:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        ctx.problems.append((path, f"a list of at most {MAX_ITEMS} tables"))
        return value
    cur = current if isinstance(current, list) else []
    out = []
    for i, item in enumerate(value):
        if item in cur:
            out.append(item)  # one of the run's own, unchanged
            continue
        out.append(_walk(model, item, cur[i] if i < len(cur) else None, join_key(path, i), ctx))
    return out


def _walk_dict(model: type[BaseModel], value: Any, current: Any, path: str, ctx: Context) -> Any:
    if not isinstance(value, dict) or len(value) > MAX_ITEMS:
        ctx.problems.append((path, f"a table of at most {MAX_ITEMS} tables"))
        return value
    cur = current if isinstance(current, dict) else {}
    out = {}
    for key, item in value.items():
        p = join_key(path, str(key))
        try:
            KEY_TEXT.check(key, ctx)
        except Refused as exc:
            ctx.problems.append((p, f"key: {exc}"))
            continue
        out[key] = item if cur.get(key) == item else _walk(model, item, cur.get(key), p, ctx)
    return out


def check_change(patch: dict[str, Any], current: dict[str, Any] | None, ctx: Context,
                 model: type[BaseModel] = RunConfig) -> dict[str, Any]:
    """``patch`` (nested, as versions.nest gives it) as the dashboard may apply it to a run whose configuration is
    ``current`` ({} for a new run): paths resolved to what is stored. PolicyError names every refused key."""
    ctx.problems = []
    out = _walk(model, patch, current or {}, "", ctx)
    if ctx.problems:
        raise PolicyError(list(ctx.problems))
    tok, cur_tok = out.get("tokenizer"), (current or {}).get("tokenizer")
    cur_name = cur_tok.get("name_or_path") if isinstance(cur_tok, dict) else None
    if isinstance(tok, dict) and tok.get("name_or_path") is not None and tok["name_or_path"] != cur_name:
        out["tokenizer"] = {**tok, "trust_remote_code": False}  # a tokenizer chosen here never runs its code
    return out  # type: ignore[no-any-return]


def operator_entry_points(configs: list[dict[str, Any]]) -> frozenset[str]:
    """Entry-point user checks (a name, no import path) that configurations the operator made enabled."""
    out: set[str] = set()
    for cfg in configs:
        for u in ((cfg.get("checks") or {}).get("user") or []) if isinstance(cfg, dict) else []:
            if isinstance(u, dict) and isinstance(u.get("name"), str) and not u.get("function"):
                out.add(u["name"])
    return frozenset(out)


# ------------------------------------------------------------------------------------------ the worker's re-check


def recheck_versions(versions: list[tuple[str, dict[str, Any]]], config: dict[str, Any], settings: Settings,
                     operator: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """What the worker must not act on: each (key, why) of the current ``config`` that a dashboard change brought in
    and this policy refuses. ``versions`` is the run's (actor, config) history, oldest first; ``operator`` what the
    operator's own flags and --config give now (a value they name again is theirs)."""
    own = [c for a, c in versions if a not in DASHBOARD_ACTORS] + ([operator] if operator else [])
    ctx = Context(settings, operator_entry_points=operator_entry_points(own))
    seen: dict[str, tuple[str, Any]] = {}  # key -> (why, the refused value)
    prev: dict[str, Any] = {}
    for actor, cfg in versions:
        if actor in DASHBOARD_ACTORS:
            ctx.problems = []
            _walk(RunConfig, _changed(prev, cfg), prev, "", ctx)
            for key, why in ctx.problems:
                seen[key] = (why, _lookup(cfg, key))
        else:  # the operator's own change (synthwatch fix, checks --config, a resume's new version) of such a key
            for key in [k for k in seen if _lookup(prev, k) != _lookup(cfg, k)]:
                del seen[key]
        prev = cfg
    return [(k, why) for k, (why, value) in seen.items()
            if _present(value) and _lookup(config, k) == value and not _named_by(operator, k, config)]


def _changed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The top-level tables of ``new`` that differ from ``old`` (walked against ``old``: equal leaves pass)."""
    return {k: v for k, v in new.items() if old.get(k) != v}


def _lookup(cfg: Any, key: str) -> Any:
    node = cfg
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        if part.startswith("["):
            i = int(part[1:-1])
            node = node[i] if isinstance(node, list) and i < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def _present(value: Any) -> bool:
    return value is not None and value != {} and value is not False


def _named_by(operator: dict[str, Any] | None, key: str, config: dict[str, Any]) -> bool:
    return operator is not None and _lookup(operator, key) is not None and _lookup(operator, key) == _lookup(config, key)
