"""One count of a run's open problems, read by every place that shows it (#37): the quality tiles, the open-items
card, the runs list. Two readers that counted on their own once said "no open problem" in a tile above "1 open
problem: 3 records failed Reasoning in another field".

The counts come from the open items (quality/detection/open_items.py); the detection owner may move them, and this module is
the one place to re-point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..quality.detection import open_items
from ..quality.detection.alarms import MISMATCH_SYMPTOMS
from .words import check_label


@dataclass(frozen=True)
class OpenProblems:
    items: int = 0  # open items
    records: int = 0  # records still failing in them
    by_check: dict[str, int] = field(default_factory=dict)  # check -> records still failing in its open items

    def on_check(self, check: str) -> tuple[str, int] | None:
        """The open problem a check's tile belongs to: (check of the item, records) for the check's own item or, for
        a symptom of reasoning in another field (empty reasoning...), the field-mismatch item; None when neither."""
        if check in self.by_check:
            return check, self.by_check[check]
        if check in MISMATCH_SYMPTOMS and "field_mismatch" in self.by_check:
            return "field_mismatch", self.by_check["field_mismatch"]
        return None


def open_problems(conn: Connection, run_id: int) -> OpenProblems:
    by_check: dict[str, int] = {}
    items = 0
    for check, n, recs in conn.execute(text(
            "SELECT check_name, COUNT(*), SUM(n_records) FROM open_item WHERE run_id = :r AND state = 'open'"
            " GROUP BY check_name"), {"r": run_id}):
        by_check[str(check)] = int(recs or 0)
        items += int(n)
    return OpenProblems(items, sum(by_check.values()), by_check)


def open_problems_by_run(conn: Connection) -> dict[int, OpenProblems]:
    """Every run's open problems at once (the runs list)."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for run_id, check, n, recs in conn.execute(text(
            "SELECT run_id, check_name, COUNT(*), SUM(n_records) FROM open_item WHERE state = 'open'"
            " GROUP BY run_id, check_name")):
        out.setdefault(int(run_id), {})[str(check)] = (int(n), int(recs or 0))
    return {rid: OpenProblems(sum(n for n, _ in d.values()), sum(r for _, r in d.values()),
                              {c: r for c, (_, r) in d.items()}) for rid, d in out.items()}


def in_words(item: dict[str, Any]) -> str:
    """An open item's sentence as the pages show it: the check's label, not its id (#37: "3 records failed
    field_mismatch")."""
    if not int(item.get("n_records") or 0) and not int(item.get("n_peak") or 0) and not item.get("first_t"):
        return str(item.get("text") or open_items.describe(item))
    return open_items.describe({**item, "check_name": check_label(str(item["check_name"]))})
