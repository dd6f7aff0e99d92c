"""Exports for SpecForge and speculators: no silently corrupt row, and each preset as its trainer reads it.

The corrupted-row reproduction of issue #18 (a DeepSeek-R1-style template, a `tokens` export) is here as
a regression test. The presets are checked against the trainers' data contracts as their sources state
them (SpecForge 0.2.0's `scripts/validate_regenerated_data.py`, speculators 0.9.0's pre-tokenized rows);
`./dev compat` runs the trainers' own readers on the same exports (docs/compat.md).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from conftest import ROOT
from test_export import make_run, read_jsonl, read_manifest, specforge_read

from synthwatch.export.plan import ExportOptions
from synthwatch.export.presets import PRESETS, specforge_row_error
from synthwatch.export.stream import export_run
from synthwatch.tokens.tokenizer import DEEPSEEK_V4, TokenizerSpec, load_tokenizer

R1_TEMPLATE = ROOT / "tests" / "data" / "r1_style_chat_template.jinja"
BOS, EOS, USER, ASSISTANT, THINK, END_THINK, NEWLINE = 0, 1, 128803, 128804, 128821, 128822, 201


@pytest.fixture(scope="module")
def r1() -> Any:
    return load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=str(R1_TEMPLATE)))


def r1_run(engine: Any, records: list[dict[str, Any]], **kw: Any) -> int:
    return make_run(engine, records, snapshot_extra={
        "tokenizer": {"name_or_path": DEEPSEEK_V4, "chat_template": str(R1_TEMPLATE)}}, **kw)


# ------------------------------------------------------------------------- no silently corrupt row


def test_r1_template_tokens_rows_are_excluded_and_counted_never_written(engine, tmp_path, r1) -> None:  # type: ignore[no-untyped-def]
    """Issue #18's reproduction: the R1-style template drops the answer's reasoning from the full render and
    its generation prompt (`<｜Assistant｜><think>\\n`) is not a prefix of it. The old export split the text
    at the common character prefix (`…<｜Assistant｜><`) and wrote 12 corrupt rows; none may be written."""
    run_id = r1_run(engine, [{} for _ in range(12)])
    # The render really drops the reasoning, and the prompt's ids are not a prefix of the full ids.
    msgs = [{"role": "user", "content": "What is 0 + 1?"}]
    prompt = r1.apply_chat_template(msgs, add_generation_prompt=True)
    full = r1.apply_chat_template([*msgs, {"role": "assistant", "content": "It is **1**.",
                                           "reasoning_content": "Adding one gives 1."}], add_generation_prompt=False)
    assert prompt.endswith("<｜Assistant｜><think>\n") and "Adding one" not in full
    assert r1.encode(prompt)[-3:] == [ASSISTANT, THINK, NEWLINE]
    assert r1.encode(full)[: len(r1.encode(prompt))] != r1.encode(prompt)

    out = tmp_path / "t.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    assert out.read_bytes() == b""
    assert manifest["counts"]["exported"] == 0
    assert manifest["counts"]["excluded"] == {"template_drops_reasoning": 12}
    assert manifest["counts"]["ok_scanned"] == 12 == manifest["counts"]["excluded_total"]
    # Parquet too: an empty table, never a corrupt row.
    import pyarrow.parquet as pq

    pout = tmp_path / "t.parquet"
    assert export_run(engine, run_id, ExportOptions(format="tokens", out=pout))["counts"]["exported"] == 0
    assert pq.read_table(pout).num_rows == 0


def test_template_drops_past_reasoning_appends_the_answer_as_generated(engine, tmp_path, r1) -> None:  # type: ignore[no-untyped-def]
    run_id = r1_run(engine, [{} for _ in range(4)] + [{"finish_reason": "length"}])
    out = tmp_path / "t.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out, template_drops_past_reasoning=True,
                                                        default_exclusions=False))
    rows = read_jsonl(out)
    assert len(rows) == 5 and manifest["counts"]["excluded"] == {}
    assert manifest["format_options"]["template_drops_past_reasoning"] is True
    assert "appended as generated" in manifest["tokens"]["retokenized_answer"]
    for i, row in enumerate(rows):
        ids, mask, n = row["input_ids"], row["loss_mask"], row["prompt_len"]
        assert mask == [0] * n + [1] * (len(ids) - n)
        assert ids[:2] == [BOS, USER] and ids[n - 3:n] == [ASSISTANT, THINK, NEWLINE]  # as vLLM reports the prompt
        answer = ids[n:]
        reasoning, content = f"The user asks {i} + 1. Adding one gives {i + 1}.", f"It is **{i + 1}**."
        assert answer.count(END_THINK) == 1 and THINK not in answer
        if i < 4:  # stopped by itself: EOS, as one id, under loss
            assert answer[-1] == EOS and EOS not in answer[:-1]
            assert r1.decode(answer) == f"{reasoning}</think>{content}<｜end▁of▁sentence｜>"
        else:  # cut by max_tokens: no EOS
            assert EOS not in answer and r1.decode(answer) == f"{reasoning}</think>{content}"
        # no piece of a special token spelled as text: every "<" in the decoded answer starts a real tag
        assert all(r1.decode([t]) not in ("<", "｜") for t in answer)


def test_prompt_not_a_token_prefix_is_excluded_and_counted(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A template that keeps the reasoning but renders the prompt differently once the answer is there: its
    generation prompt ends `<think>\\n`, the full render has `<think>` directly followed by the reasoning."""
    template = tmp_path / "drift.jinja"
    template.write_text(
        "{{ bos_token }}{%- for m in messages -%}{%- if m['role'] == 'user' -%}{{ '<｜User｜>' + m['content'] }}"
        "{%- else -%}{{ '<｜Assistant｜><think>' + (m['reasoning_content'] or '') + '</think>' + m['content'] + eos_token }}"
        "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<｜Assistant｜><think>\\n' }}{%- endif -%}"
    )
    run_id = make_run(engine, [{}, {}], snapshot_extra={
        "tokenizer": {"name_or_path": DEEPSEEK_V4, "chat_template": str(template)}})
    out = tmp_path / "t.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    assert out.read_bytes() == b"" and manifest["counts"]["excluded"] == {"prompt_not_prefix": 2}


def test_a_template_that_keeps_reasoning_exports_every_row(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, [{} for _ in range(3)])  # the shipped deepseek-v4 template
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=tmp_path / "t.jsonl"))
    assert manifest["counts"]["exported"] == 3 and manifest["counts"]["excluded"] == {}
    assert manifest["tokens"]["split"].startswith("token level")


# ------------------------------------------------------------------ SpecForge's validator, as a contract

_OK_TURNS = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]

# (row, the error SpecForge's validate_regenerated_data.py raises or None), from its source (0.2.0).
VALIDATOR_CASES: list[tuple[dict[str, Any], str | None]] = [
    ({"id": "a", "status": "success", "conversations": _OK_TURNS}, None),
    ({"id": "a", "conversations": _OK_TURNS}, "status must be 'success'"),
    ({"id": "a", "status": "error", "conversations": _OK_TURNS}, "status must be 'success'"),
    ({"id": "", "status": "success", "conversations": _OK_TURNS}, "id must be a non-empty string"),
    ({"id": 7, "status": "success", "conversations": _OK_TURNS}, "id must be a non-empty string"),
    ({"id": "a", "status": "success", "conversations": []}, "conversations must be a non-empty list"),
    ({"id": "a", "status": "success", "conversations": [{"role": "system", "content": "s"}, *_OK_TURNS]}, None),
    ({"id": "a", "status": "success", "conversations": [*_OK_TURNS, {"role": "system", "content": "s"}]},
     "message 2 has unsupported role 'system'"),
    ({"id": "a", "status": "success", "conversations": [{"role": "user", "content": "q"},
                                                        {"role": "assistant", "content": ""}]},
     "message 1 content must be a non-empty string"),
    ({"id": "a", "status": "success", "conversations": [{"role": "user", "content": "q"},
                                                        {"role": "assistant", "content": None}]},
     "message 1 content must be a non-empty string"),
    ({"id": "a", "status": "success", "conversations": [{"role": "user", "content": "q"},
                                                        {"role": "user", "content": "q2"}]},
     "message 1 expected role 'assistant', got 'user'"),
    ({"id": "a", "status": "success", "conversations": [{"role": "assistant", "content": "a"}]},
     "message 0 expected role 'user', got 'assistant'"),
    ({"id": "a", "status": "success", "conversations": [{"role": "user", "content": "q"},
                                                        {"role": "tool", "content": "42"}]},
     "message 1 has unsupported role 'tool'"),
    ({"id": "a", "status": "success", "conversations": [{"role": "user", "content": "q"}]},
     "conversation must end with an assistant message"),
    ({"id": "a", "status": "success", "conversations": [{"role": "system", "content": "s"}]},
     "conversation has no user message"),
    ({"id": "a", "status": "success", "conversations": [{"role": "user", "content": "q"},
                                                        {"role": "assistant", "content": "a", "reasoning_content": 3}]},
     "assistant message 1 reasoning_content must be a string or null"),
]


@pytest.mark.parametrize(("row", "error"), VALIDATOR_CASES)
def test_specforge_validator_rules(row: dict[str, Any], error: str | None) -> None:
    assert specforge_row_error(row) == error


# -------------------------------------------------------------------------------------- presets

SPECFORGE_RECORDS = [
    {"source_id": "sys-1", "prompt_json": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Name a prime."}],
     "reasoning": "Two is the smallest prime.", "content": "2"},
    {"source_id": "multi-1", "prompt_json": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                                             {"role": "user", "content": "Say ünïcödé"}],
     "reasoning": "Unicode: ünïcödé 漢字.", "content": "ünïcödé"},
    {"source_id": "share-1", "prompt_json": [{"from": "human", "value": "ShareGPT prompt"}]},
    {"source_id": "empty-content", "content": ""},
    {"source_id": "marker", "content": "It is </think> 2."},
    {"source_id": "two-users", "prompt_json": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
]


def test_specforge_preset_rows_pass_specforge_rules(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, SPECFORGE_RECORDS)
    out = tmp_path / "sf.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="specforge", out=out))
    lines = out.read_bytes().splitlines()
    rows = [orjson.loads(line) for line in lines]
    assert [r["id"] for r in rows] == ["sys-1", "multi-1", "share-1"]
    assert manifest["counts"]["excluded"] == {"specforge:conversation": 1, "specforge:empty_content": 1,
                                              "specforge:think_marker": 1}
    lt = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=DEEPSEEK_V4))
    for line, row in zip(lines, rows, strict=True):
        assert specforge_row_error(row) is None and row["status"] == "success"
        assert set(row) == {"id", "conversations", "status"}  # SpecForge passes other columns to the template
        _, messages = specforge_read(line)
        answer = messages[-1]
        assert answer["reasoning_content"] and answer["content"]
        rendered = lt.apply_chat_template(messages, add_generation_prompt=False)
        assert f"<think>{answer['reasoning_content']}</think>{answer['content']}<｜end▁of▁sentence｜>" in rendered
    preset = manifest["preset"]
    assert preset["name"] == "specforge" and preset["checked_against"]["version"] == PRESETS["specforge"].version
    assert preset["settings"]["data.train_only_last_turn"] is True
    assert "deepseek-v32" in preset["settings"]["data.chat_template"]
    assert "under loss" in preset["conventions"]["loss"]


def test_specforge_preset_leaves_out_rows_whose_reasoning_the_template_drops(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = r1_run(engine, [{}, {}])
    out = tmp_path / "sf.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="specforge", out=out))
    assert out.read_bytes() == b"" and manifest["counts"]["excluded"] == {"template_drops_reasoning": 2}


def _sim_run(engine: Any, sim: Any, prompts: Any, **over: Any) -> int:
    from workerkit import make_config, run_to_end

    url = sim(token_ids="deepseek", reasoning_field="reasoning", seed=3)
    run_id, final = run_to_end(engine, make_config(url, prompts(5), **over))
    assert final == "completed"
    return run_id


def test_speculators_preset_from_a_simulator_run(engine, sim, prompts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM's conventions, as speculators' regenerate-responses writes them: the prompt (with its prefilled
    `<think>` and newline) is not under loss, the completion is, EOS included when the reply stopped."""
    from workerkit import records

    run_id = _sim_run(engine, sim, prompts, request_token_ids=True,
                      tokenizer={"name_or_path": DEEPSEEK_V4, "chat_template": str(R1_TEMPLATE)})
    out = tmp_path / "spec.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="speculators", out=out))
    rows = read_jsonl(out)
    recs = {f"{r['source_id']}": r for r in records(engine, run_id)}
    assert len(rows) == 5 and manifest["tokens"]["sources"] == {"server": 5}
    for row in rows:
        assert set(row) == {"id", "primary_id", "input_ids", "loss_mask", "metadata"}
        assert row["id"] == f"{row['primary_id']}_gen0"
        ids, mask = row["input_ids"], row["loss_mask"]
        n = mask.index(1)
        assert mask == [0] * n + [1] * (len(ids) - n) and len(ids) == len(mask)
        assert ids[n - 3:n] == [ASSISTANT, THINK, NEWLINE] and ids[-1] == EOS and ids.count(END_THINK) == 1
        rec = recs[row["primary_id"]]
        assert row["metadata"]["finish_reason"] == "stop" == rec["finish_reason"]
        assert row["metadata"]["usage"]["completion_tokens"] == len(ids) - n
    assert manifest["preset"]["checked_against"]["package"] == "speculators"
    # Re-tokenized "as generated" through the R1-style template: the prompt ids are the server's id for id,
    # the completion decodes to the same text and ends the same way. (Its ids may differ: the simulator,
    # like a model, can emit a non-canonical tokenization such as "-" + "check" where encoding the text
    # gives "-check"; that is why the server's ids are preferred when stored.)
    lt = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=str(R1_TEMPLATE)))
    again = tmp_path / "again.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="speculators", out=again, retokenize=True))
    assert manifest["tokens"]["sources"] == {"retokenized": 5}
    for server, retok in zip(rows, read_jsonl(again), strict=True):
        n, m = server["loss_mask"].index(1), retok["loss_mask"].index(1)
        assert retok["input_ids"][:m] == server["input_ids"][:n]
        assert lt.decode(retok["input_ids"][m:]) == lt.decode(server["input_ids"][n:])
        assert retok["input_ids"][-1] == EOS and retok["loss_mask"] == [0] * m + [1] * (len(retok["loss_mask"]) - m)


@pytest.mark.slow
def test_export_cli_for_a_trainer_prints_the_settings(engine, db_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import run_cli

    make_run(engine, SPECFORGE_RECORDS[:2])
    out = tmp_path / "sf.jsonl"
    proc = run_cli("export", "--db", str(db_path), "exp", "--for", "specforge", "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "checked against specforge 0.2.0" in proc.stdout and "data.train_only_last_turn = True" in proc.stdout
    assert len(read_jsonl(out)) == 2
    assert read_manifest(out)["format"] == "specforge"


# ------------------------------------------------- the pre-tokenized readers' rules, as a contract


def pretokenized_row_error(row: dict[str, Any]) -> str | None:
    """What SpecForge's pre-tokenized path (prompt_builder) and speculators' prepare-data pass-through check
    (from their sources, 0.2.0 / 0.9.0): both keys present, one-dimensional lists of ints (token ids not
    bools), a 0/1 mask, equal lengths, not empty, at least one supervised token (else the row is dropped)."""
    ids, mask = row.get("input_ids"), row.get("loss_mask")
    if not isinstance(ids, list) or not isinstance(mask, list):
        return "input_ids and loss_mask must both be lists"
    if not ids:
        return "empty token sequence"
    if len(ids) != len(mask):
        return "input_ids/loss_mask lengths differ"
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return "input_ids must be integers"
    if not all(m in (0, 1) for m in mask):
        return "loss_mask must be 0 or 1"
    if sum(mask) < 1:
        return "no supervised token"
    return None


@pytest.mark.parametrize("fmt", ["tokens", "speculators"])
def test_token_rows_meet_the_pretokenized_readers_rules(engine, sim, prompts, tmp_path, fmt) -> None:  # type: ignore[no-untyped-def]
    run_id = _sim_run(engine, sim, prompts, request_token_ids=True)
    out = tmp_path / "t.jsonl"
    export_run(engine, run_id, ExportOptions(format=fmt, out=out))
    rows = read_jsonl(out)
    assert len(rows) == 5 and all(pretokenized_row_error(r) is None for r in rows)
    assert pretokenized_row_error({"input_ids": [1, True], "loss_mask": [0, 1]}) == "input_ids must be integers"
    assert pretokenized_row_error({"input_ids": [1, 2], "loss_mask": [0, 0]}) == "no supervised token"
