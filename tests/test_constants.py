"""Vocabularies declared once reach every surface that offers them: a mode added to capture's ReasoningMode
is a choice of every --reasoning-mode flag, a value the run config accepts, and an option of the dashboard's
start-a-run and repair forms; the statuses the dashboard groups by come from the schema's lists."""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import pytest
from test_export import make_run

from synthwatch.capture.reasoning import MODES
from synthwatch.cli import build_parser
from synthwatch.config import ConfigError, build_config
from synthwatch.review import filters as review_filters
from synthwatch.store.models import FINISHED_STATUSES, LIVE_STATUSES, RECORD_STATUSES, RUN_STATUSES


def _reasoning_mode_flags(parser: argparse.ArgumentParser) -> dict[str, Any]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                for a in sub._actions:
                    if "--reasoning-mode" in a.option_strings:
                        found[verb] = a.choices
    return found


def test_every_reasoning_mode_flag_and_the_config_offer_the_declared_modes() -> None:
    flags = _reasoning_mode_flags(build_parser())
    assert {"run", "fix", "watch", "import"} <= set(flags), flags
    assert all(tuple(choices) == MODES for choices in flags.values()), flags
    base = {"dataset": {"path": "p.jsonl"}, "model": "m", "endpoints": [{"base_url": "http://127.0.0.1:9/v1"}]}
    for mode in MODES:
        assert build_config({**base, "reasoning": {"mode": mode}}, "test").reasoning.mode == mode
    with pytest.raises(ConfigError, match="reasoning"):
        build_config({**base, "reasoning": {"mode": "reasoning_text"}}, "test")


def test_the_dashboard_forms_offer_every_reasoning_mode(engine: Any, live_app: Any) -> None:
    run_id = make_run(engine, [{}])
    srv = live_app()
    for page in ("/runs/new", f"/runs/{run_id}/repair"):
        html = httpx.get(srv.url + page).text
        assert all(f'<option value="{m}"' in html for m in MODES), page


def test_statuses_are_the_schema_lists() -> None:
    assert set(LIVE_STATUSES) < set(RUN_STATUSES) and "completed" not in LIVE_STATUSES
    assert set(FINISHED_STATUSES) < set(RECORD_STATUSES)
    assert sorted(review_filters.STATUSES) == sorted(RECORD_STATUSES) and review_filters.STATUSES[:3] == FINISHED_STATUSES
