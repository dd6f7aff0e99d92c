"""The compare page's settings diff (#28 item 6): what differs, A -> B, and never a secret."""

from __future__ import annotations

from synthwatch.app.routes_lengths import settings_diff_of


def _run(name: str, url: str, max_tokens: int, key_env: str) -> dict[str, object]:
    return {"config": {"name": name, "model": "m", "sampling": {"max_tokens": max_tokens},
                       "endpoints": [{"base_url": url, "api_key_env": key_env}]}}


def test_differences_in_words_names_aside() -> None:
    lines = settings_diff_of(_run("a", "http://h:1/v1", 80, "K"), _run("b", "http://h:1/v1", 120, "K"))
    assert lines == ["sampling.max_tokens: 80 → 120"]
    assert settings_diff_of(_run("a", "http://h:1/v1", 80, "K"), _run("b", "http://h:1/v1", 80, "K")) == []


def test_no_password_and_no_key_variable_is_shown() -> None:
    lines = settings_diff_of(_run("a", "http://u:hunter2@h:1/v1", 80, "SYNTHWATCH_KEY_A"),
                             _run("b", "http://u:hunter3@h:2/v1", 80, "SYNTHWATCH_KEY_B"))
    text = "\n".join(lines)
    assert "hunter" not in text and "SYNTHWATCH_KEY" not in text
    assert "'http://h:1/v1' → 'http://h:2/v1'" in text
