"""One count of a run's open problems, read by every place that shows it (#37): the quality tiles, the open-items
card, the runs list. Two readers that counted on their own once said "no open problem" in a tile above "1 open
problem: 3 records failed Reasoning in another field".

The totals are synthwatch.quality.detection.problem_counts' (the runs list, the strip, the banner, the tab title
and the API read it); this module only adds the per-check split the tiles need, from the same open items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..quality.detection import open_items, problem_counts
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
    return open_problems_by_run(conn, [run_id]).get(run_id, OpenProblems())


def open_problems_by_run(conn: Connection, run_ids: list[int] | None = None) -> dict[int, OpenProblems]:
    """run id -> its open problems: the totals are problem_counts' (the one count), the split by check is theirs."""
    totals = problem_counts(conn, run_ids)
    if not any(p.items for p in totals.values()):
        return {}
    only = f" AND run_id IN ({','.join(str(int(r)) for r in totals)})"
    by_run: dict[int, dict[str, int]] = {}
    for run_id, check, recs in conn.execute(text(
            f"SELECT run_id, check_name, SUM(n_records) FROM open_item WHERE state = 'open'{only}"
            " GROUP BY run_id, check_name")):
        if int(run_id) in totals:
            by_run.setdefault(int(run_id), {})[str(check)] = int(recs or 0)
    return {rid: OpenProblems(p.items, p.failing, by_run.get(rid, {})) for rid, p in totals.items() if p.items}


def in_words(item: dict[str, Any]) -> str:
    """An open item's sentence as the pages show it: the check's label, not its id (#37: "3 records failed
    field_mismatch")."""
    if not int(item.get("n_records") or 0) and not int(item.get("n_peak") or 0) and not item.get("first_t"):
        return str(item.get("text") or open_items.describe(item))
    return open_items.describe({**item, "check_name": check_label(str(item["check_name"]))})
