"""Starting a run from the dashboard: validate the form, write a TOML config, launch a worker process.

The worker is the same ``synthwatch run`` a user would type, started detached (its own session)
so that it outlives a dashboard restart; its output goes to a log file beside the database.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import Engine

from ..capture.reasoning import MODES as REASONING_MODES
from ..config import ConfigError, DatasetConfig, RunConfig, build_config, option_kind, options
from ..redact import SecretError, secret_from_env
from ..settings import Settings, get_settings
from ..settings_policy import Context, PolicyError, check_change, key_env_allowed, key_env_refusal
from ..store import queue as store
from .folders import LaunchError, allowed_dirs
from .form_errors import FormErrors

_LABELS = {"api_key_env": "api_key_env", "dataset": "dataset path", "tokenizer": "tokenizer", "endpoints": "endpoints"}


@dataclass
class Launched:
    name: str
    pid: int
    config_path: Path
    log_path: Path
    run_id: int | None = None


def dataset_form_fields() -> list[dict[str, Any]]:
    """The start-a-run form's dataset fields: one per option of DatasetConfig (synthwatch.config)."""
    out = []
    for name, info, opt in options(DatasetConfig):
        kind, choices, at_least_1 = option_kind(info)
        default = None if info.is_required() else info.default
        out.append({"name": name, "form": opt.form, "label": opt.label, "kind": kind, "choices": choices,
                    "min": 1 if at_least_1 else None, "required": info.is_required(), "hint": info.description,
                    "default": ("on" if default else "") if kind == "bool" else ("" if default is None else str(default))})
    return out


PRICE_KEYS = ("price_in_per_mtok", "price_out_per_mtok")  # every endpoint's, named as the TOML keys
FORM_FIELDS = ("name", *(opt.form for _, _, opt in options(DatasetConfig)), "endpoints", "api_key_env", "model", "temperature", "top_p", "max_tokens",
               "concurrency", "cap", "samples_per_prompt", "timeout_s", "idle_timeout_s", "connect_timeout_s", "max_attempts",
               "reasoning_mode", "stream", "turns", "history_reasoning", "tokenizer",
               *PRICE_KEYS)


class LaunchErrors(FormErrors, LaunchError):
    """Every problem of a start-a-run form, by field (a LaunchError whose message lists them all)."""


# RunConfig location -> the start form's field
_FIELD_OF = {("sampling", "temperature"): "temperature",
             ("sampling", "top_p"): "top_p", ("sampling", "max_tokens"): "max_tokens",
             ("timeouts", "total_s"): "timeout_s", ("timeouts", "idle_s"): "idle_timeout_s",
             ("timeouts", "connect_s"): "connect_timeout_s", ("retries", "max_attempts"): "max_attempts",
             ("reasoning", "mode"): "reasoning_mode"}


def form_field(loc: tuple[str | int, ...], msg: str) -> str | None:
    """The start form's field a RunConfig validation problem belongs to (None: the form as a whole)."""
    if not loc:  # a check across fields: today only the endpoints' ones
        return "endpoints" if "endpoint" in msg else None
    if loc[0] == "endpoints":
        return next((k for k in ("api_key_env", *PRICE_KEYS) if k in loc), "endpoints")
    if loc[0] == "tokenizer":
        return "tokenizer"
    if loc[0] == "dataset" and len(loc) > 1:
        return next((opt.form for name, _, opt in options(DatasetConfig) if name == loc[1]), "dataset")
    if loc[:2] in _FIELD_OF:
        return _FIELD_OF[loc[:2]]  # type: ignore[index]
    return str(loc[0]) if len(loc) == 1 and loc[0] in FORM_FIELDS else None


def _num(form: dict[str, str], key: str, kind: type[int] | type[float], label: str, errors: FormErrors) -> Any:
    raw = (form.get(key) or "").strip()
    if not raw:
        return None
    try:
        v = kind(raw)
    except ValueError:
        errors.add(key, label, f"expected a {'whole number' if kind is int else 'number'}, got {raw[:40]!r}")
        return None
    if isinstance(v, float) and not math.isfinite(v):
        errors.add(key, label, f"expected a finite number, got {raw[:40]!r}")
        return None
    return v


def form_to_data(form: dict[str, str], errors: FormErrors) -> dict[str, Any]:
    """Form fields -> a RunConfig-shaped dict (only what the user filled in); each problem goes to ``errors``
    and the parsing goes on, so that the form can show them all at once."""
    data: dict[str, Any] = {}
    name = (form.get("name") or "").strip()
    if name:
        data["name"] = name
    dataset: dict[str, Any] = {}
    for f in dataset_form_fields():
        raw = (form.get(f["form"]) or "").strip()
        if f["kind"] == "bool":
            if raw:
                dataset[f["name"]] = True
        elif f["kind"] == "int":
            v = _num(form, f["form"], int, f["label"].lower(), errors)
            if v is not None:
                dataset[f["name"]] = v
        elif raw:
            dataset[f["name"]] = raw
    if "path" not in dataset:
        errors.add("dataset", "dataset path", "required (a JSONL or Parquet file on the machine running the "
                   "dashboard)")
        dataset["path"] = ""
    data["dataset"] = dataset
    urls = [u.strip() for u in (form.get("endpoints") or "").replace(",", "\n").splitlines() if u.strip()]
    if not urls:
        errors.add("endpoints", "endpoints", "give at least one base URL, e.g. http://127.0.0.1:8001/v1")
    key_env = (form.get("api_key_env") or "").strip() or None
    prices = {k: v for k in PRICE_KEYS if (v := _num(form, k, float, k, errors)) is not None}
    data["endpoints"] = [{"base_url": u, **({"api_key_env": key_env} if key_env else {}), **prices} for u in urls]
    model = (form.get("model") or "").strip()
    if not model:
        errors.add("model", "model", "required (the model name the endpoint serves)")
    data["model"] = model
    data["stream"] = (form.get("stream") or "on") in ("on", "true", "1", "yes")
    for key in ("concurrency", "cap", "samples_per_prompt"):
        v = _num(form, key, int, key.replace("_", " "), errors)
        if v is not None:
            data[key] = v
    sampling: dict[str, Any] = {}
    for key, skind in (("temperature", float), ("top_p", float), ("max_tokens", int)):
        v = _num(form, key, skind, key, errors)
        if v is not None:
            sampling[key] = v
    if sampling:
        data["sampling"] = sampling
    timeouts: dict[str, Any] = {}
    for key, field, label in (("timeout_s", "total_s", "total timeout"), ("idle_timeout_s", "idle_s", "idle timeout"),
                              ("connect_timeout_s", "connect_s", "connect timeout")):
        v = _num(form, key, float, label, errors)
        if v is not None:
            timeouts[field] = v
    if timeouts:
        data["timeouts"] = timeouts
    attempts = _num(form, "max_attempts", int, "max attempts", errors)
    if attempts is not None:
        data["retries"] = {"max_attempts": attempts}
    mode = (form.get("reasoning_mode") or "auto").strip()
    if mode not in REASONING_MODES:
        errors.add("reasoning_mode", "reasoning mode", f"expected one of {', '.join(REASONING_MODES)}, got {mode[:40]!r}")
        mode = "auto"
    data["reasoning"] = {"mode": mode}
    for key, allowed in (("turns", ("last", "all")), ("history_reasoning", ("strip", "keep"))):
        value = (form.get(key) or allowed[0]).strip()
        if value not in allowed:
            errors.add(key, key, f"expected one of {', '.join(allowed)}, got {value[:40]!r}")
            value = allowed[0]
        data[key] = value
    tokenizer = (form.get("tokenizer") or "").strip()
    if tokenizer:
        data["tokenizer"] = {"name_or_path": tokenizer}
    return data


def shown_url(url: str) -> str:
    """A base URL as the dashboard shows it: any user:password@ part left out (keys are never shown)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def config_to_form(config: dict[str, Any]) -> dict[str, str]:
    """A run's stored configuration as the start form's fields ("Start a run like this"): the inverse of
    form_to_data, for what the form can set. The name is left empty (a new run needs its own); API keys are
    never read, only the name of the variable that holds one."""
    def s(v: Any) -> str:
        return "" if v is None else str(v)

    endpoints = [e for e in config.get("endpoints") or [] if isinstance(e, dict) and e.get("base_url")]
    sampling, timeouts = config.get("sampling") or {}, config.get("timeouts") or {}
    dataset = config.get("dataset") or {}
    return {
        "name": "",
        **{f["form"]: ("on" if dataset.get(f["name"]) else "") if f["kind"] == "bool" else s(dataset.get(f["name"]))
           for f in dataset_form_fields()},
        "endpoints": "\n".join(shown_url(str(e["base_url"])) for e in endpoints),
        "api_key_env": next((s(e.get("api_key_env")) for e in endpoints if e.get("api_key_env")), ""),
        **{k: next((s(e.get(k)) for e in endpoints if e.get(k) is not None), "") for k in PRICE_KEYS},
        "model": s(config.get("model")), "temperature": s(sampling.get("temperature")),
        "top_p": s(sampling.get("top_p")), "max_tokens": s(sampling.get("max_tokens")),
        "concurrency": s(config.get("concurrency")), "cap": s(config.get("cap")),
        "samples_per_prompt": s(config.get("samples_per_prompt") if (config.get("samples_per_prompt") or 1) > 1
                                else ""),
        "timeout_s": s(timeouts.get("total_s")), "idle_timeout_s": s(timeouts.get("idle_s")),
        "connect_timeout_s": s(timeouts.get("connect_s")),
        "max_attempts": s((config.get("retries") or {}).get("max_attempts")),
        "reasoning_mode": s((config.get("reasoning") or {}).get("mode") or "auto"),
        "stream": "on" if config.get("stream", True) else "",
        "tokenizer": s((config.get("tokenizer") or {}).get("name_or_path")),
    }


def check_key_env(name: str, settings: Settings) -> None:
    """The form may only name variables meant for it (the settings policy decides: synthwatch.settings_policy)."""
    if not key_env_allowed(name, settings):
        raise LaunchError(f"api_key_env: {key_env_refusal(name)}")


def key_for_dashboard(name: str, settings: Settings) -> str:
    """The value of key variable ``name`` for a request from the dashboard (the probe button, a started run):
    only a variable the dashboard may name (check_key_env), set, and usable as a key (what ``synthwatch run``
    checks at start-up: a value HTTP can carry, long enough to redact). LaunchError names the variable only."""
    check_key_env(name, settings)
    try:
        return secret_from_env(name)
    except SecretError as exc:
        raise LaunchError(f"api_key_env: {exc}") from None


def dataset_dirs(settings: Settings, base_dir: Path | None = None) -> list[Path]:
    return allowed_dirs(settings.launch_dataset_dirs, base_dir)


def check_dataset_path(path: Path, settings: Settings, base_dir: Path | None = None) -> Path:
    """``path`` with every symlink and ``..`` resolved, if it lies inside a folder the settings allow."""
    real = path.resolve()
    dirs = dataset_dirs(settings, base_dir)
    if not any(real == d or real.is_relative_to(d) for d in dirs):
        shown = os.pathsep.join(str(d) for d in dirs) or "(none)"
        raise LaunchError(f"dataset path: {str(path)!r} is outside the folders the dashboard may read datasets from "
                          f"({shown}; the SYNTHWATCH_LAUNCH_DATASET_DIRS setting). Put the dataset there, or start "
                          "the run with `synthwatch run` instead")
    return real


def _message(exc: LaunchError, label: str) -> str:
    return str(exc).removeprefix(f"{label}: ")


def validate(data: dict[str, Any], read_engine: Engine, *, base_dir: Path | None = None,
             settings: Settings | None = None, errors: FormErrors | None = None) -> RunConfig:
    """The run configuration of a start form; every problem (``errors`` holds the form's own) is raised at
    once as LaunchErrors, each with its field."""
    settings = settings or get_settings()
    errs = LaunchErrors(errors.problems if errors is not None else ())
    try:  # the settings policy (synthwatch.settings_policy): key variables, dataset / tokenizer / TLS folders, bounds
        data = check_change(data, {}, Context(settings, base_dir))
    except PolicyError as exc:
        for key, why in exc.problems:
            loc = tuple(int(p) if p.isdigit() else p for p in key.replace("[", ".").replace("]", "").split("."))
            fld = form_field(loc, why)
            errs.add(fld, _LABELS.get(fld or "", key), why)
        data = {**data, "endpoints": [{k: v for k, v in ep.items() if k != "headers_env"} if isinstance(ep, dict)
                                      else ep for ep in data.get("endpoints") or []]}
    for ep in data.get("endpoints") or []:
        name = ep.get("api_key_env") if isinstance(ep, dict) else None
        if name and not errs.has("api_key_env"):
            try:
                key_for_dashboard(name, settings)  # the worker gets this environment: refused here, not after
            except LaunchError as exc:
                errs.add("api_key_env", "api_key_env", _message(exc, "api_key_env"))
    raw_path = (data.get("dataset") or {}).get("path") or ""
    if raw_path and not errs.has("dataset"):
        path = Path(raw_path)
        if not path.exists():
            errs.add("dataset", "dataset path", f"{raw_path!r} does not exist on the machine running the "
                     f"dashboard (looked at {path})")
    config: RunConfig | None = None
    try:
        config = build_config(data, "the start-a-run form")
    except ConfigError as exc:
        errs.add_validation(exc.problems, form_field, skip=[p.field for p in errs.problems if p.field])
        if not exc.problems:
            errs.add(None, "configuration", str(exc))
    if config is not None and config.checks and not errs:  # the policy first: nothing it refused is imported (#34)
        from ..quality.user_checks import loadable_error

        unloadable = loadable_error(config.checks)  # the worker this starts would refuse it (#35): a 400 here
        if unloadable is not None:
            errs.add(None, "checks", unloadable)
    if config is not None and not config.name and not errs:
        from ..sources.load import default_name

        config.name = default_name(config)
    name = config.name if config is not None else data.get("name")
    if name:
        with read_engine.connect() as conn:
            if store.find_run_id(conn, name) is not None:
                errs.add("name", "name", f"a run named {name!r} already exists; choose another name "
                         "(or resume it from the command line with the same name)")
    if errs or config is None:
        raise errs
    return config


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(data: dict[str, Any]) -> str:
    """A RunConfig-shaped dict as TOML (inline tables: small, and exactly what tomllib reads back)."""
    return "".join(f"{k} = {toml_value(v)}\n" for k, v in data.items() if v is not None)


def runs_dir_for(db_url: str) -> Path:
    if db_url.startswith("sqlite:///"):
        return Path(db_url.split("sqlite:///", 1)[1]).parent / "runs"
    return Path.cwd() / "synthwatch-runs"


def _safe_stem(name: str) -> str:
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:80].strip("-.") or "run"
    return f"{stem}-{int(time.time())}"


def start_worker(config: RunConfig, db_url: str, *, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> Launched:
    """Write the config and start `synthwatch run` detached. Returns at once."""
    folder = runs_dir_for(db_url)
    folder.mkdir(parents=True, exist_ok=True)
    stem = _safe_stem(config.name or "run")
    cfg_path = folder / f"{stem}.toml"
    log_path = folder / f"{stem}.log"
    snapshot = config.model_dump(mode="json", exclude_none=True)
    cfg_path.write_text(to_toml(snapshot), encoding="utf-8")
    cmd = [sys.executable, "-m", "synthwatch", "run", "--config", str(cfg_path), "--db", db_url, "--quiet",
           *(extra_args or [])]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env or dict(os.environ), cwd=str(folder))
    # reap the child when it ends (no zombie while the dashboard keeps running)
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    launched = Launched(config.name or "", proc.pid, cfg_path, log_path)
    launched._proc = proc  # type: ignore[attr-defined]
    return launched


def wait_for_run(launched: Launched, read_engine: Engine, timeout_s: float = 20.0) -> int | None:
    """The new run's id once the worker has created it; LaunchError if the worker exited first."""
    proc: subprocess.Popen[bytes] = launched._proc  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with read_engine.connect() as conn:
            rid = store.find_run_id(conn, launched.name)
        if rid is not None:
            launched.run_id = int(rid)
            return launched.run_id
        rc = proc.poll()
        if rc is not None and rc != 0:
            tail = log_tail(launched.log_path)
            raise LaunchError(f"the worker exited with code {rc} before the run started:\n{tail}")
        time.sleep(0.1)
    return None


def log_tail(path: Path, n_bytes: int = 3000) -> str:
    try:
        data = path.read_bytes()[-n_bytes:]
    except OSError:
        return "(no log)"
    return data.decode("utf-8", "replace").strip()
