"""Which tokenizers the dashboard may set for a run: the packaged ones by name, or folders it is allowed to read.

A run's tokenizer is loaded by the dashboard itself (the Tokens tab, token exports), so a tokenizer named in
the start-a-run form or in a run's settings is a path the dashboard will read (the settings policy,
synthwatch.settings_policy, decides which). Like datasets
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
from ..settings_policy import PACKAGED_TOKENIZERS, Refused, tokenizer_folder
from ..tokens.tokenizer import TokenizerSpec
from .folders import LaunchError

PACKAGED_TEMPLATES = PACKAGED_TOKENIZERS


def check_tokenizer(name: str, settings: Settings, base_dir: Path | None = None) -> str:
    """The tokenizer to store for a run: a packaged name as given, else the resolved folder inside an allowed
    folder that holds tokenizer files; LaunchError (what to do instead) otherwise. The settings policy decides."""
    try:
        return tokenizer_folder(name, settings, base_dir)
    except Refused as exc:
        raise LaunchError(str(exc)) from None


def check_template(name: str, settings: Settings, base_dir: Path | None = None) -> str:
    try:
        return tokenizer_folder(name, settings, base_dir, template=True)
    except Refused as exc:
        raise LaunchError(str(exc)) from None


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
