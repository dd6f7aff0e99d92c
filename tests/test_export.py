"""Export: formats round-trip through real readers, selection is counted, bad requests write nothing."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import ROOT, cli_env, run_cli
from sqlalchemy import text

from synthwatch.cli import main as cli_main
from synthwatch.config import RunConfig
from synthwatch.export.plan import ExportError, ExportOptions
from synthwatch.export.stream import export_run, manifest_path, prepare_export
from synthwatch.store import queue as store
from synthwatch.tokens.tokenizer import DEEPSEEK_V4, TokenizerSpec, load_tokenizer

THINK_OPEN_ID, THINK_CLOSE_ID = 128821, 128822  # DeepSeek-V4 (reference/training-formats.md)

# ------------------------------------------------------------------------------------ building runs

_RECORD_COLS = ("run_id", "idx", "source_id", "rnd", "prompt_json", "status", "reasoning", "content",
                "finish_reason", "review", "review_reason", "check_flags", "content_null", "attempts",
                "token_ids_json", "usage_json", "error")


def make_run(engine: Any, records: list[dict[str, Any]], *, name: str = "exp", tokenizer: str | None = DEEPSEEK_V4,
             expect: bool = True, request_token_ids: bool = False, snapshot_extra: dict[str, Any] | None = None) -> int:
    """A run with these records, written straight into the real SQLite file (as the writer would)."""
    data: dict[str, Any] = {
        "name": name, "dataset": {"path": "prompts.jsonl"}, "model": "sim-reasoner",
        "endpoints": [{"base_url": "http://127.0.0.1:9/v1", "api_key_env": "MY_KEY"}],
        "reasoning": {"expect": expect}, "request_token_ids": request_token_ids,
    }
    if tokenizer:
        data["tokenizer"] = {"name_or_path": tokenizer, "chat_template": DEEPSEEK_V4}
    config = RunConfig.model_validate(data)
    snapshot = {**config.snapshot(), **(snapshot_extra or {})}
    rows = []
    for i, r in enumerate(records):
        row = {c: None for c in _RECORD_COLS}
        row.update(idx=i, rnd=0.5, status="ok", check_flags=0, content_null=False, attempts=1,
                   prompt_json=[{"role": "user", "content": f"What is {i} + 1?"}],
                   reasoning=f"The user asks {i} + 1. Adding one gives {i + 1}.", content=f"It is **{i + 1}**.",
                   finish_reason="stop")
        row.update(r)
        for key in ("prompt_json", "token_ids_json"):
            if row[key] is not None and not isinstance(row[key], str):
                row[key] = orjson.dumps(row[key]).decode()
        rows.append(row)
    with engine.connect() as conn, store.write_begin(conn):
        run_id = store.create_run(conn, name, config, snapshot=snapshot)
        if rows:  # raw executemany: thousands of rows in milliseconds
            conn.exec_driver_sql(
                f"INSERT INTO record ({', '.join(_RECORD_COLS)}) VALUES ({', '.join('?' * len(_RECORD_COLS))})",
                [tuple(run_id if c == "run_id" else row[c] for c in _RECORD_COLS) for row in rows],
            )
        store.recount(conn, run_id)
    return run_id


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def read_manifest(out: Path) -> dict[str, Any]:
    return orjson.loads(manifest_path(out).read_bytes())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def lt() -> Any:
    return load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=DEEPSEEK_V4))


VARIED = [
    {"source_id": "sys-1", "prompt_json": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Name a prime."}],
     "reasoning": "Two is the smallest prime.\nIt is also even.", "content": "2"},
    {"source_id": "multi-1", "prompt_json": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                                             {"role": "user", "content": "Say 'ünïcödé' and <b>bold</b>"}],
     "reasoning": "They want unicode: ünïcödé 漢字 🙂.", "content": "ünïcödé <b>bold</b>"},
    {"source_id": "share-1", "prompt_json": [{"from": "human", "value": "ShareGPT-style prompt"}],
     "reasoning": "A ShareGPT prompt.", "content": "Answer."},
    {},
]


# ----------------------------------------------------------------------------- SpecForge-style reader


def specforge_read(line: bytes) -> tuple[str, list[dict[str, Any]]]:
    """A reader following SpecForge's documented data rules (ThinkingParser over the GeneralParser).

    A row is {"id": str, "conversations": [...]}; a turn is role/content (ShareGPT from/value with
    human/gpt accepted); a leading system turn is kept; turns before the first user turn are dropped;
    an assistant turn must follow a user (or tool) turn, otherwise the conversation is truncated there;
    only role, content, tool_calls and reasoning_content survive. Returns (id, messages) and fails
    loudly where SpecForge would silently drop or truncate data.
    """
    row = orjson.loads(line)
    assert set(row) >= {"id", "conversations"}, row.keys()
    assert isinstance(row["id"], str) and row["id"], row["id"]
    conv = []
    for m in row["conversations"]:
        role = m.get("role", m.get("from", ""))
        role = {"human": "user", "gpt": "assistant"}.get(role, role)
        content = m.get("content") or m.get("value") or ""
        assert isinstance(content, str), "SpecForge turns hold string content"
        conv.append({**{k: v for k, v in m.items() if k not in ("from", "value")}, "role": role, "content": content})
    messages = []
    if conv and conv[0]["role"] == "system":
        messages.append({"role": "system", "content": conv[0]["content"]})
        conv = conv[1:]
    assert conv and conv[0]["role"] == "user", "a conversation must start with a user turn (else dropped)"
    for j, turn in enumerate(conv):
        if j and turn["role"] == "assistant":
            assert conv[j - 1]["role"] in ("user", "tool"), "assistant after assistant: SpecForge truncates here"
        if j and turn["role"] == "user":
            assert conv[j - 1]["role"] in ("assistant", "tool"), "user after user: not alternating"
        messages.append({k: v for k, v in turn.items() if k in ("role", "content", "tool_calls", "reasoning_content")})
    assert messages[-1]["role"] == "assistant", "the conversation must end with the answer to train on"
    return row["id"], messages


# ------------------------------------------------------------------------------------- round trips


def test_sharegpt_parses_with_specforge_rules_and_keeps_reasoning(engine, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, VARIED)
    out = tmp_path / "sg.jsonl"
    export_run(engine, run_id, ExportOptions(format="sharegpt", out=out))
    lines = out.read_bytes().splitlines()
    assert len(lines) == len(VARIED)
    ids = []
    for line, rec in zip(lines, VARIED, strict=True):
        rid, messages = specforge_read(line)
        ids.append(rid)
        answer = messages[-1]
        assert answer["reasoning_content"] == rec.get("reasoning", answer["reasoning_content"])
        assert answer["content"] == rec.get("content", answer["content"])
        # ThinkingParser renders the turns through the chat template: the reasoning must survive it
        rendered = lt.apply_chat_template(messages, add_generation_prompt=False)
        assert f"<think>{answer['reasoning_content']}</think>{answer['content']}" in rendered
    assert ids[:3] == ["sys-1", "multi-1", "share-1"] and ids[3] == "exp-3"
    first = orjson.loads(lines[0])["conversations"]
    assert [t["role"] for t in first] == ["system", "user", "assistant"]


def test_sharegpt_think_inline_folds_reasoning_between_the_think_strings(engine, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, VARIED)
    out = tmp_path / "inline.jsonl"
    export_run(engine, run_id, ExportOptions(format="sharegpt", out=out, think_inline=True))
    for line in out.read_bytes().splitlines():
        _, messages = specforge_read(line)
        answer = messages[-1]
        assert "reasoning_content" not in answer
        reasoning, content = answer["content"].removeprefix("<think>").split("</think>")
        assert answer["content"] == f"<think>{reasoning}</think>{content}" and reasoning
        ids = lt.encode(answer["content"])
        assert ids.count(THINK_OPEN_ID) == 1 and ids.count(THINK_CLOSE_ID) == 1  # single ids, not text pieces


def test_sharegpt_from_value_is_what_eagle_reads(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, VARIED[:2])
    out = tmp_path / "eagle.jsonl"
    export_run(engine, run_id, ExportOptions(format="sharegpt", out=out, from_value=True, think_inline=True))
    first, second = read_jsonl(out)
    assert first["id"] == "sys-1" and first["conversations"] == [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "Name a prime."},
        {"from": "gpt", "value": "<think>Two is the smallest prime.\nIt is also even.</think>2"}]
    assert [t["from"] for t in second["conversations"]] == ["human", "gpt", "human", "gpt"]
    for line in out.read_bytes().splitlines():
        specforge_read(line)  # SpecForge normalises from/value too


def test_messages_render_through_a_real_chat_template(engine, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, VARIED)
    out = tmp_path / "m.jsonl"
    export_run(engine, run_id, ExportOptions(format="messages", out=out))
    rows = read_jsonl(out)
    assert len(rows) == len(VARIED)
    for row, rec in zip(rows, VARIED, strict=True):
        msgs = row["messages"]
        assert all(set(m) >= {"role", "content"} for m in msgs)  # ShareGPT prompts come out as role/content
        answer = msgs[-1]
        assert answer["role"] == "assistant" and set(answer) == {"role", "reasoning_content", "content"}
        # the HF tokenizer's apply_chat_template with the shipped DeepSeek-V4 template
        rendered = lt.tok.apply_chat_template(msgs, chat_template=lt.chat_template, tokenize=False)
        prompt = lt.tok.apply_chat_template(msgs[:-1], chat_template=lt.chat_template, tokenize=False,
                                            add_generation_prompt=True)
        assert rendered.startswith(prompt)
        assert rendered[len(prompt):] == f"{answer['reasoning_content']}</think>{answer['content']}<｜end▁of▁sentence｜>"
        if rec.get("reasoning"):
            assert answer["reasoning_content"] == rec["reasoning"] and answer["content"] == rec["content"]


def test_tokens_retokenized_decode_back_with_single_think_ids_and_exact_loss_mask(engine, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, VARIED)
    out = tmp_path / "t.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    rows = read_jsonl(out)
    assert len(rows) == len(VARIED) and {r["source"] for r in rows} == {"retokenized"}
    with engine.connect() as conn:
        recs = conn.execute(text("SELECT prompt_json, reasoning, content FROM record WHERE run_id = :r ORDER BY id"),
                            {"r": run_id}).all()
    for row, (prompt_json, reasoning, content) in zip(rows, recs, strict=True):
        ids, mask, n = row["input_ids"], row["loss_mask"], row["prompt_len"]
        assert len(ids) == len(mask) and mask == [0] * n + [1] * (len(ids) - n)
        # decodes back to the record's text: the prompt as the template renders it, then exactly the answer
        prompt = [{"role": {"human": "user"}.get(m["from"], m["from"]), "content": m["value"]} if "from" in m else m
                  for m in orjson.loads(prompt_json)]
        prompt_text = lt.apply_chat_template(prompt, add_generation_prompt=True)
        assert lt.decode(ids[:n]) == prompt_text
        assert lt.decode(ids[n:]) == f"{reasoning}</think>{content}<｜end▁of▁sentence｜>"
        # every delimiter in the text is its single id; the answer's <think> is prefilled in the prompt
        full = lt.decode(ids)
        assert full.count("<think>") == ids.count(THINK_OPEN_ID) and full.count("</think>") == ids.count(THINK_CLOSE_ID)
        assert ids[n - 1] == THINK_OPEN_ID and ids[n:].count(THINK_CLOSE_ID) == 1 and THINK_OPEN_ID not in ids[n:]
        assert lt.encode(reasoning) == ids[n:n + len(lt.encode(reasoning))]
    tok = manifest["tokens"]
    assert tok["sources"] == {"retokenized": len(VARIED)}
    assert tok["tokenizer"]["think_open_id"] == THINK_OPEN_ID and tok["tokenizer"]["think_close_id"] == THINK_CLOSE_ID
    assert tok["chat_template"] == "synthwatch:deepseek-v4"


def test_tokens_parquet_holds_the_same_rows(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow.parquet as pq

    run_id = make_run(engine, VARIED)
    export_run(engine, run_id, ExportOptions(format="tokens", out=tmp_path / "t.jsonl"))
    out = tmp_path / "t.parquet"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    assert manifest["file"]["container"] == "parquet"
    table = pq.read_table(out)
    assert table.column_names == ["id", "input_ids", "loss_mask", "prompt_len", "source"]
    assert table.to_pylist() == read_jsonl(tmp_path / "t.jsonl")
    assert manifest["file"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


def test_tokens_from_server_ids_of_a_real_worker_run(engine, sim, prompts, tmp_path, lt) -> None:  # type: ignore[no-untyped-def]
    from workerkit import make_config, records, run_to_end

    url = sim(token_ids="deepseek", seed=5)
    config = make_config(url, prompts(6), request_token_ids=True)  # no tokenizer: the server's ids suffice
    run_id, final = run_to_end(engine, config)
    assert final == "completed"
    out = tmp_path / "server.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    rows = read_jsonl(out)
    recs = records(engine, run_id)
    assert len(rows) == 6 and manifest["tokens"]["sources"] == {"server": 6}
    assert manifest["tokens"]["tokenizer"] is None
    for row, rec in zip(rows, recs, strict=True):
        server = orjson.loads(rec["token_ids_json"])
        assert row["input_ids"] == server["prompt"] + server["completion"]
        assert row["loss_mask"] == [0] * len(server["prompt"]) + [1] * len(server["completion"])
        assert row["prompt_len"] == len(server["prompt"])
        answer = row["input_ids"][row["prompt_len"]:]
        assert lt.decode(answer) == f"{rec['reasoning']}</think>{rec['content']}<｜end▁of▁sentence｜>"
        assert answer.count(THINK_CLOSE_ID) == 1 and answer[-1] == 1  # vLLM's ids end with EOS on "stop"
        assert row["input_ids"][row["prompt_len"] - 3:row["prompt_len"]] == [128804, THINK_OPEN_ID, 201]


def test_server_ids_suffice_when_the_runs_tokenizer_is_not_here(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ids = {"prompt": [0, 128803, 83, 128804], "completion": [128821, 37947, 128822, 634, 1]}
    run_id = make_run(engine, [{"token_ids_json": ids}, {}], tokenizer="/no/such/tokenizer", request_token_ids=True)
    out = tmp_path / "t.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="tokens", out=out))
    assert read_jsonl(out) == [{"id": "exp-0", "input_ids": ids["prompt"] + ids["completion"],
                                "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1, 1], "prompt_len": 4, "source": "server"}]
    assert manifest["counts"]["excluded"] == {"no_token_ids": 1}
    assert "/no/such/tokenizer" in manifest["tokens"]["tokenizer"]["unavailable"]
    with pytest.raises(ExportError, match="cannot load tokenizer"):  # asked for explicitly: an error
        prepare_export(engine, run_id, ExportOptions(format="tokens", out=out, tokenizer="/no/such/tokenizer"))


# ------------------------------------------------------------------------------------------- selection


SELECTION = [
    {"review": "good"},                                   # 0 kept
    {"review": "bad", "review_reason": "wrong answer"},   # 1 flagged_bad
    {"reasoning": None},                                  # 2 empty_reasoning
    {"reasoning": "  \n "},                               # 3 empty_reasoning (blank)
    {"finish_reason": "length"},                          # 4 truncated
    {"review": "bad", "finish_reason": "length"},         # 5 flagged_bad (first reason wins)
    {"status": "error", "reasoning": None, "content": None, "error": "HTTP 500"},  # 6 never exported
    {"status": "pending", "reasoning": None, "content": None},                     # 7 never exported
    {},                                                   # 8 kept
    {"review": "good", "reasoning": ""},                  # 9 empty_reasoning even if reviewed good
]


def _ids(path: Path) -> list[str]:
    return [r["id"] for r in read_jsonl(path)]


def test_flagged_and_failing_records_are_excluded_and_counted(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, SELECTION, snapshot_extra={"webhook_url": "https://hooks.example/T0/SECRET",
                                                          "api_key": "sk-live-123", "nested": {"auth_token": "x"}})
    out = tmp_path / "sel.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="messages", out=out))
    assert _ids(out) == ["exp-0", "exp-8"]
    counts = manifest["counts"]
    assert counts == {
        "records_in_run": 10, "not_ok": {"error": 1, "pending": 1}, "ok_scanned": 8, "exported": 2,
        "excluded": {"empty_reasoning": 3, "flagged_bad": 2, "truncated": 1}, "excluded_total": 6,
    }
    assert [c["name"] for c in manifest["selection"]["checks_applied"]] == ["empty_reasoning", "truncated"]
    assert manifest["file"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert manifest["format"] == "messages" and manifest["run"]["name"] == "exp"
    # the run config is there, without anything secret-looking; env-var NAMES stay
    config = manifest["run_config"]
    assert config["endpoints"][0]["api_key_env"] == "MY_KEY" and config["model"] == "sim-reasoner"
    dumped = orjson.dumps(manifest).decode()
    for secret in ("sk-live-123", "SECRET", '"x"'):
        assert secret not in dumped
    assert config["tokenizer"]["name_or_path"] == DEEPSEEK_V4 and config["sampling"]["max_tokens"] is None


def test_the_summary_says_each_check_in_words(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """#37: "check_flags has bit 4" in the export summary; a person reads what fails the check (the bit stays in
    the manifest beside it, for programs)."""
    from synthwatch.check_catalog import CHECK_INFO

    run_id = make_run(engine, SELECTION)
    manifest = export_run(engine, run_id, ExportOptions(format="messages", out=tmp_path / "w.jsonl",
                                                        exclude_checks=("think_tags_in_content",)))
    applied = {c["name"]: c for c in manifest["selection"]["checks_applied"]}
    tags = applied["think_tags_in_content"]
    assert tags["rule"] == CHECK_INFO["think_tags_in_content"] and "bit" not in tags["rule"]
    assert isinstance(tags["check_flags_bit"], int)


def test_selection_options(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, SELECTION)

    def export(**kw: Any) -> tuple[list[str], dict[str, Any]]:
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}.jsonl"
        m = export_run(engine, run_id, ExportOptions(format="raw", out=out, **kw))
        return _ids_raw(out), m["counts"]["excluded"]

    def _ids_raw(path: Path) -> list[str]:
        return [str(r["idx"]) for r in read_jsonl(path)]

    assert export(only_good=True) == (["0"], {"empty_reasoning": 1, "flagged_bad": 2, "not_reviewed_good": 4})
    assert export(include_flagged=True) == (["0", "1", "8"], {"empty_reasoning": 3, "truncated": 2})
    assert export(default_exclusions=False) == (["0", "2", "3", "4", "8", "9"], {"flagged_bad": 2})
    assert export(default_exclusions=False, exclude_checks=("truncated",))[1] == {"flagged_bad": 2, "truncated": 1}
    # any check of synthwatch.quality.checks, by its bit in record.check_flags
    from synthwatch.check_catalog import BIT

    with engine.connect() as conn, store.write_begin(conn):
        conn.execute(text("UPDATE record SET check_flags = :b WHERE run_id = :r AND idx IN (0, 2)"),
                     {"b": BIT["repetition"] | BIT["empty_reasoning"], "r": run_id})
    assert export(exclude_checks=("repetition",)) == (["8"], {"check:repetition": 1, "empty_reasoning": 3,
                                                              "flagged_bad": 2, "truncated": 1})
    # raw keeps every stored field
    row = read_jsonl(next(p for p in tmp_path.iterdir() if p.suffix == ".jsonl"))[0]
    assert {"prompt_json", "reasoning", "content", "usage_json", "token_ids_json", "check_flags", "review",
            "latency_s", "attempts_json", "extra_json"} <= set(row)


def test_empty_reasoning_is_kept_when_the_run_expects_none(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, [{"reasoning": None}, {}], expect=False)
    manifest = export_run(engine, run_id, ExportOptions(format="messages", out=tmp_path / "n.jsonl"))
    assert manifest["counts"]["exported"] == 2 and manifest["counts"]["excluded"] == {}


# ------------------------------------------------------------------------------ bad requests, interrupts


def _cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    code = cli_main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("args", "message"), [
    (("nope", "--format", "messages"), "no run 'nope'"),
    (("exp", "--format", "alpaca"), "unknown format 'alpaca'; choose one of messages, sharegpt, tokens, raw, specforge, speculators"),
    (("exp", "--for", "specforge", "--format", "tokens"), "--for specforge writes its own format"),
    (("exp",), "give --format FORMAT or --for TRAINER"),
    (("exp", "--format", "sharegpt", "--template-drops-past-reasoning"),
     "--template-drops-past-reasoning applies to the tokens format only"),
    (("exp", "--format", "messages", "--parquet"), "Parquet output is available for the tokens format"),
    (("exp", "--format", "raw", "--exclude-check", "made_up"), "unknown check 'made_up'"),
    (("exp", "--format", "messages", "--think-inline"), "--think-inline applies to the sharegpt format only"),
    (("exp", "--format", "tokens", "--from-value"), "--from-value applies to the sharegpt format only"),
    (("exp", "--format", "tokens", "--tokenizer", "/no/such/tok"), "cannot load tokenizer '/no/such/tok'"),
    (("exp", "--format", "tokens", "--tokenizer", "deepseek-v4", "--chat-template", "/no/such.jinja"),
     "cannot load chat template '/no/such.jinja'"),
])
def test_bad_requests_fail_before_writing(engine, db_path, tmp_path, capsys, args, message) -> None:  # type: ignore[no-untyped-def]
    make_run(engine, [{}, {}])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _out, err = _cli(capsys, "export", "--db", str(db_path), *args, "--out", str(out_dir / "x.jsonl"))
    assert code == 2 and message in err, err
    assert "Traceback" not in err
    assert list(out_dir.iterdir()) == []


def test_tokens_without_ids_or_tokenizer_is_refused(engine, db_path, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    make_run(engine, [{}], name="notok", tokenizer=None)
    out = tmp_path / "t.jsonl"
    code, _, err = _cli(capsys, "export", "--db", str(db_path), "notok", "-f", "tokens", "-o", str(out))
    assert code == 2 and "a tokens export needs token ids" in err and "--tokenizer" in err
    assert not out.exists() and not manifest_path(out).exists()
    # a missing output folder and a missing database are named
    code, _, err = _cli(capsys, "export", "--db", str(db_path), "notok", "-f", "raw", "-o", str(tmp_path / "no/x"))
    assert code == 2 and f"output directory {tmp_path / 'no'} does not exist" in err
    code, _, err = _cli(capsys, "export", "--db", str(tmp_path / "missing.db"), "notok", "-f", "raw", "-o", str(out))
    assert code == 2 and "no database at" in err and not (tmp_path / "missing.db").exists()
    with pytest.raises(ExportError, match="is the database itself"):
        prepare_export(engine, "notok", ExportOptions(format="raw", out=db_path))


def test_interrupted_export_leaves_no_file_under_the_final_name(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, [{} for _ in range(50)])
    out = tmp_path / "exports" / "x.jsonl"
    out.parent.mkdir()
    out.write_text("previous export\n")
    pages: list[int] = []

    def progress(done: int, total: int) -> None:
        pages.append(done)
        if done >= 20:
            assert (out.parent / "x.jsonl.partial").stat().st_size > 0  # the rows went to the partial file
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_run(engine, run_id, ExportOptions(format="messages", out=out, page_size=10), progress)
    assert pages == [0, 10, 20]
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.jsonl"]
    assert out.read_text() == "previous export\n"  # the earlier file is untouched


def test_cli_export_with_progress_and_sigint(engine, db_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    make_run(engine, [{} for _ in range(3000)], name="big")
    out = tmp_path / "big.jsonl"
    proc = run_cli("export", "--db", str(db_path), "big", "--format", "sharegpt", "--out", str(out),
                   "--page-size", "500", check=True)
    assert "wrote 3,000 of 3,000 ok records" in proc.stdout
    assert "export big (sharegpt) 3,000/3,000 100.0%" in proc.stderr  # the non-tty progress line
    assert len(out.read_bytes().splitlines()) == 3000 and read_manifest(out)["counts"]["exported"] == 3000

    # Ctrl-C half-way: exit 130, no file under the final name, no partial left behind
    out2 = tmp_path / "cut.jsonl"
    partial = tmp_path / "cut.jsonl.partial"
    child = subprocess.Popen(
        [sys.executable, "-m", "synthwatch", "export", "--db", str(db_path), "big", "-f", "raw", "-o", str(out2),
         "--page-size", "2", "--quiet"], cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # a test runner started with SIGINT ignored (nohup, `cmd &`) would pass that on: Ctrl-C is the default here
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while not (partial.exists() and partial.stat().st_size > 0):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the export never started writing"
        time.sleep(0.005)
    child.send_signal(signal.SIGINT)
    child.communicate(timeout=30)
    assert child.returncode == 130
    assert not out2.exists() and not partial.exists() and not manifest_path(out2).exists()
    os.sync()


def test_canary_records_are_never_exported(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id = make_run(engine, [{}, {"idx": -1, "source_id": "synthwatch-canary:0"}, {}])
    out = tmp_path / "c.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="raw", out=out))
    assert manifest["counts"]["excluded"] == {"canary": 1} and manifest["counts"]["exported"] == 2
    assert all(orjson.loads(line)["idx"] >= 0 for line in out.read_bytes().splitlines())


def test_export_jobs_run_in_a_thread_without_the_dashboard(engine: Any, tmp_path: Path) -> None:
    """The export-job lifecycle (row, thread, file) is export/jobs.py: it runs with two engines and a folder,
    no web app; a file is served only for a finished job of that run."""
    from synthwatch.export.jobs import ExportJobs, JobNotDone, JobNotFound
    from synthwatch.store.db import make_engine

    run_id = make_run(engine, VARIED)
    read = make_engine(str(engine.url), readonly=True)
    jobs = ExportJobs(read, engine, tmp_path / "exports")
    job_id = jobs.start(run_id, ExportOptions(format="raw", out=jobs.out_path("exp", "raw", parquet=False)))
    deadline = time.monotonic() + 30
    while (job := jobs.job(run_id, job_id)) and job["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job is not None and job["status"] == "done", job
    assert job["manifest"]["counts"]["exported"] == len(read_jsonl(jobs.finished_file(run_id, job_id)))
    assert jobs.finished_file(run_id, job_id, manifest=True).name.endswith(".manifest.json")
    with pytest.raises(JobNotFound):
        jobs.finished_file(run_id + 1, job_id)
    with engine.begin() as conn:
        conn.execute(text("UPDATE export_job SET status = 'running' WHERE id = :j"), {"j": job_id})
    assert jobs.job(run_id, job_id)["status"] == "failed"  # running, but no thread of this process: interrupted
    with pytest.raises(JobNotDone):
        jobs.finished_file(run_id, job_id)
