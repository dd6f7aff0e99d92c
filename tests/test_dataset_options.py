"""A dataset option is declared once, as a field of DatasetConfig with an Option (synthwatch.config), and
reaches every surface from there: the flags of `synthwatch run`, the config file's [dataset] table, the
dashboard's start-a-run form, and the loader."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import Field

from synthwatch.app import launch
from synthwatch.app.form_errors import FormErrors
from synthwatch.commands._common import add_option_flags, option_values
from synthwatch.commands.run import _flags_to_config
from synthwatch.config import DatasetConfig, Option, option_kind, options
from synthwatch.sources.datasets import load_dataset


def _parser(model: type[DatasetConfig]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_option_flags(p.add_argument_group("dataset"), model)
    return p


def _example(info: Any, opt: Option) -> tuple[list[str], Any]:
    """Command-line words for one option, and the value the config should get."""
    kind, choices, _ = option_kind(info)
    if opt.flag_value is not None:
        return [opt.flag], opt.flag_value
    if kind == "bool":
        return [opt.flag], True
    if kind == "choice":
        return [opt.flag, str(choices[-1])], choices[-1]
    if kind == "int":
        return [opt.flag, "7"], 7
    return [opt.flag, "x.y"], "x.y"


def test_every_dataset_option_is_a_run_flag_and_a_form_field() -> None:
    declared = options(DatasetConfig)
    assert [name for name, _, _ in declared] == list(DatasetConfig.model_fields)  # none left out
    run = argparse.ArgumentParser()
    from synthwatch.commands import run as run_cmd

    run_cmd.register(run.add_subparsers())
    for name, info, opt in declared:
        words, value = _example(info, opt)
        a = run.parse_args(["run", *words])
        assert _flags_to_config(a)["dataset"] == {name: value}, name
    form_names = [f["form"] for f in launch.dataset_form_fields()]
    assert form_names == [opt.form for _, _, opt in declared]
    assert set(form_names) <= set(launch.FORM_FIELDS)


def test_an_added_option_shows_up_in_the_flags_and_the_form(monkeypatch: Any) -> None:
    class Extended(DatasetConfig):
        max_chars: Annotated[int | None, Option("--max-chars", "Longest prompt (characters)", "dataset_max_chars"),
                             Field(ge=1, description="Skip longer prompts.")] = None

    a = _parser(Extended).parse_args(["--max-chars", "900", "--dataset", "p.jsonl"])
    assert option_values(a, Extended) == {"max_chars": 900, "path": "p.jsonl"}
    monkeypatch.setattr(launch, "DatasetConfig", Extended)
    field = next(f for f in launch.dataset_form_fields() if f["name"] == "max_chars")
    assert field == {"name": "max_chars", "form": "dataset_max_chars", "label": "Longest prompt (characters)",
                     "kind": "int", "choices": None, "min": 1, "required": False, "hint": "Skip longer prompts.",
                     "default": ""}
    errors = FormErrors()
    data = launch.form_to_data({"dataset": "p.jsonl", "dataset_max_chars": "900", "endpoints": "http://h:1/v1",
                                "model": "m"}, errors)
    assert data["dataset"] == {"path": "p.jsonl", "max_chars": 900} and not errors.problems


def test_the_form_round_trips_a_config_and_the_loader_reads_it(tmp_path: Path, live_app: Any) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(f'{{"id": "r{i}", "prompt": "q{i}"}}\n' for i in range(5)))
    stored = {"path": str(path), "format": "jsonl", "prompt_field": "prompt", "id_field": "id", "shuffle": True,
              "seed": 3, "limit": 2, "on_bad_line": "skip", "system_prompt": "Be brief."}
    form = launch.config_to_form({"dataset": stored})
    errors = FormErrors()
    back = launch.form_to_data({**form, "endpoints": "http://h:1/v1", "model": "m"}, errors)["dataset"]
    assert back == stored and not errors.problems
    loaded = load_dataset(DatasetConfig.model_validate(back))
    assert len(loaded.prompts) == 2 and loaded.prompts[0].messages[0] == {"role": "system", "content": "Be brief."}
    html = httpx.get(live_app().url + "/runs/new").text
    for f in launch.dataset_form_fields():
        assert f'name="{f["form"]}"' in html, f["form"]
