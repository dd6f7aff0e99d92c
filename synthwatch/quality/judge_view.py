"""What the pages and the API show of a run's judge model (#30): its verdicts, cost, and agreement with people.

The judge itself is synthwatch.workers.judge. Shared by the checks page (``_judge_panel.html``), the record viewer (the judge's verdict beside the person's) and
``GET /api/runs/{id}/judge``. A verdict in force is the latest check_verdict row of check ``judge`` for a record.
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection

CHECK = "judge"  # the judge's verdicts are check_verdict rows of this check (synthwatch.workers.judge)

_LATEST = ("SELECT v.record_id, v.state, v.score, v.label, v.reason FROM check_verdict v JOIN (SELECT record_id,"
           " MAX(id) AS id FROM check_verdict WHERE run_id = :r AND check_name = :c GROUP BY record_id) m"
           " ON m.id = v.id")


def _judge_cfg(run: dict[str, Any]) -> dict[str, Any] | None:
    cfg = run.get("config")
    if cfg is None:
        try:
            cfg = orjson.loads(run.get("config_json") or "{}")
        except orjson.JSONDecodeError:
            cfg = {}
    j = cfg.get("judge") if isinstance(cfg, dict) else None
    return j if isinstance(j, dict) else None


def record_verdict(conn: Connection, record_id: int) -> dict[str, Any] | None:
    """The judge's verdict in force on one record (None: not judged), with the flag's words."""
    row = conn.execute(text(
        "SELECT state, score, label, reason, created_at FROM check_verdict WHERE record_id = :i AND check_name = :c"
        " ORDER BY id DESC LIMIT 1"), {"i": record_id, "c": CHECK}).mappings().first()
    if row is None:
        return None
    v = dict(row)
    word = v["label"] or {"pass": "good", "fail": "bad"}.get(v["state"], v["state"])
    v["flag"] = f"judge: {word}" + (f" — {v['reason']}" if v["reason"] else "")
    return v


def agreement(conn: Connection, run_id: int) -> dict[str, Any]:
    """How often people (record.review, their latest flag) and the judge (pass = good, fail = bad) agree, over the
    records both judged."""
    rows = conn.execute(text(
        f"SELECT r.review, lv.state, COUNT(*) FROM record r JOIN ({_LATEST}) lv ON lv.record_id = r.id"
        " WHERE r.run_id = :r AND r.review IN ('good', 'bad') AND lv.state IN ('pass', 'fail')"
        " GROUP BY r.review, lv.state"), {"r": run_id, "c": CHECK}).all()
    cells = {(str(p), str(j)): int(n) for p, j, n in rows}
    both = sum(cells.values())
    agree = cells.get(("good", "pass"), 0) + cells.get(("bad", "fail"), 0)
    return {"both": both, "agree": agree, "rate": agree / both if both else None,
            "person_good_judge_bad": cells.get(("good", "fail"), 0),
            "person_bad_judge_good": cells.get(("bad", "pass"), 0),
            "both_good": cells.get(("good", "pass"), 0), "both_bad": cells.get(("bad", "fail"), 0)}


def summary(conn: Connection, run: dict[str, Any]) -> dict[str, Any] | None:
    """The judge of a run (None when it has none and never had verdicts): settings, verdicts, cost, agreement."""
    cfg = _judge_cfg(run)
    usage = conn.execute(text("SELECT * FROM judge_usage WHERE run_id = :r"), {"r": run["id"]}).mappings().first()
    if cfg is None and usage is None:
        return None
    u = dict(usage) if usage is not None else {}
    jc: dict[str, Any] = cfg or {}
    ep = jc["endpoint"] if isinstance(jc.get("endpoint"), dict) else {}
    p_in, p_out = ep.get("price_in_per_mtok"), ep.get("price_out_per_mtok")
    pt, ct = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    cost = (pt * (p_in or 0) + ct * (p_out or 0)) / 1e6 if (p_in is not None or p_out is not None) else None
    n_pass, n_fail = int(u.get("n_pass") or 0), int(u.get("n_fail") or 0)
    ok = int(conn.execute(text("SELECT COUNT(*) FROM record WHERE run_id = :r AND status = 'ok' AND idx >= 0"),
                          {"r": run["id"]}).scalar() or 0)
    return {
        "model": jc.get("model"), "sample_fraction": jc.get("sample_fraction", 1.0),
        "concurrency": jc.get("concurrency"), "guided": u.get("guided"),
        "n_pass": n_pass, "n_fail": n_fail, "n_error": int(u.get("n_error") or 0),
        "bad_rate": n_fail / (n_pass + n_fail) if n_pass + n_fail else None, "ok_records": ok,
        "requests": int(u.get("requests") or 0), "failed_attempts": int(u.get("failed_attempts") or 0),
        "prompt_tokens": pt, "completion_tokens": ct, "cost": cost,
        "agreement": agreement(conn, int(run["id"])),
    }
