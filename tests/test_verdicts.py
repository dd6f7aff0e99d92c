"""The verdict store of the extended checks (#30): history appended, the latest row wins, pending counted."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from synthwatch.config import RunConfig
from synthwatch.quality import verdicts as vd
from synthwatch.store import queue as store


@dataclass
class P:
    index: int
    line: int
    source_id: str
    messages: list


def _run(engine, n: int, checks: dict | None = None) -> tuple[int, list[int]]:  # type: ignore[no-untyped-def]
    cfg = RunConfig.model_validate({"dataset": {"path": "x.jsonl"}, "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}],
                                    "model": "m", "checks": checks or {}})
    with engine.connect() as conn, store.write_begin(conn):
        rid = store.create_run(conn, "r", cfg)
        store.insert_prompts(conn, rid, [P(i, i + 1, f"s{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(n)])
        conn.execute(text("UPDATE record SET status = 'ok' WHERE run_id = :r"), {"r": rid})
        ids = [r[0] for r in conn.execute(text("SELECT id FROM record WHERE run_id = :r ORDER BY id"), {"r": rid})]
    return rid, ids


CHECKS = {"verifiers": [{"kind": "exact", "reference": "answer"}],
          "rule": [{"name": "has_boxed", "regex": "boxed"}]}


def test_latest_row_wins_and_pending_is_counted(any_engine) -> None:  # type: ignore[no-untyped-def]
    rid, ids = _run(any_engine, 4, CHECKS)
    a, b, c, d = ids
    with any_engine.begin() as conn:
        assert vd.pending_count(conn, rid) == 4  # no verdict yet: every record waits
        vd.append(conn, [vd.NewVerdict(rid, a, "verify_exact", vd.Verdict("fail", 0.0, None, "x" * 900), 1.5),
                         vd.NewVerdict(rid, a, "rule:has_boxed", vd.PASS)])
        vd.append(conn, [vd.NewVerdict(rid, a, "verify_exact", vd.Verdict("pass", 1.0))])  # re-checked later
        vd.append(conn, [vd.NewVerdict(rid, b, "verify_exact", vd.Verdict("error", reason="boom")),
                         vd.NewVerdict(rid, b, "rule:has_boxed", vd.Verdict("fail"))])
        vd.append(conn, [vd.NewVerdict(rid, c, "verify_exact", vd.PASS)])  # one check still missing
        vd.mark_pending(conn, rid, [d], ["verify_exact", "rule:has_boxed"])
    with any_engine.connect() as conn:
        got = vd.latest(conn, rid)
        assert got[a]["verify_exact"].state == "pass" and got[a]["rule:has_boxed"].state == "pass"
        assert got[b]["verify_exact"].verdict == vd.Verdict("error", reason="boom")
        assert got[d]["verify_exact"].state == "pending"
        assert set(vd.latest(conn, rid, "rule:has_boxed")) == {a, b, d}
        assert vd.pending_ids(conn, rid) == [c, d]
        assert vd.pending_count(conn, rid) == 2
        assert vd.pending_count(conn, rid, ["verify_exact"]) == 1
        rows = vd.record_verdicts(conn, a)
        assert [r.check_name for r in rows] == ["rule:has_boxed", "verify_exact"]
        hist = conn.execute(text("SELECT reason, cost_ms FROM check_verdict WHERE record_id = :i ORDER BY id"),
                            {"i": a}).all()
        assert len(hist) == 3 and len(hist[0][0]) == vd.REASON_MAX and hist[0][1] == 1.5  # history kept, bounded
        assert vd.state_counts(conn, rid)["verify_exact"] == {"pass": 2, "error": 1, "pending": 1}


def test_no_extended_checks_means_nothing_pending(engine) -> None:  # type: ignore[no-untyped-def]
    rid, _ = _run(engine, 3)
    with engine.connect() as conn:
        assert vd.pending_count(conn, rid) == 0
        assert vd.configured_checks(conn.execute(text("SELECT config_json FROM run")).scalar()) == []


def test_bad_state_is_refused() -> None:
    with pytest.raises(ValueError, match="state"):
        vd.Verdict("maybe")


@given(st.text(max_size=3000), st.one_of(st.none(), st.text(max_size=300)))
def test_reasons_and_labels_are_bounded(reason: str, label: str | None) -> None:
    out = vd.bound(reason)
    assert out is not None and len(out) <= vd.REASON_MAX
    assert out == reason or (len(reason) > vd.REASON_MAX and out.endswith("…"))
    lab = vd.bound(label, vd.LABEL_MAX)
    assert lab is None or len(lab) <= vd.LABEL_MAX


def test_row_fields_never_raise() -> None:
    assert vd.row_fields(None) == {} and vd.row_fields("[1]") == {} and vd.row_fields("{bad") == {}
    assert vd.row_fields(orjson.dumps({"answer": "4"}).decode()) == {"answer": "4"}


def test_a_reason_never_stores_a_registered_secret(engine) -> None:  # type: ignore[no-untyped-def]
    from synthwatch.redact import add_secret, forget_secret

    rid, ids = _run(engine, 1, CHECKS)
    secret = "sk-test-verdict-secret-1234567890"
    add_secret(secret)
    try:
        with engine.begin() as conn:
            vd.append(conn, [vd.NewVerdict(rid, ids[0], "verify_exact", vd.Verdict("error", reason=f"boom {secret}"))])
        with engine.connect() as conn:
            reason = vd.record_verdicts(conn, ids[0])[0].verdict.reason
    finally:
        forget_secret(secret)
    assert reason is not None and secret not in reason and reason.startswith("boom ")
