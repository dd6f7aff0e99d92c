"""Repairs of conversations regenerated turn by turn: a re-derive reads every stored turn again, a re-run starts
the conversation over (its turns go to its history), an undo brings them back. Real worker, real simulator."""

from __future__ import annotations

from typing import Any

import httpx
from conftest import HTTP_TIMEOUT_S
from test_checks_kit import CheckedBackground, stats
from test_turns import write_conversations
from workerkit import Background, make_config, records, run_row

from synthwatch.capture import turns as turns_mod
from synthwatch.quality.live import writer_hooks
from synthwatch.repair import actions as repair
from synthwatch.repair import history as repair_history
from synthwatch.store import versions


def _run(engine: Any, config: Any) -> int:
    bg = CheckedBackground(engine, config).start()
    assert bg.join(60) == "completed"
    return bg.run_id


def test_rederive_reads_every_turn_again(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(reasoning_field="reasoning", seed=31, reasoning_tokens="8-16", content_tokens="4-8")
    config = make_config(url, write_conversations(tmp_path / "c.jsonl", 9), turns="all",
                         reasoning={"mode": "reasoning_content"},
                         checks={"rules": {"field_mismatch": {"auto_pause": False}}})
    run_id = _run(engine, config)
    before = records(engine, run_id)
    for r in before:  # read in the wrong field: every turn's reasoning is unread
        assert all(t["reasoning"] == "" for t in turns_mod.all_turns(r))
    assert stats(engine, run_id)["field_mismatch"]["n_fail"] == 9
    versions.change_settings(engine, run_id, {"reasoning": {"mode": "auto"}}, actor="t")
    with engine.connect() as conn:
        sel = repair.select(conn, run_id, check="field_mismatch")
    done = repair.rederive_records(engine, run_id, sel, actor="t")
    assert done["changed"] == 9 and done["cannot"] == 0
    for r in records(engine, run_id):
        turns = turns_mod.all_turns(r)
        assert len(turns) == r["n_turns"]
        assert all(t["reasoning"] and t["reasoning_source"] == "reasoning" for t in turns)
        assert r["check_flags"] == 0 and r["check_json"] is None  # no turn fails field_mismatch any more
    assert stats(engine, run_id)["field_mismatch"]["n_fail"] == 0
    # undo brings every turn back as it was
    repair_history.undo(engine, run_id, done["repair_id"], actor="t")
    assert [r["turns_json"] for r in records(engine, run_id)] == [r["turns_json"] for r in before]


def test_rerun_starts_a_conversation_over_and_keeps_its_turns(engine, tmp_path, sim) -> None:  # type: ignore[no-untyped-def]
    url = sim(seed=32, keep_requests=10_000, reasoning_tokens="8-16", content_tokens="4-8")
    config = make_config(url, write_conversations(tmp_path / "c.jsonl", 6), turns="all")
    run_id = _run(engine, config)
    recs = {r["id"]: r for r in records(engine, run_id)}
    total = sum(r["n_turns"] for r in recs.values())
    three = [i for i, r in recs.items() if r["n_turns"] == 3]
    with engine.connect() as conn:
        sel = repair.select(conn, run_id, ids=three)
    assert repair.rerun_records(engine, run_id, sel, actor="t")["queued"] == 2
    run = run_row(engine, run_id)
    assert run["n_turns_done"] == total - 6 and run["n_pending"] == 2
    for i in three:
        r = records(engine, run_id, f"id = {i}")[0]
        assert r["status"] == "pending" and r["turns_json"] is None and r["turns_done"] == 0
        with engine.connect() as conn:
            [h] = repair_history.history(conn, i)
        assert h["turns_json"] == recs[i]["turns_json"] and h["turns_done"] == 3
    bg = Background(engine, config, run_id, hooks=lambda r: writer_hooks(engine, r, None)).start()
    assert bg.join(60) == "completed"
    run = run_row(engine, run_id)
    assert run["n_turns_done"] == run["n_turns"] == total
    sent = httpx.get(url.removesuffix("/v1") + "/sim/requests", timeout=HTTP_TIMEOUT_S).json()
    assert len(sent) == total + 6  # the two conversations' three turns, once more each
    for i in three:
        r = records(engine, run_id, f"id = {i}")[0]
        assert r["status"] == "ok" and r["turns_done"] == 3 and len(turns_mod.load(r["turns_json"])) == 2
