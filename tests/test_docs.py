"""Every setting and every run-configuration key is documented."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from synthwatch.config import RunConfig
from synthwatch.settings import Settings

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        args = typing.get_args(ann)
        if typing.get_origin(ann) is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            out += _keys(args[0], f"{prefix}{name}[].")
            continue
        sub = next((t for t in (ann, *args) if isinstance(t, type) and issubclass(t, BaseModel)), None)
        out += _keys(sub, f"{prefix}{name}.") if sub else [prefix + name]
    return out


def test_every_process_setting_is_documented() -> None:
    text = (DOCS / "settings.md").read_text()
    missing = [n for n in Settings.model_fields if f"`{n}`" not in text or f"SYNTHWATCH_{n.upper()}" not in text]
    assert not missing, f"document these settings in docs/settings.md: {missing}"


def test_every_run_config_key_is_documented() -> None:
    text = (DOCS / "configuration.md").read_text()
    keys = _keys(RunConfig)
    assert "dataset.path" in keys and "endpoints[].base_url" in keys
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"document these keys in docs/configuration.md: {missing}"


def test_every_extended_check_key_is_documented() -> None:
    """The extended checks' TOML keys (#30) each appear in docs/checks.md's examples (`key = ...`)."""
    from synthwatch.check_extended import (
        ExtendedSettings,
        LanguageSettings,
        NearDuplicateSettings,
        RuleCheckSettings,
        UserCheckSettings,
        VerifierSettings,
    )

    text = (DOCS / "checks.md").read_text()
    missing = [f"{m.__name__}.{n}" for m in (VerifierSettings, UserCheckSettings, RuleCheckSettings, LanguageSettings,
                                             NearDuplicateSettings, ExtendedSettings)
               for n in m.model_fields if f"\n{n} =" not in text]
    assert not missing, f"document these keys in docs/checks.md: {missing}"


def test_the_settings_policy_table_is_generated_from_the_policy() -> None:
    """docs/security.md holds the table synthwatch.settings_policy_doc generates from the policy (#34): a key added
    to the policy or to the settings models shows there once the table is regenerated."""
    from synthwatch.settings_policy_doc import DOC, documented, table

    text = DOC.read_text(encoding="utf-8")
    assert documented(text) == table(), "run: python -m synthwatch.settings_policy_doc --write"
    assert "| `judge.endpoint.headers_env` | never:" in text and "| `checks.user[].function` | never:" in text
