"""The README's quick start shows a dataset row in each accepted shape (#37); the rows load through the real loader,
one prompt each, in the shape the README names."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

from synthwatch.config import DatasetConfig
from synthwatch.sources.datasets import load_dataset


def _example_rows() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```jsonl\n(.*?)```", quick, flags=re.S)
    assert len(blocks) == 1, "the quick start shows one block of dataset rows"
    return blocks[0]


def test_the_readmes_dataset_rows_load_one_prompt_each_in_three_shapes(tmp_path: Path) -> None:
    rows = _example_rows()
    assert len(rows.splitlines()) == 3
    path = tmp_path / "prompts.jsonl"
    path.write_text(rows, encoding="utf-8")
    loaded = load_dataset(DatasetConfig(path=str(path)))
    assert loaded.bad_lines == []
    assert loaded.shape == "mixed: messages 1, conversations (ShareGPT) 1, prompt 1"
    assert [p.messages[-1]["role"] for p in loaded.prompts] == ["user", "user", "user"]
    assert loaded.prompts[0].messages[0] == {"role": "system", "content": "Be brief."}


def test_the_readme_says_how_long_the_first_demo_sets_up() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"first `./dev demo` spends about \d+ minutes setting up", quick)
    assert "quiet minutes are the set-up" in quick
