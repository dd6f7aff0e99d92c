"""Exports of conversations regenerated turn by turn: only turns the model wrote are ever trained, as the
last turn of each conversation (default) or one row per turn, in every format and both trainer presets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from test_turns import DATASET_ANSWER, write_conversations
from workerkit import make_config, records, run_to_end

from synthwatch.capture import turns as turns_mod
from synthwatch.export.plan import ExportError, ExportOptions
from synthwatch.export.stream import export_run


def _rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture
def turns_run(engine, tmp_path, sim) -> tuple[int, list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
    url = sim(seed=7, reasoning_tokens="8-16", content_tokens="4-8")
    data = write_conversations(tmp_path / "conv.jsonl", 9)
    run_id, final = run_to_end(engine, make_config(url, data, turns="all", request_token_ids=True))
    assert final == "completed"
    return run_id, records(engine, run_id)


def _row_id(rec: dict[str, Any], k: int, which: str) -> str:
    """A conversation of several turns exported turn by turn: one id per turn; else the record's id."""
    return f"c{rec['idx']}" + (f"#t{k + 1}" if which == "all" and rec["n_turns"] > 1 else "")


def _answers(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


@pytest.mark.parametrize("which", ["last", "all"])
def test_messages_rows_hold_the_models_own_turns(engine, tmp_path, turns_run, which) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = turns_run
    out = tmp_path / "m.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="messages", out=out, turns=which))
    rows = {r["id"]: r for r in _rows(out)}
    n_rows = sum(r["n_turns"] for r in recs) if which == "all" else len(recs)
    assert manifest["counts"]["exported"] == len(rows) == n_rows
    assert manifest["turns"]["export"] == which and manifest["turns"]["history_reasoning"] == "strip"
    for r in recs:
        turns = turns_mod.all_turns(r)
        ks = range(len(turns)) if which == "all" else [len(turns) - 1]
        for k in ks:
            rid = _row_id(r, k, which)
            msgs = rows[rid]["messages"]
            assert _answers(msgs) == [t["content"] for t in turns[: k + 1]]  # the model's, never the dataset's
            assert msgs[-1]["reasoning_content"] == turns[k]["reasoning"]
            assert all("reasoning_content" not in m for m in msgs[:-1])  # stripped, as the requests were


@pytest.mark.parametrize("which", ["last", "all"])
def test_tokens_rows_train_only_a_turn_the_model_wrote(engine, tmp_path, turns_run, which) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = turns_run
    out = tmp_path / "t.jsonl"
    export_run(engine, run_id, ExportOptions(format="tokens", out=out, turns=which))
    rows = {r["id"]: r for r in _rows(out)}
    for r in recs:
        turns = turns_mod.all_turns(r)
        ks = range(len(turns)) if which == "all" else [len(turns) - 1]
        for k in ks:
            row = rows[_row_id(r, k, which)]
            ids = orjson.loads(turns[k]["token_ids_json"])
            # the prompt the server saw for this turn (the model's history), the answer it wrote, loss on it alone
            assert row["input_ids"] == ids["prompt"] + ids["completion"]
            assert row["loss_mask"] == [0] * len(ids["prompt"]) + [1] * len(ids["completion"])
    assert len(rows) == (sum(r["n_turns"] for r in recs) if which == "all" else len(recs))


def test_presets_write_the_models_turns_and_say_how_to_train(engine, tmp_path, turns_run) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = turns_run
    out = tmp_path / "sf.jsonl"
    manifest = export_run(engine, run_id, ExportOptions(format="specforge", out=out, turns="all"))
    assert manifest["preset"]["settings"]["data.train_only_last_turn"] is True
    rows = _rows(out)
    assert len(rows) == sum(r["n_turns"] for r in recs)
    for row in rows:
        assert row["status"] == "success"
        answers = [t["content"] for t in row["conversations"] if t["role"] == "assistant"]
        assert answers and not any(DATASET_ANSWER in a for a in answers)
    out = tmp_path / "sp.jsonl"
    export_run(engine, run_id, ExportOptions(format="speculators", out=out, turns="all"))
    rows = _rows(out)
    assert len(rows) == sum(r["n_turns"] for r in recs)
    by_id = {r["primary_id"]: r for r in rows}
    for r in recs:
        last = orjson.loads(r["token_ids_json"])
        row = by_id[_row_id(r, r["n_turns"] - 1, "all")]
        assert sum(row["loss_mask"]) == len(last["completion"])


def test_raw_keeps_every_turn_and_a_bad_turns_value_is_refused(engine, tmp_path, turns_run) -> None:  # type: ignore[no-untyped-def]
    run_id, recs = turns_run
    out = tmp_path / "raw.jsonl"
    export_run(engine, run_id, ExportOptions(format="raw", out=out, turns="all"))
    rows = _rows(out)
    assert len(rows) == len(recs)
    assert [len(turns_mod.load(r["turns_json"])) for r in rows] == [r["n_turns"] - 1 for r in recs]
    with pytest.raises(ExportError, match="turns must be one of"):
        export_run(engine, run_id, ExportOptions(format="messages", out=tmp_path / "x.jsonl", turns="some"))
