"""Load synthwatch exports with the trainers' OWN readers; print one JSON report on stdout.

Runs in the separate environment `./dev compat` builds (.compat-venv: `specforge` and `speculators` from
PyPI with --no-deps, plus only what their data readers import, CPU torch). It never imports synthwatch.

    .compat-venv/bin/python bench/compat_readers.py DIR

DIR holds the exports and `tokenizer/` (the target tokenizer, whose chat template SpecForge renders with).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

THINK, END_THINK, EOS, ASSISTANT = "<think>", "</think>", "<｜end▁of▁sentence｜>", "<｜Assistant｜>"


def _as_list(value: Any) -> list[int]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], list):  # SpecForge keeps a leading batch dimension
        value = value[0]
    return [int(v) for v in value]


def mask_facts(tok: Any, rows: list[tuple[list[int], list[int]]]) -> dict[str, Any]:
    """What the loss mask covers, over every row: <think>, reasoning, </think>, content, EOS, prompt."""
    think_id = tok.convert_tokens_to_ids(THINK)
    close_id = tok.convert_tokens_to_ids(END_THINK)
    eos_id = tok.convert_tokens_to_ids(EOS)
    header_id = tok.convert_tokens_to_ids(ASSISTANT)
    seen: dict[str, set[int]] = {k: set() for k in ("think_open", "reasoning", "think_close", "content", "eos", "prompt")}
    single = {"<think>": True, "</think>": True}
    tails: set[str] = set()
    for ids, mask in rows:
        text = tok.decode(ids, skip_special_tokens=False)
        single["<think>"] &= text.count(THINK) == ids.count(think_id)
        single["</think>"] &= text.count(END_THINK) == ids.count(close_id)
        if 1 not in mask:
            continue
        first = mask.index(1)
        for i in range(first):
            seen["prompt"].add(mask[i])
        header = max((i for i in range(max(0, first - 3), first) if ids[i] == header_id), default=first - 1)
        tails.add(tok.decode(ids[header:first], skip_special_tokens=False))
        trained = list(range(first, len(ids)))
        # the last think block of the trained span (a prefilled <think> may sit just before it)
        close = max((i for i in range(len(ids)) if ids[i] == close_id), default=None)
        opens = [i for i in range(close or 0) if ids[i] == think_id]
        if close is not None and opens:
            start = opens[-1]
            seen["think_open"].add(mask[start])
            # a newline prefilled after <think> belongs to the prompt (see prompt_tail); the rest is reasoning
            for i in range(max(start + 1, first), close):
                seen["reasoning"].add(mask[i])
            seen["think_close"].add(mask[close])
            for i in range(close + 1, len(ids)):
                if ids[i] != eos_id:
                    seen["content"].add(mask[i])
        eos_at = [i for i in trained if ids[i] == eos_id]
        seen["eos"].add(mask[eos_at[-1]] if eos_at else -1)

    def word(values: set[int]) -> str:
        if values == {1}:
            return "loss"
        if values == {0}:
            return "no loss"
        if values == {-1}:
            return "absent"
        return "mixed" if values else "n/a"

    return {
        "think_single_id": single,
        "think_id": think_id,
        "think_close_id": close_id,
        "mask": {k: word(v) for k, v in seen.items()},
        "prompt_tail": sorted(tails),
    }


def quiet(fn: Any, *args: Any, **kw: Any) -> Any:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def count_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def attempt(name: str, path: Path, fn: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"check": name, "file": path.name, "rows_in": count_lines(path) if path.suffix == ".jsonl"
                             else None}
    try:
        entry.update(fn())
        entry["ok"] = True
    except Exception as exc:  # a reader refusing the file is a result, not a crash
        entry["ok"] = False
        text = " ".join(str(exc).split()).replace(str(path.parent), "EXPORTS_DIR")  # stable across runs
        entry["error"] = f"{type(exc).__name__}: {text[:300]}"
        entry["trace"] = traceback.format_exc(limit=3)[-600:]
    return entry


def main(folder: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder / "tokenizer"), local_files_only=True)
    report: dict[str, Any] = {
        "versions": {p: version(p) for p in ("specforge", "speculators", "transformers", "datasets", "torch")},
        "checks": [],
    }
    checks = report["checks"]

    # ---------------------------------------------------------------- SpecForge
    from datasets import load_dataset
    from specforge.data.preprocessing import build_eagle3_dataset
    from specforge.data.prompt_builder import prepare_prompt_tasks

    def specforge_build(path: Path, entry: str, last_only: bool) -> Any:
        def run() -> dict[str, Any]:
            ds = quiet(load_dataset, "json", data_files=str(path), split="train")
            out = quiet(build_eagle3_dataset, ds, tok, chat_template=entry, max_length=8192, num_proc=1,
                        train_only_last_turn=last_only)
            rows = [(_as_list(r["input_ids"]), _as_list(r["loss_mask"])) for r in out]
            trained_turns = sorted({sum(1 for i in range(1, len(m)) if m[i] == 1 and m[i - 1] == 0)
                                    for _, m in rows})
            facts = mask_facts(tok, rows)
            texts = [tok.decode(ids, skip_special_tokens=False) for ids, _ in rows]
            wanted = [t["reasoning_content"] for line in path.read_text(encoding="utf-8").splitlines() if line
                      for t in json.loads(line)["conversations"] if t.get("reasoning_content")]
            calls_id = tok.convert_tokens_to_ids("<｜tool▁calls▁begin｜>")
            facts.update(rows_with_trained_tool_call=sum(
                any(i == calls_id and m == 1 for i, m in zip(ids, mask, strict=True)) for ids, mask in rows))
            facts.update(rows_out=len(rows), trained_spans_per_row=trained_turns,
                         rows_with_reasoning=sum(any(w in text for w in wanted) for text in texts),
                         rows_with_default_system_prompt=sum("You are a helpful assistant." in t for t in texts))
            return facts
        return run

    for path in sorted(folder.glob("specforge*.jsonl")):
        checks.append(attempt("SpecForge build_eagle3_dataset (deepseek-v32, train_only_last_turn)", path,
                              specforge_build(path, "deepseek-v32", True)))
        checks.append(attempt("SpecForge build_eagle3_dataset (deepseek-v32, default: every turn)", path,
                              specforge_build(path, "deepseek-v32", False)))
        checks.append(attempt("SpecForge build_eagle3_dataset (deepseek-v3)", path,
                              specforge_build(path, "deepseek-v3", True)))

    def specforge_pretokenized(path: Path) -> Any:
        def run() -> dict[str, Any]:
            tasks = quiet(prepare_prompt_tasks, str(path), tok, chat_template="deepseek-v32", max_length=8192,
                          is_preformatted=False, train_only_last_turn=True, cache_dir=None, cache_key=None,
                          num_proc=1)
            rows = [(_as_list(t["payload"]["input_ids"]), _as_list(t["payload"]["loss_mask"])) for t in tasks]
            facts = mask_facts(tok, rows)
            facts["rows_out"] = len(rows)
            return facts
        return run

    for pattern in ("speculators*.jsonl", "tokens*.jsonl", "tokens*.parquet"):
        for path in sorted(folder.glob(pattern)):
            checks.append(attempt("SpecForge pre-tokenized path (prepare_prompt_tasks, data.prompts_path)", path,
                                  specforge_pretokenized(path)))
    for path in sorted(folder.glob("messages*.jsonl")):
        checks.append(attempt("SpecForge build_eagle3_dataset (deepseek-v32)", path,
                              specforge_build(path, "deepseek-v32", True)))

    # ------------------------------------------------------------- speculators
    from speculators.cli.prepare_data import prepare_data
    from speculators.train.data import ArrowDataset

    def speculators_prepare(path: Path) -> Any:
        def run() -> dict[str, Any]:
            out_dir = folder / f"prepared-{path.stem}"
            quiet(prepare_data, model=str(folder / "tokenizer"), data=[str(path)], output=str(out_dir),
                  seq_length=8192, num_preprocessing_workers=1, overwrite=True)
            loader = quiet(ArrowDataset, max_len=8192, datapath=str(out_dir), on_missing="skip")
            rows = [(_as_list(loader.data[i]["input_ids"]), _as_list(loader.data[i]["loss_mask"]))
                    for i in range(len(loader))]
            sample = loader[0] if len(loader) else None
            facts = mask_facts(tok, rows)
            facts.update(rows_out=len(rows), loader_rows=len(loader),
                         loader_lengths_match=loader.approx_lengths == [len(r[0]) for r in rows],
                         loader_item=type(sample).__name__ + " (hidden states come from vLLM at training time)")
            return facts
        return run

    for pattern in ("speculators*.jsonl", "tokens*.jsonl", "tokens*.parquet", "messages*.jsonl", "specforge*.jsonl"):
        for path in sorted(folder.glob(pattern)):
            checks.append(attempt("speculators prepare-data + ArrowDataset", path, speculators_prepare(path)))
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), ensure_ascii=False, indent=1))
