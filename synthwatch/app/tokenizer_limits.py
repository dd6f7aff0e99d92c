"""Which tokenizers the dashboard may set for a run: the packaged ones by name, or folders it is allowed to read.

A run's tokenizer is loaded by the dashboard itself (the Tokens tab, token exports), so a tokenizer named in
the start-a-run form or in a run's settings is a path the dashboard will read. Like datasets
(SYNTHWATCH_LAUNCH_DATASET_DIRS), it must lie inside a folder the dashboard's settings allow
(SYNTHWATCH_LAUNCH_TOKENIZER_DIRS), symlinks and ``..`` resolved first, and nothing is said about a path
outside them (no existence oracle). Its custom code never runs from a dashboard change: trust_remote_code
stays a command-line / config-file setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request

from ..settings import Settings
from ..tokens.tokenizer import DEEPSEEK_V4, TOKENIZER_FILES, TokenizerSpec
from .folders import LaunchError, allowed_dirs

PACKAGED_TOKENIZERS = (DEEPSEEK_V4,)  # names that load from an installed package, never from a given path
PACKAGED_TEMPLATES = (DEEPSEEK_V4,)


def tokenizer_dirs(settings: Settings, base_dir: Path | None = None) -> list[Path]:
    return allowed_dirs(settings.launch_tokenizer_dirs, base_dir)


def _inside(path: str, what: str, settings: Settings, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    real = p.resolve()
    dirs = tokenizer_dirs(settings, base_dir)
    if not any(real == d or real.is_relative_to(d) for d in dirs):
        shown = ":".join(str(d) for d in dirs) or "(none)"
        raise LaunchError(f"{path!r} is not a packaged {what} ({', '.join(PACKAGED_TOKENIZERS)}) and is outside the "
                          f"folders the dashboard may load tokenizers from ({shown}; the "
                          "SYNTHWATCH_LAUNCH_TOKENIZER_DIRS setting). Put it there, or set it with the command line")
    return real


def check_tokenizer(name: str, settings: Settings, base_dir: Path | None = None) -> str:
    """The tokenizer to store for a run: a packaged name as given, else the resolved folder inside an allowed
    folder that holds tokenizer files; LaunchError (what to do instead) otherwise."""
    name = name.strip()
    if name in PACKAGED_TOKENIZERS:
        return name
    real = _inside(name, "tokenizer", settings, base_dir)  # before any look at the path
    if not real.is_dir():
        raise LaunchError(f"{name!r}: no such folder (give the folder that holds tokenizer.json)")
    if not any((real / f).is_file() for f in TOKENIZER_FILES):
        raise LaunchError(f"{name!r}: the folder has no tokenizer files (looked for {', '.join(TOKENIZER_FILES)})")
    return str(real)


def check_template(name: str, settings: Settings, base_dir: Path | None = None) -> str:
    name = name.strip()
    if name in PACKAGED_TEMPLATES:
        return name
    real = _inside(name, "chat template", settings, base_dir)
    if not real.is_file():
        raise LaunchError(f"{name!r}: no such chat template file")
    return str(real)


def limit_tokenizer_change(patch: dict[str, Any], settings: Settings, base_dir: Path | None = None) -> dict[str, Any]:
    """A settings change (nested, as versions.nest gives it) with its tokenizer checked against the dashboard's
    limits: names resolved to what is stored; a new tokenizer is never trusted to run its own code."""
    tok = patch.get("tokenizer")
    if tok is None:
        return patch
    if not isinstance(tok, dict):
        raise LaunchError("tokenizer: a table with name_or_path (and chat_template)")
    tok = dict(tok)
    if tok.get("trust_remote_code"):
        raise LaunchError("tokenizer.trust_remote_code: cannot be turned on from the dashboard (it runs the "
                          "tokenizer's own code); use `synthwatch fix` or the run's config file")
    if tok.get("name_or_path") is not None:
        if not isinstance(tok["name_or_path"], str):
            raise LaunchError("tokenizer.name_or_path: a tokenizer name or folder")
        tok["name_or_path"] = check_tokenizer(tok["name_or_path"], settings, base_dir)
        tok["trust_remote_code"] = False  # a tokenizer chosen here never runs its code
    if tok.get("chat_template") is not None:
        if not isinstance(tok["chat_template"], str):
            raise LaunchError("tokenizer.chat_template: a .jinja file or a packaged template name")
        tok["chat_template"] = check_template(tok["chat_template"], settings, base_dir)
    return {**patch, "tokenizer": tok}


def tried_spec(request: Request, name: str, template: str | None, reasoning: dict[str, Any]) -> TokenizerSpec | str:
    """The Tokens tab's "try a tokenizer" (?tokenizer=&chat_template=): from this dashboard's own pages only
    (403 otherwise), within its tokenizer folders (else the reason, shown in the tab), never running its code
    (trust_remote_code comes only from the run's own configuration)."""
    if request.headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
        raise HTTPException(403, "a tokenizer to try can be given from this dashboard's own pages only")
    settings = request.app.state.settings
    try:
        name = check_tokenizer(name, settings)
        template = check_template(template, settings) if template else None
    except LaunchError as exc:
        return f"cannot try this tokenizer: {exc}"
    return TokenizerSpec(name, chat_template=template, think_open=reasoning.get("think_open") or "<think>",
                         think_close=reasoning.get("think_close") or "</think>")
