"""The export reads a snapshot (#35): the ok records finished when it started, none finished while it runs.

A real worker keeps generating (the simulator, slowly) while an export of its run is prepared and written: records
that finish after the cut, even while the export is half-written, are not in the file, and the manifest says where
the cut was. Real SQLite file, real worker threads, the export's own code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from test_checks_kit import CheckedBackground
from workerkit import make_config, run_row, wait_for

from synthwatch.export.plan import ExportOptions
from synthwatch.export.stream import prepare_export, run_export
from synthwatch.store import queue as store

pytestmark = pytest.mark.slow  # a run generating while the export runs


def _finished(engine: Any, run_id: int) -> dict[int, float]:
    with engine.connect() as conn:
        return {int(r[0]): float(r[1]) for r in conn.execute(text(
            "SELECT id, finished_at FROM record WHERE run_id = :r AND status = 'ok'"), {"r": run_id})}


def test_records_finished_after_the_export_started_are_not_in_it(any_engine: Any, sim: Any, prompts: Any,
                                                                  tmp_path: Path) -> None:
    engine = any_engine  # SQLite and PostgreSQL
    url = sim(seed=31, tokens_per_s=80, reasoning_tokens="8-16", content_tokens="4-8")
    config = make_config(url, prompts(400), concurrency=4, name="growing")
    bg = CheckedBackground(engine, config).start()
    try:
        wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= 12, timeout_s=60, what="the first records")
        out = tmp_path / "snap.jsonl"
        plan = prepare_export(engine, bg.run_id, ExportOptions(format="raw", out=out, page_size=4,
                                                               default_exclusions=False))
        cut = plan.snapshot_at
        assert cut is not None and plan.snapshot_ids is not None
        snapshot = set(plan.snapshot_ids)  # the ok records one read saw when the export was prepared
        assert plan.total == len(snapshot) >= 12
        pages = [0]

        def progress(scanned: int, total: int) -> None:
            # the export is under way (a page written): more records finish, and some fail checks, meanwhile
            pages[0] += 1
            if pages[0] == 2:
                n = run_row(engine, bg.run_id)["n_ok"]
                wait_for(lambda: run_row(engine, bg.run_id)["n_ok"] >= n + 8, timeout_s=60,
                         what="records finishing while the export runs")

        manifest = run_export(engine, plan, progress)
    finally:
        store.apply_control(engine, bg.run_id, "stop_now")
        bg.join(30)
    exported = {int(json.loads(line)["id"]) for line in out.read_text().splitlines()}
    finished = _finished(engine, bg.run_id)
    later = set(finished) - snapshot
    assert len(later) >= 8  # records did finish while the export ran
    # the snapshot's records that finished by the cut (one finishing between the cut and the read is not in it)
    at_cut = {i for i in snapshot if finished[i] <= cut}
    assert exported == at_cut and not exported & later and all(finished[i] <= cut for i in exported)
    assert manifest["counts"]["ok_scanned"] == len(at_cut) and manifest["counts"]["exported"] == len(at_cut)
    snap = manifest["snapshot"]
    assert snap["finished_before_epoch_s"] == cut and snap["ok_records"] == len(snapshot)
    assert snap["finished_before"].endswith("Z") and "finished" in snap["note"]


def test_the_cli_manifest_states_the_cut(engine: Any, sim: Any, prompts: Any, tmp_path: Path, db_path: Path) -> None:
    from conftest import run_cli

    url = sim(seed=32, reasoning_tokens="3-5", content_tokens="3-5")
    config = make_config(url, prompts(10), concurrency=4, name="done")
    bg = CheckedBackground(engine, config).start()
    assert bg.join(60) == "completed"
    out = tmp_path / "done.jsonl"
    res = run_cli("export", "done", "--format", "messages", "--out", str(out), "--db", str(db_path), "--quiet",
                  check=True)
    manifest = json.loads(Path(str(out) + ".manifest.json").read_text())
    last = max(_finished(engine, bg.run_id).values())
    assert manifest["snapshot"]["ok_records"] == 10 and manifest["snapshot"]["finished_before_epoch_s"] >= last
    assert "wrote 10 of 10" in res.stdout
