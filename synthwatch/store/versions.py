"""Config versions: every change of a run's settings is a new version; nothing is overwritten.

Version 1 is the config a run was created with. A change (the dashboard's settings form, the API,
`synthwatch fix`, `synthwatch checks --set`, or `synthwatch run --new-config-version`) validates the
whole new config, stores it as the next version with the list of differences, and makes it current:
``run.config_json`` is always the current version's snapshot (every reader uses it), and
``run.config_version`` its number. Running workers adopt a new version within their control refresh;
each record stores the version it was generated under and the version it was last derived under.

What counts as what:

- reading settings (``reasoning.*``): how a stored answer is read; a change can be applied to stored
  records with a re-derive (no new request);
- generation settings (model, endpoints, sampling, timeouts, retries, stream, token ids): what is
  sent; a change applies to records generated (or re-run) from then on;
- controls (``cap``, ``concurrency``) are not versions: they change through controls, which the
  audit log records;
- the dataset is loaded once: a different dataset is a different run; so is ``turns`` (last / all),
  which decides how many turns each loaded conversation has, and ``samples_per_prompt``, how many records each
  prompt has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..config import ConfigError, RunConfig, build_config, deep_merge
from ..hints import command as hint
from ..settings import get_settings
from ..settings_policy import recheck_versions
from . import queue as store

READING_KEYS = ("reasoning",)
GENERATION_KEYS = ("model", "endpoints", "stream", "request_token_ids", "sampling", "timeouts", "retries",
                   "history_reasoning")
CONTROL_KEYS = ("cap", "concurrency")
# per-process settings of a worker: several workers of one run may differ, and none changes the data
PROCESS_KEYS = ("name", "lease_s", "flush_interval_ms", "shutdown_grace_s")
# turns: each conversation's turn count is set when it is loaded; samples_per_prompt: so are each prompt's records
FIXED_KEYS = ("dataset", "turns", "samples_per_prompt")
NEW_VERSION_FLAG = "--new-config-version"
_ADDED_LATER = {"turns": "last", "history_reasoning": "strip", "samples_per_prompt": 1}


class VersionError(ValueError):
    """A settings change that cannot be made; the message says what and why (``problems``: each validation
    problem as (location, message), for a form to show beside its field)."""

    def __init__(self, message: str, problems: list[tuple[tuple[str | int, ...], str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class WeakeningRefused(VersionError):
    """A change that weakens detection, without a reason (synthwatch.quality.detection.overrides)."""


# Detection's guard on every new config version (synthwatch.quality.detection.overrides.guard, registered when that module is
# imported; the store does not import it): refuses a weakening without a reason, records one with it.
ChangeGuard = Callable[..., Any]
_guards: list[ChangeGuard] = []


def set_change_guard(guard: ChangeGuard) -> None:
    _guards[:] = [guard]


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    old: Any
    new: Any

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "old": self.old, "new": self.new}

    def describe(self) -> str:
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


_MISSING = object()


def _show(v: Any) -> str:
    if v is _MISSING:
        return "(not set)"
    return orjson.dumps(v).decode() if not isinstance(v, str) else repr(v)


def diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[Change]:
    """Differences between two config snapshots, by dotted path; lists compare whole."""
    out: list[Change] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(diff(a, b, path + "."))
        elif a != b:
            out.append(Change(path, None if a is _MISSING else a, None if b is _MISSING else b))
    return out


def kind_of(path: str) -> str:
    top = path.split(".", 1)[0]
    if top in READING_KEYS:
        return "reading"
    if top in GENERATION_KEYS:
        return "generation"
    if top in CONTROL_KEYS:
        return "control"
    if top in PROCESS_KEYS:
        return "process"
    if top in FIXED_KEYS:
        return "dataset"
    return "other"  # checks, tokenizer, pool, webhook_url


def versioned_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """The differences that make a new version (controls and per-process settings do not)."""
    old, new = {**_ADDED_LATER, **old}, {**_ADDED_LATER, **new}  # a run stored before a key existed had its default
    return [c for c in diff(old, new) if kind_of(c.path) not in ("control", "process")]


def nest(changes: dict[str, Any]) -> dict[str, Any]:
    """{"sampling.max_tokens": 5} -> {"sampling": {"max_tokens": 5}}; nested objects pass through."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        node = out
        *parents, leaf = str(key).split(".")
        for part in parents:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise VersionError(f"{key}: {part} is not a table")
            node = nxt
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = deep_merge(node[leaf], value)
        else:
            node[leaf] = value
    return out


# ------------------------------------------------------------------------------------------ reads


def current(conn: Connection, run_id: int) -> tuple[int, dict[str, Any]]:
    row = conn.execute(text("SELECT config_version, config_json FROM run WHERE id = :r"), {"r": run_id}).first()
    if row is None:
        raise store.NotFound(f"no run {run_id}")
    cfg = orjson.loads(row[1] or "{}")
    return int(row[0] or 1), cfg if isinstance(cfg, dict) else {}


def list_versions(conn: Connection, run_id: int, *, counts: bool = True) -> list[dict[str, Any]]:
    """Every version, oldest first, with its changes and (counts=True: one scan of the run's records) how many
    records were generated / derived under it."""
    gen: dict[int, int] = {}
    der: dict[int, int] = {}
    if counts:
        gen = dict(conn.execute(text(
            "SELECT gen_version, COUNT(*) FROM record WHERE run_id = :r AND gen_version IS NOT NULL"
            " GROUP BY gen_version"), {"r": run_id}).all())
        der = dict(conn.execute(text(
            "SELECT derive_version, COUNT(*) FROM record WHERE run_id = :r AND derive_version IS NOT NULL"
            " GROUP BY derive_version"), {"r": run_id}).all())
    out = []
    for row in conn.execute(text(
        "SELECT version, created_at, actor, reason, changes_json FROM config_version WHERE run_id = :r"
        " ORDER BY version"), {"r": run_id},
    ).mappings():
        changes = orjson.loads(row["changes_json"] or "[]")
        for c in changes:
            c["kind"] = kind_of(c["path"])
        out.append({"version": row["version"], "created_at": row["created_at"], "actor": row["actor"],
                    "reason": row["reason"], "changes": changes,
                    "generated": gen.get(row["version"], 0), "derived": der.get(row["version"], 0)})
    return out


def history(conn: Connection, run_id: int) -> list[tuple[str, dict[str, Any]]]:
    """(actor, config) of every version of the run, oldest first: what the settings policy re-checks (#34)."""
    out = []
    for actor, cfg in conn.execute(text("SELECT actor, config_json FROM config_version WHERE run_id = :r"
                                        " ORDER BY version"), {"r": run_id}).all():
        try:
            parsed = orjson.loads(cfg or "{}")
        except orjson.JSONDecodeError:
            parsed = {}
        out.append((str(actor or ""), parsed if isinstance(parsed, dict) else {}))
    return out


def get_version(conn: Connection, run_id: int, version: int) -> dict[str, Any]:
    row = conn.execute(text("SELECT config_json FROM config_version WHERE run_id = :r AND version = :v"),
                       {"r": run_id, "v": version}).first()
    if row is None:
        raise store.NotFound(f"run {run_id} has no config version {version}")
    return orjson.loads(row[0])  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------ writes


def create_version(conn: Connection, run_id: int, new_cfg: dict[str, Any], *, actor: str,
                   reason: str | None = None) -> tuple[int, list[Change]]:
    """Store new_cfg as the run's next version and make it current (inside the caller's write transaction)."""
    version, old = current(conn, run_id)
    if not _guards:
        raise RuntimeError("no change guard registered: import synthwatch.quality.detection.overrides before changing settings")
    _guards[0](conn, run_id, old, new_cfg, actor=actor, reason=reason)
    changes = versioned_changes(old, new_cfg)
    nxt = version + 1
    t = time.time()
    conn.execute(
        text("INSERT INTO config_version (run_id, version, created_at, actor, reason, config_json, changes_json)"
             " VALUES (:r, :v, :t, :a, :why, :c, :ch)"),
        {"r": run_id, "v": nxt, "t": t, "a": actor, "why": reason, "c": orjson.dumps(new_cfg).decode(),
         "ch": orjson.dumps([c.as_dict() for c in changes]).decode()},
    )
    expects = (new_cfg.get("reasoning") or {}).get("expect", True)
    conn.execute(
        text("UPDATE run SET config_json = :c, config_version = :v, expects_reasoning = :e, updated_at = :t"
             " WHERE id = :r"),
        {"c": orjson.dumps(new_cfg).decode(), "v": nxt, "e": bool(expects), "t": t, "r": run_id},
    )
    summary = "; ".join(c.describe() for c in changes)[:2000]
    store.add_event(conn, run_id, "config_version", nxt, actor=actor,
                    detail=summary + (f" — reason: {reason}" if reason else ""))
    return nxt, changes


def changed_config(old: dict[str, Any], changes: dict[str, Any], run_kind: str) -> dict[str, Any]:
    """The run's config with ``changes`` (dotted or nested keys) applied and validated, writing nothing;
    VersionError (with each validation problem) when it cannot be a new version."""
    if not changes:
        raise VersionError("no settings given to change")
    patch = nest(changes)
    for key in patch:
        kind = kind_of(key)
        if kind == "dataset":
            raise VersionError(f"{key}: a run's dataset and its turns setting are fixed when it is loaded; start"
                               " a new run to change them")
        if kind == "control":
            value = patch[key] if isinstance(patch[key], int) and not isinstance(patch[key], bool) else "N"
            raise VersionError(f"{key}: change it with the run's controls "
                               f"({hint('control', key, value, run=str(old.get('name') or 'RUN'))})")
        if key == "name":
            raise VersionError("name: a run's name cannot change")
    merged = deep_merge(old, patch)
    if run_kind == "generate":
        try:
            new_cfg = build_config(merged, "settings change").snapshot()
        except ConfigError as exc:
            raise VersionError(str(exc), exc.problems) from None
    else:  # a watched / imported run keeps a free-form snapshot; only its reading settings matter
        new_cfg = merged
        _validate_reading(new_cfg)
    if not versioned_changes(old, new_cfg):
        raise VersionError("nothing changes: the run already has these settings")
    return new_cfg


def change_settings(engine: Engine, run_id: int, changes: dict[str, Any], *, actor: str,
                    reason: str | None = None) -> dict[str, Any]:
    """Apply changes (dotted or nested keys) to the run's current config as a new version.

    The whole new config is validated like a config file; a change to the dataset, the run's name or a
    control is refused with the place to change it instead. Returns the new version and its changes."""
    if reason is not None:
        reason = reason.strip()[:1000] or None
    with engine.connect() as conn, store.write_begin(conn):
        store.lock_run(conn, run_id)
        kind_row = conn.execute(text("SELECT kind FROM run WHERE id = :r"), {"r": run_id}).first()
        if kind_row is None:
            raise store.NotFound(f"no run {run_id}")
        _version, old = current(conn, run_id)
        new_cfg = changed_config(old, changes, kind_row[0])
        version, diffs = create_version(conn, run_id, new_cfg, actor=actor, reason=reason)
    return {"run_id": run_id, "version": version, "changes": [{**c.as_dict(), "kind": kind_of(c.path)}
                                                                for c in diffs]}


def _validate_reading(cfg: dict[str, Any]) -> None:
    from pydantic import ValidationError

    from ..config import ReasoningConfig, format_validation_error, validation_problems

    try:
        ReasoningConfig.model_validate(cfg.get("reasoning") or {})
    except ValidationError as exc:
        raise VersionError(format_validation_error(exc, "settings change", ReasoningConfig).replace("\n  ", "\n  reasoning."),
                           [(("reasoning", *loc), msg) for loc, msg in validation_problems(exc, ReasoningConfig)]) from None


# ------------------------------------------------------------------------------------------ resume


def resume_check(stored: dict[str, Any], new: RunConfig) -> list[Change]:
    """What a resume with `new` would change in the run's current generation settings (empty: none).

    The stored snapshot is read through today's RunConfig first, so that a setting added to synthwatch since
    (with its default) is not reported as a change."""
    try:
        stored = build_config(stored, "stored config").snapshot()
    except ConfigError:
        pass
    return versioned_changes(stored, new.snapshot())


def refusal(run_name: str, changes: list[Change]) -> str:
    lines = [f"run {run_name!r} exists and these settings differ from its current config version:"]
    lines += [f"  {c.describe()}" for c in changes]
    lines.append(f"Resuming never changes settings silently: add {NEW_VERSION_FLAG} to make these a new config "
                 "version (records then carry the version they were generated under), or drop the flags.")
    return "\n".join(lines)


def worker_config(conn: Connection, run_id: int, current: RunConfig) -> tuple[RunConfig, int] | None:
    """The run's newest config version as a running worker adopts it (None: no such run): the worker keeps its own
    controls (cap, concurrency) and process settings (PROCESS_KEYS). Raises ConfigError (or a JSON error) when the
    stored version cannot be used."""
    row = conn.execute(text("SELECT config_json, config_version FROM run WHERE id = :r"), {"r": run_id}).first()
    if row is None:
        return None
    cfg = orjson.loads(row[0])
    for key in ("cap", "concurrency", *PROCESS_KEYS):
        cfg[key] = getattr(current, key)
    # what a dashboard change stored is re-checked against the settings policy before the worker acts on it (#34);
    # what this worker already runs with (its operator's configuration) stays allowed
    problems = recheck_versions(history(conn, run_id), cfg, get_settings(), current.snapshot())
    if problems:
        raise ConfigError(f"config version {row[1]}: the dashboard may not set "
                          + "; ".join(f"{k}: {why}" for k, why in problems))
    return build_config(cfg, f"config version {row[1]}"), int(row[1] or 0)
